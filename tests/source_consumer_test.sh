#!/usr/bin/env bash
# C++ consumers that take mixtrain in as source: add_subdirectory and FetchContent from a
# local path (tests/source_consumer). Each configures mixtrain inside its own project with
# its own torch, builds examples/quickstart and trains it on synthetic data.
# With PREBUILT_LIB (make test passes make check's libmixtrain.a, the same sources against
# the same torch) the subproject links it instead of compiling the library once per way:
# what that leaves out is the library's compile inside another project (run by hand with
# FetchContent: README, "The library").
#   source_consumer_test.sh SOURCE_DIR WORK PYTHON [PREBUILT_LIB]
set -euo pipefail
src=$1 work=$2 python=$3 prebuilt=${4:-}
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
for way in add_subdirectory fetch_content; do
  rm -rf "$work/$way"
  cmake -S "$src/tests/source_consumer" -B "$work/$way" -DCMAKE_BUILD_TYPE=Release -DMIXTRAIN_WAY=$way \
    -DMIXTRAIN_SOURCE_DIR="$src" -DCMAKE_PREFIX_PATH="$torch_prefix" -DMIXTRAIN_PREBUILT_LIBRARY="$prebuilt" \
    "${launcher[@]}" >/dev/null
  # Only the library and the consumer: the subproject builds no tests, tools or Python.
  if grep -q "mixtrain_tests\|mixtrain_cli\|mixtrain_python" "$work/$way/Makefile"; then
    echo "$way: the subproject configured more than the library"; exit 1
  fi
  cmake --build "$work/$way" -j 2 >/dev/null
  out=$("$work/$way/quickstart" --synthetic)
  echo "$way: $(echo "$out" | tail -1)"
  acc=$(echo "$out" | sed -n 's/.*valid accuracy \([0-9.]*\).*/\1/p')
  awk -v a="$acc" 'BEGIN { exit !(a > 0.9) }' || { echo "$way: accuracy $acc"; exit 1; }
done
