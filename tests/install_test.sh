#!/usr/bin/env bash
# Installs mixtrain from the build tree into a scratch prefix, then builds and
# runs examples/quickstart as a separate project that only knows
#   find_package(mixtrain REQUIRED) + target_link_libraries(app mixtrain::mixtrain)
set -euo pipefail
build_dir=$1 src_dir=$2 work=$3
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
cmake -S "$src_dir/examples/quickstart" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix" "${launcher[@]}" >/dev/null
cmake --build "$work/build" -j 2 >/dev/null
test -f "$work/prefix/include/mixtrain/mixtrain.h"
test -f "$work/prefix/lib/cmake/mixtrain/mixtrainConfig.cmake" || test -f "$work/prefix/lib/x86_64-linux-gnu/cmake/mixtrain/mixtrainConfig.cmake"
# A tiny synthetic run: the example must train and report a learned accuracy.
out=$("$work/build/quickstart" --synthetic)
echo "$out"
echo "$out" | grep -q "quickstart: valid accuracy"
acc=$(echo "$out" | sed -n 's/.*valid accuracy \([0-9.]*\).*/\1/p')
awk -v a="$acc" 'BEGIN { exit !(a > 0.9) }'
# The Python package, where the build made one: importable from the prefix alone.
if ls "$build_dir"/python/mixtrain/_native*.so >/dev/null 2>&1; then
  site="$work/prefix/lib/python3/dist-packages"
  where=$(cd "$work" && PYTHONPATH="$site" /usr/bin/python3 -c "import mixtrain; print(mixtrain.__file__)")
  echo "python: $where"
  test "$where" = "$site/mixtrain/__init__.py"
fi
