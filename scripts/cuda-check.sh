#!/usr/bin/env bash
# The CUDA compile check: builds the library, the CLI, the test binary and the GPU
# benchmark against a CUDA build of torch (2.14.1, from pip) with the installed CUDA
# toolkit. Compile and link only: nothing CUDA runs on a machine without a GPU. It
# compiles what only a CUDA torch compiles: the NCCL process group (USE_C10D_NCCL),
# gpu_bench's caching-allocator reads (MIXTRAIN_BENCH_CUDA), and every file against
# the CUDA build's headers.
#   scripts/cuda-check.sh [BUILD_DIR]     (default build-cuda; make cuda-check)
# Makes .venv-cuda (torch 2.14.1 + torchvision 0.29.1, ~5.5 GB) when it is missing;
# tests/python/export_torchvision.py uses the same venv for torchvision's models.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-cuda}
bash scripts/setup.sh --cuda
nvidia=$(.venv-cuda/bin/python -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__path__[0]), "nvidia"))')
# The CUDA toolkit: nvcc's own folder (a wrapper on PATH may point elsewhere).
cuda_root=${CUDA_HOME:-/usr/local/cuda}
[ -x "$cuda_root/bin/nvcc" ] || { echo "cuda-check: error: no nvcc under $cuda_root (set CUDA_HOME)" >&2; exit 2; }
# The toolkit here is the compiler and runtime only; NVRTC, which torch's CMake
# package asks for, comes from pip's nvidia-cuda-nvrtc beside torch.
nvrtc=$(ls "$nvidia"/cu*/lib/libnvrtc.so.* 2>/dev/null | head -1 || true)
extra=()
[ -n "$nvrtc" ] && extra+=("-DCUDA_nvrtc_LIBRARY=$nvrtc")

# Unoptimized (-O0, no debug info): the check is whether it compiles and links, and
# optimizing is most of a compile's time on 2 cores.
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 \
  -DMIXTRAIN_PYTHON="$PWD/.venv-cuda/bin/python" -DCUDA_TOOLKIT_ROOT_DIR="$cuda_root" -DTORCH_CUDA_ARCH_LIST=9.0 \
  -DMIXTRAIN_BUILD_PYTHON=OFF -DMIXTRAIN_BUILD_EXAMPLES=OFF -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST \
  "${extra[@]}" > "$build.configure.log" 2>&1 \
  || { cat "$build.configure.log"; exit 1; }
grep -q "USE_C10D_NCCL" "$build/CMakeFiles/mixtrain.dir/flags.make" \
  || { echo "cuda-check: error: the CUDA build did not enable the NCCL process group (no nccl.h?)" >&2; exit 1; }
cmake --build "$build" -j "$(nproc)" --target mixtrain mixtrain_cli mixtrain_tests gpu_bench
echo "cuda-check: the library, CLI, tests and gpu_bench compiled and linked against torch" \
  "$(.venv-cuda/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null)" "with nvcc $("$cuda_root/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
