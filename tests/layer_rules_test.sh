#!/usr/bin/env bash
# The layer rules (ARCHITECTURE.md) hold on the tree, and the checker catches a
# breach of each kind it checks on a small made-up tree.
set -euo pipefail
src_dir=$1 work=$2
/usr/bin/python3 "$src_dir/scripts/check_layers.py" "$src_dir"

rm -rf "$work" && mkdir -p "$work/include/mixtrain/core" "$work/include/mixtrain/amp" "$work/src/diagnose"
printf '#include "mixtrain/amp/mixed_precision.h"\n' > "$work/include/mixtrain/core/learner.h"
printf 'constexpr double kDefaultInitScale = 65536.0;\n' > "$work/include/mixtrain/amp/loss_scale_rule.h"
printf 'auto mp = learn.get_cb<amp::MixedPrecision>();\n' > "$work/src/diagnose/overflow_trace.cpp"
printf '#include "mixtrain/run/options.h"\nconst double s = 65536;\n' > "$work/include/mixtrain/amp/grad_scaler.h"
if out=$(/usr/bin/python3 "$src_dir/scripts/check_layers.py" "$work"); then
  echo "the checker passed a tree that breaks the rules:"; echo "$out"; exit 1
fi
echo "$out"
for expected in "core includes mixtrain/amp/mixed_precision.h from layer amp" \
                "amp includes mixtrain/run/options.h from layer run" \
                "switches on a concrete amp callback" \
                "65536 is written 2 times"; do
  echo "$out" | grep -qF "$expected" || { echo "missing: $expected"; exit 1; }
done
echo "layer rules: the tree passes, and each kind of breach is caught"
