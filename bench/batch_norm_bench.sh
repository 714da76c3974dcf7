#!/usr/bin/env bash
# models::BatchNorm2d's fast forward against torch's kernel (BENCHMARKS.md, "BatchNorm's
# statistics"): first one forward of each of the CNN's two BatchNorms (bench/batch_norm_forward.cpp),
# then the built-in CNN's step (bs 256, fp32, `step_ops ... --time-only`) with the fast
# path on and with MIXTRAIN_TORCH_BATCH_NORM=1, interleaved, ROUNDS rounds each, at 1 and 2
# threads; medians of the step and its forward, and their ratios (fast / torch's).
#   bench/batch_norm_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
py=${MIXTRAIN_PYTHON:-.venv/bin/python}
cmake --build "$build" --target step_ops batch_norm_forward >/dev/null
"$build/bench/batch_norm_forward"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for threads in 1 2; do
  for r in $(seq 1 "$rounds"); do
    "$build/bench/step_ops" cnn 256 fp32 core --steps 30 --threads "$threads" --time-only >>"$tmp/fast$threads"
    MIXTRAIN_TORCH_BATCH_NORM=1 "$build/bench/step_ops" cnn 256 fp32 core --steps 30 --threads "$threads" --time-only >>"$tmp/torch$threads"
  done
done
"$py" - "$tmp" <<'PY'
import json, statistics, sys
d = sys.argv[1]
for threads in (1, 2):
    rows = {k: [json.loads(l) for l in open(f"{d}/{k}{threads}")] for k in ("fast", "torch")}
    step = {k: statistics.median(r["step_ms"] for r in v) for k, v in rows.items()}
    fwd = {k: statistics.median(r["phases_ms"]["forward"] for r in v) for k, v in rows.items()}
    print(f"{threads} thread(s): step {step['fast']:.2f} / {step['torch']:.2f} ms = {step['fast'] / step['torch']:.3f}; "
          f"forward {fwd['fast']:.2f} / {fwd['torch']:.2f} ms = {fwd['fast'] / fwd['torch']:.3f} (fast path / torch's kernel)")
PY
