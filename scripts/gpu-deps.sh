#!/usr/bin/env bash
# Copies the build dependencies the GPU machine's image may lack (it has PyTorch with
# its libtorch, but no Debian -dev packages and no network) into .gpu-deps/, which
# the device tool carries: header-only CLI11 and nlohmann_json (with its CMake
# package), zlib's headers, and googletest's sources. ~6 MB. Run it here, then:
#   run(command="bash scripts/gpu-check.sh", carry=[".gpu-deps"])
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
rm -rf .gpu-deps
mkdir -p .gpu-deps/include .gpu-deps/share/cmake
cp -r /usr/include/CLI /usr/include/nlohmann /usr/include/gloo .gpu-deps/include/  # gloo: c10d's ProcessGroupGloo.hpp includes it; the wheel ships no gloo headers
cp /usr/include/zlib.h /usr/include/zconf.h .gpu-deps/include/
cp -r /usr/share/cmake/nlohmann_json .gpu-deps/share/cmake/
cp -r /usr/src/googletest .gpu-deps/googletest
du -sh .gpu-deps
