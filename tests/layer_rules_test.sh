#!/usr/bin/env bash
# The layer rules (ARCHITECTURE.md) hold on the tree, and the checker catches a
# breach of each kind it checks on a small made-up tree.
set -euo pipefail
src_dir=$1 work=$2
/usr/bin/python3 "$src_dir/scripts/check_layers.py" "$src_dir"

rm -rf "$work" && mkdir -p "$work/include/mixtrain/core" "$work/include/mixtrain/amp" "$work/src/diagnose"
printf '#include "mixtrain/amp/mixed_precision.h"\n' > "$work/include/mixtrain/core/learner.h"
printf 'constexpr double kDefaultInitScale = 65536.0;\n' > "$work/include/mixtrain/amp/loss_scale_rule.h"
printf 'auto mp = learn.get_cb<amp::MixedPrecision>();\nar.load_from(path);\n' > "$work/src/diagnose/overflow_trace.cpp"
printf '#include "mixtrain/run/options.h"\nconst double s = 65536;\n' > "$work/include/mixtrain/amp/grad_scaler.h"
# Sources named after their headers: amp/loss_scale_rule.h says it is header-only, core/learner.h
# has its source, amp/grad_scaler.h has none; the umbrella leaves grad_scaler.h out.
printf '/// Header-only.\n' >> "$work/include/mixtrain/amp/loss_scale_rule.h"
mkdir -p "$work/src/core" && : > "$work/src/core/learner.cpp"
# Two run-layer sources that include each other's header.
mkdir -p "$work/src/run"
printf '#include "mixtrain/run/doctor.h"\n' > "$work/src/run/branch.cpp"
printf '#include "mixtrain/run/branch.h"\n' > "$work/src/run/doctor.cpp"
printf '#include "mixtrain/core/learner.h"\n#include "mixtrain/amp/loss_scale_rule.h"\n' > "$work/include/mixtrain/mixtrain.h"
if out=$(/usr/bin/python3 "$src_dir/scripts/check_layers.py" "$work"); then
  echo "the checker passed a tree that breaks the rules:"; echo "$out"; exit 1
fi
echo "$out"
for unexpected in "no src/core/learner.cpp" "no src/amp/loss_scale_rule.cpp" "does not include mixtrain/core/learner.h"; do
  if echo "$out" | grep -qF "$unexpected"; then echo "a false breach: $unexpected"; exit 1; fi
done
for expected in "core includes mixtrain/amp/mixed_precision.h from layer amp" \
                "amp includes mixtrain/run/options.h from layer run" \
                "switches on a concrete amp callback" \
                "65536 is written 2 times" \
                "overflow_trace.cpp:2: unpickles without a bounded reader" \
                "include/mixtrain/amp/grad_scaler.h: no src/amp/grad_scaler.cpp" \
                "mixtrain.h: does not include mixtrain/amp/grad_scaler.h" \
                "src/run/branch.cpp and src/run/doctor.cpp include each other's header"; do
  echo "$out" | grep -qF "$expected" || { echo "missing: $expected"; exit 1; }
done
echo "layer rules: the tree passes, and each kind of breach is caught"
