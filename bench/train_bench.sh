#!/usr/bin/env bash
# Times 1 epoch (train + validate) of `mixtrain train` (default CNN, Fashion-MNIST,
# bs 256, lr 3e-3, seed 42) against
#   (a) a plain PyTorch-Python loop (bench/python_loop.py, the build's Python, default threads)
#   (b) a raw libtorch C++ loop (bench/raw_loop.cpp, same thread settings as mixtrain)
#   (c) the loop of (a) with its model channels-last (python_loop.py --channels-last), as
#       mixtrain's built-in CNN runs its activations
# Rounds are interleaved (this machine is noisy); medians and ratios are printed.
# Usage: bench/train_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
# The Python whose torch the build uses (the peers run the same torch).
py=${MIXTRAIN_PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
build=${1:-build}
rounds=${2:-5}
cli=$build/tools/mixtrain/mixtrain
raw=$build/bench/raw_loop
if ! "$py" -c 'import torch' 2>/dev/null; then
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd=sudo
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-torch >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
  "$cli" train --epochs 1 --out "$tmp/run$r" >/dev/null
  "$py" -c "import json;d=json.load(open('$tmp/run$r/summary.json'));print(json.dumps({'seconds':d['seconds'],'valid_accuracy':d['valid_accuracy']}))" >>"$tmp/mixtrain.jsonl"
  "$raw" >>"$tmp/raw.jsonl"
  "$py" bench/python_loop.py >>"$tmp/python.jsonl"
  "$py" bench/python_loop.py --channels-last >>"$tmp/python_cl.jsonl"
done
"$py" - "$tmp" <<'PY'
import json, statistics, sys
d = sys.argv[1]
rows = {k: [json.loads(l) for l in open(f"{d}/{k}.jsonl")] for k in ("mixtrain", "raw", "python", "python_cl")}
med = {k: statistics.median(r["seconds"] for r in v) for k, v in rows.items()}
acc = {k: statistics.median(r["valid_accuracy"] for r in v) for k, v in rows.items()}
for k in ("mixtrain", "raw", "python", "python_cl"):
    runs = ", ".join("%.2f" % r["seconds"] for r in rows[k])
    print(f"{k:9s} median epoch {med[k]:.3f} s  (runs: {runs})  valid_accuracy {acc[k]:.4f}")
print(f"mixtrain / python loop (a): {med['mixtrain'] / med['python']:.3f}   (goal <= 0.80)")
print(f"mixtrain / raw libtorch (b): {med['mixtrain'] / med['raw']:.3f}   (goal <= 1.03)")
print(f"mixtrain / python loop, channels-last (c): {med['mixtrain'] / med['python_cl']:.3f}")
PY
