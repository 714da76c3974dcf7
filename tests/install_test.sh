#!/usr/bin/env bash
# Installs mixtrain from the build tree into a scratch prefix, then builds and
# runs examples/quickstart as a separate project that only knows
#   find_package(mixtrain REQUIRED) + target_link_libraries(app mixtrain::mixtrain)
# PYTHON is the interpreter whose torch the build used; the consumers find that torch
# as torch's users do (torch.utils.cmake_prefix_path).
#   install_test.sh BUILD_DIR SOURCE_DIR WORK PYTHON
set -euo pipefail
build_dir=$1 src_dir=$2 work=$3 python=$4
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
# The quickstart is given only mixtrain's prefix: the package config finds the torch mixtrain
# was built against by itself.
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
# A consumer of the previous release (0.1.0's header paths and names) still builds,
# warned that what it uses is deprecated, and runs.
cmake -S "$src_dir/tests/install_consumer" -B "$work/consumer" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$work/prefix;$torch_prefix" "${launcher[@]}" >/dev/null
rm -f "$work/consumer/CMakeFiles/previous_release.dir/main.cpp.o"  # ccache replays the warnings too, but build it for real
log=$(cmake --build "$work/consumer" -j 2 2>&1) || { echo "$log"; exit 1; }
echo "$log" | grep -q "Fp16Emulation is mixtrain::amp::ReducedPrecisionEmulation since 0.2.0" \
  || { echo "no deprecation warning for amp::Fp16Emulation:"; echo "$log"; exit 1; }
echo "$log" | grep -q "PrecisionCallback is mixtrain::PrecisionCallback since 0.2.0" \
  || { echo "no deprecation warning for amp::PrecisionCallback:"; echo "$log"; exit 1; }
old=$("$work/consumer/previous_release")
echo "$old"
echo "$old" | grep -q "previous_release: precision fp16"

# The Python package, where the build made one: importable from the prefix alone.
if ls "$build_dir"/python/mixtrain/_native*.so >/dev/null 2>&1; then
  site="$work/prefix/lib/python3/dist-packages"
  where=$(cd "$work" && PYTHONPATH="$site" "$python" -c "import mixtrain; print(mixtrain.__file__)")
  echo "python: $where"
  test "$where" = "$site/mixtrain/__init__.py"
fi
