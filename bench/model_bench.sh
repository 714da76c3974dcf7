#!/usr/bin/env bash
# Bring-your-own-model speed (BENCHMARKS.md), rounds interleaved (this machine is noisy):
#   1. the default CNN as a TorchScript file vs the native C++ module, in a Learner (step time, bs 256);
#   2. the transformer's training step in mixtrain vs the same model and loop in PyTorch-Python
#      (bench/python_transformer.py), bs 64 x 64 tokens, 2 threads: Python with its default threads
#      (OpenMP and OpenBLAS both on every core) and with mixtrain's split (OpenBLAS 2, OpenMP 1).
# Usage: bench/model_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
# The Python whose torch the build uses (the peers run the same torch).
py=${MIXTRAIN_PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
build=${1:-build}
rounds=${2:-5}
bench=$build/bench/model_step_bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" bench/export_cnn.py "$tmp/cnn.pt"
threads=$(nproc)
for r in $(seq 1 "$rounds"); do
  "$bench" cnn 30 256 | awk '{print $NF}' >>"$tmp/native"
  "$bench" "$tmp/cnn.pt" 30 256 | awk '{print $NF}' >>"$tmp/scripted"
  "$bench" transformer 10 64 | awk '{print $NF}' >>"$tmp/mixtrain_lm"
  "$py" bench/python_transformer.py 10 64 "$threads" | awk '{print $NF}' >>"$tmp/python_default"
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=$threads "$py" bench/python_transformer.py 10 64 1 |
    awk '{print $NF}' >>"$tmp/python_split"
done
"$py" - "$tmp" <<'PY'
import statistics, sys
d = sys.argv[1]
m = {k: statistics.median(float(x) for x in open(f"{d}/{k}")) for k in
     ("native", "scripted", "mixtrain_lm", "python_default", "python_split")}
print(f"CNN step (bs 256): native {m['native']:.1f} ms, TorchScript {m['scripted']:.1f} ms; "
      f"scripted/native = {m['scripted'] / m['native']:.2f} (goal <= 1.10)")
print(f"transformer step (bs 64 x 64): mixtrain {m['mixtrain_lm']:.0f} ms; Python default threads "
      f"{m['python_default']:.0f} ms (ratio {m['mixtrain_lm'] / m['python_default']:.2f}); Python with mixtrain's "
      f"thread split {m['python_split']:.0f} ms (ratio {m['mixtrain_lm'] / m['python_split']:.2f}); goal <= 0.85")
PY
