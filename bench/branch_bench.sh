#!/usr/bin/env bash
# What `mixtrain doctor --from` costs against the doctor from scratch, and whether its cost
# grows with the run. Two fp16 runs of the same model, 1 and 8 epochs (the mlp on LIMIT
# Fashion-MNIST samples, 16384 unless given, bs 64: 256 and 2048 steps at 16384, a checkpoint
# every 64), then:
#   - doctor --from each, at the checkpoint 3/4 of the way through, a window of 64 steps;
#   - the doctor from scratch on the 8-epoch run's flags.
# Every doctor runs without trials (the model is healthy: none would run), so the times
# are the pair of arms plus what each doctor adds. Prints seconds and the ratios.
#   bench/branch_bench.sh [BUILD_DIR] [THREADS] [LIMIT]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-1}
cli="$build/tools/mixtrain/mixtrain"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
limit=${3:-16384}
flags="--model mlp --limit $limit --bs 64 --precision fp16 --threads $threads"

seconds() {  # seconds the command took (its output goes to $tmp/log)
  local t0 t1
  t0=$(date +%s.%N)
  "$@" > "$tmp/log" 2>&1 || { [ $? -eq 1 ] || { cat "$tmp/log"; exit 1; }; }  # 1: a problem verdict
  t1=$(date +%s.%N)
  awk "BEGIN { print $t1 - $t0 }"
}

train1=$(seconds "$cli" train $flags --epochs 1 --save-every-steps 64 --out "$tmp/run1")
train8=$(seconds "$cli" train $flags --epochs 8 --save-every-steps 64 --out "$tmp/run8")
steps=$((limit / 64))  # one epoch
at1=$((steps * 3 / 4 / 64 * 64))
at8=$((8 * steps * 3 / 4 / 64 * 64))
from1=$(seconds "$cli" doctor --from "$tmp/run1" --at $at1 --window 64 --no-trials --out "$tmp/d1")
from8=$(seconds "$cli" doctor --from "$tmp/run8" --at $at8 --window 64 --no-trials --out "$tmp/d8")
scratch8=$(seconds "$cli" doctor $flags --epochs 8 --no-trials --out "$tmp/ds8")
matches=$(grep -o '"matches_run": [a-z]*' "$tmp/d8/diagnosis.json")
# The replay's own seconds (restoring, both arms, their validations), without the process's
# fixed costs (start, loading the data), which dominate runs this small.
arms1=$(sed -n 's/.*"seconds": \([0-9.e+-]*\).*/\1/p' "$tmp/d1/diagnosis.json" | tail -1)
arms8=$(sed -n 's/.*"seconds": \([0-9.e+-]*\).*/\1/p' "$tmp/d8/diagnosis.json" | tail -1)
# What starting the fp32 arm costs (build the Learner, load the checkpoint, go to fp32)
# beside that arm's window and validation (replay.restore_seconds / fp32_arm_seconds).
restore8=$(sed -n 's/.*"restore_seconds": \([0-9.e+-]*\).*/\1/p' "$tmp/d8/diagnosis.json" | tail -1)
arm8=$(sed -n 's/.*"fp32_arm_seconds": \([0-9.e+-]*\).*/\1/p' "$tmp/d8/diagnosis.json" | tail -1)
printf "train 1 epoch %.2f s, 8 epochs %.2f s\n" "$train1" "$train8"
printf "doctor --from the 1-epoch run %.2f s, the 8-epoch run %.2f s (%s): ratio %.2fx\n" "$from1" "$from8" "$matches" \
  "$(awk "BEGIN { print $from8 / $from1 }")"
printf "their replays alone (diagnosis.json replay.seconds): %.2f s and %.2f s\n" "$arms1" "$arms8"
printf "doctor from scratch on the 8-epoch run %.2f s: --from costs %.3fx of it\n" "$scratch8" "$(awk "BEGIN { print $from8 / $scratch8 }")"
printf "starting the fp32 arm from the checkpoint %.3f s, beside its window and validation %.3f s: %.1f%%\n" "$restore8" "$arm8" \
  "$(awk "BEGIN { print 100 * $restore8 / $arm8 }")"
