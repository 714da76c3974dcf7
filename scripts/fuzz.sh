#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time (ASan+UBSan build).
#   scripts/fuzz.sh BUILD_DIR SECONDS_PER_TARGET
# First every kept regression input is replayed, then the target fuzzes from its
# seeds. A finding is written to BUILD_DIR/fuzz-artifacts/; fix it, then keep the
# input in fuzz/regressions/<target>/ (the test suite replays those too).
set -euo pipefail
build=${1:?build dir}
seconds=${2:-60}
root=$(cd "$(dirname "$0")/.." && pwd)
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"
# libtorch keeps process-lifetime allocations (op registries); they are not leaks.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}

# One target: its regressions replayed, then fuzzing from its seeds. Its lines go to
# $build/fuzz-$target.out, printed when it ends (targets run side by side).
fuzz_one() {
  local target=$1
  local bin="$build/fuzz/${target}_fuzz"
  local corpus="$build/fuzz-corpus/$target"
  mkdir -p "$corpus"
  if [ -d "$root/fuzz/seeds/$target" ]; then cp -n "$root/fuzz/seeds/$target"/* "$corpus"/; fi
  if [ "$target" = checkpoint ] || [ "$target" = pure_bf16_checkpoint ] || [ "$target" = scripted_model ]; then
    # checkpoint: the seed must come from this build's Learner; scripted_model: its
    # structured inputs (a seed model's record each) come from the seed models.
    "$bin" -write_seed="$corpus" 2>/dev/null
  fi
  local regressions=("$root/fuzz/regressions/$target"/*)
  if [ -e "${regressions[0]}" ]; then
    echo "fuzz: $target: replaying ${#regressions[@]} regression input(s)"
    "$bin" -artifact_prefix="$artifacts/" "${regressions[@]}" > "$build/fuzz-$target-regressions.log" 2>&1 || {
      echo "fuzz: $target: a regression input fails again; see $build/fuzz-$target-regressions.log"; return 1; }
  fi
  echo "fuzz: $target: fuzzing for ${seconds}s"
  if "$bin" -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 \
       -artifact_prefix="$artifacts/" "$corpus" > "$build/fuzz-$target.log" 2>&1; then
    grep -E "^stat::number_of_executed_units" "$build/fuzz-$target.log" | sed "s/^/fuzz: $target: /"
  else
    echo "fuzz: $target: FINDING; input in $artifacts/, log: $build/fuzz-$target.log"
    grep -E "ERROR|SUMMARY|==ABORTING|terminate called" "$build/fuzz-$target.log" | head -5
    return 1
  fi
}

# Each target is one single-threaded process: as many run at once as there are cores.
jobs=${FUZZ_JOBS:-$(nproc)}
status=0
running=()
finish() {  # waits for the oldest running target and prints its lines
  local target=${running[0]%%:*} pid=${running[0]##*:}
  wait "$pid" || status=1
  cat "$build/fuzz-$target.out"
  running=("${running[@]:1}")
}
for target in idx checkpoint pure_bf16_checkpoint tensor_file scripted_model; do
  [ "${#running[@]}" -lt "$jobs" ] || finish
  fuzz_one "$target" > "$build/fuzz-$target.out" 2>&1 &
  running+=("$target:$!")
done
while [ "${#running[@]}" -gt 0 ]; do finish; done
exit $status
