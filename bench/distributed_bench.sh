#!/usr/bin/env bash
# Data-parallel scaling on this machine: steps/s of 1 rank vs 2 ranks (mixtrain launch,
# Gloo over loopback) at the same global batch, and the gradient all-reduce's share of
# a step. Every configuration runs REPS times, interleaved; medians are reported.
#   bench/distributed_bench.sh [BUILD_DIR] [REPS]
set -euo pipefail
# The Python whose torch the build uses (the peers run the same torch).
py=${MIXTRAIN_PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.venv/bin/python}
cd "$(dirname "$0")/.."
build=${1:-build}
reps=${2:-3}
cli="$build/tools/mixtrain/mixtrain"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common="--model cnn --limit 16384 --epochs 1 --seed 1"
port=$((32000 + $$ % 1000))

field() { "$py" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

one2=() one1=() two=() comm=() step2=()
for r in $(seq "$reps"); do
  # 1 rank using both cores (2 intra-op threads), global batch 256.
  "$cli" train $common --bs 256 --threads 2 --out "$tmp/one2-$r" > /dev/null
  one2+=("$(field "$tmp/one2-$r/summary.json" steps) $(field "$tmp/one2-$r/summary.json" samples_per_second)")
  # 1 rank, 1 thread: the per-core baseline.
  "$cli" train $common --bs 256 --threads 1 --out "$tmp/one1-$r" > /dev/null
  one1+=("$(field "$tmp/one1-$r/summary.json" samples_per_second)")
  # 2 ranks x 1 thread, 128 per rank: the same global batch of 256.
  port=$((port + 1))
  "$cli" launch --nproc 2 --master-port "$port" -- train $common --bs 128 --threads 1 --out "$tmp/two-$r" > "$tmp/two-$r.log"
  sps=$(field "$tmp/two-$r/summary.json" samples_per_second)  # rank 0's samples: half the global batch
  two+=("$("$py" -c "print(2 * $sps)")")
  ms=$(grep -o 'all-reduce [0-9.]* ms/step' "$tmp/two-$r.log" | head -1 | awk '{print $2}')
  comm+=("$ms")
  step2+=("$("$py" -c "print(1000 * 128 / $sps)")")  # ms per step on rank 0
done
s_one2=$(median "$(printf '%s\n' "${one2[@]}" | awk '{print $2}')")
s_one1=$(median "${one1[@]}")
s_two=$(median "${two[@]}")
m_comm=$(median "${comm[@]}")
m_step=$(median "${step2[@]}")
"$py" - "$s_one1" "$s_one2" "$s_two" "$m_comm" "$m_step" <<'PY'
import sys
one1, one2, two, comm, step = map(float, sys.argv[1:])
print(f"samples/s (global batch 256, CNN, 16384 images): 1 rank x 1 thread {one1:.0f}, "
      f"1 rank x 2 threads {one2:.0f}, 2 ranks x 1 thread {two:.0f}")
print(f"2 ranks vs 1 rank x 1 thread: {two/one1:.2f}x (scaling efficiency {two/one1/2:.0%})")
print(f"2 ranks vs 1 rank x 2 threads (same cores): {two/one2:.2f}x")
print(f"gradient all-reduce: {comm:.2f} ms of a {step:.1f} ms step ({comm/step:.1%})")
PY
