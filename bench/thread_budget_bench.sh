#!/usr/bin/env bash
# The default thread count where a process may use fewer CPUs than the machine has online
# (BENCHMARKS.md, "The thread count a process may use"): `--threads 0` (what cpu_budget
# picks) against `--threads N_ONLINE` (the old default, every CPU online), interleaved,
# REPS rounds each, medians.
#   1. pinned to one CPU (taskset -c 0): a CNN epoch's wall seconds;
#   2. two local ranks of `mixtrain launch`: samples/s from summary.json.
# A cgroup CPU quota needs root to set up; BENCHMARKS.md gives those commands.
#   bench/thread_budget_bench.sh [BUILD_DIR] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
reps=${2:-3}
cli="$build/tools/mixtrain/mixtrain"
online=$(getconf _NPROCESSORS_ONLN)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
port=$((33000 + $$ % 1000))

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
seconds() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null 2>&1; t1=$(date +%s.%N); awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f\n", b - a}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
sps() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['samples_per_second'])" "$1/summary.json"; }

if [ "$online" -lt 2 ]; then
  echo "thread_budget_bench: this machine has 1 CPU online; nothing to compare" >&2
  exit 0
fi

pin_now=() pin_old=() dp_now=() dp_old=()
for r in $(seq "$reps"); do
  pin_now+=("$(seconds taskset -c 0 "$cli" train --epochs 1 --out "$tmp/pin-now-$r")")
  pin_old+=("$(seconds taskset -c 0 "$cli" train --epochs 1 --threads "$online" --out "$tmp/pin-old-$r")")
  for arm in now old; do
    threads=0
    [ "$arm" = old ] && threads=$online
    port=$((port + 1))
    "$cli" launch --nproc 2 --master-port "$port" -- train --model cnn --limit 16384 --epochs 1 --seed 1 --bs 128 \
      --threads "$threads" --out "$tmp/dp-$arm-$r" > /dev/null 2>&1
    if [ "$arm" = now ]; then dp_now+=("$(sps "$tmp/dp-$arm-$r")"); else dp_old+=("$(sps "$tmp/dp-$arm-$r")"); fi
  done
done

pn=$(median "${pin_now[@]}") po=$(median "${pin_old[@]}") dn=$(median "${dp_now[@]}") do_=$(median "${dp_old[@]}")
echo "pinned to 1 of $online CPUs, CNN epoch (s): --threads 0 $pn, --threads $online $po, old / now $(ratio "$po" "$pn")"
echo "mixtrain launch --nproc 2 (samples/s): --threads 0 $dn, --threads $online $do_, now / old $(ratio "$dn" "$do_")"
