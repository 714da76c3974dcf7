#!/usr/bin/env bash
# Installs everything mixtrain needs: Debian 12 packages, and a project-local
# virtual environment .venv with torch 2.13.0 (the torch mixtrain builds against:
# its libtorch, headers and pybind11; CMake finds it through .venv/bin/python).
# Idempotent: when everything is in place it does nothing (no apt-get update, no pip).
# Uses sudo when not root.
#   scripts/setup.sh          what make demo needs
#   scripts/setup.sh --test   what make test needs too (compilers for the sanitizer
#                             build, googletest, pytest, ...)
#   scripts/setup.sh --cuda   that, and .venv-cuda: torch 2.14.1 (a CUDA build) with
#                             torchvision 0.29.1, ~5.5 GB, for scripts/cuda-check.sh
#                             and the tests' torchvision models
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION=2.13.0   # the tested torch; see README "Supported torch versions"
TORCH_CUDA_VERSION=2.14.1 TORCHVISION_VERSION=0.29.1   # a CUDA torch, compiled against only

PACKAGES=(
  cmake g++ make ccache pkg-config
  zlib1g-dev
  libgloo-dev                         # headers c10d's ProcessGroupGloo.hpp includes (the torch wheel ships none)
  libcli11-dev nlohmann-json3-dev libfmt-dev
  dataset-fashion-mnist
  fortunes                            # the built-in transformer's text corpus (/usr/share/games/fortunes)
)
TEST_PACKAGES=(
  libgtest-dev
  iproute2                            # network namespaces for the 2-node launch test
  clang-14 libclang-rt-14-dev          # the ASan+UBSan build and libFuzzer (make sanitize, make fuzz)
  libomp-14-dev                        # OpenMP for the clang build (not on every image)
  ninja-build                          # pip's build of the package (tests/pip_install_test.sh), as a user's would run
)
TEST_PIP=(pytest numpy)               # the Python package's tests

with_tests=0 with_cuda=0
case "${1:-}" in
  "") ;;
  --test) with_tests=1 ;;
  --cuda) with_tests=1 with_cuda=1 ;;
  *) echo "setup: error: unknown argument '$1' (--test or --cuda)" >&2; exit 2 ;;
esac
[ "$with_tests" = 1 ] && PACKAGES+=("${TEST_PACKAGES[@]}")

# The interpreter the venv is made from: python3 on PATH (Python 3.11: the torch
# file on this machine kind is for CPython 3.11).
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null || PACKAGES+=(python3)
if ! "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null; then PACKAGES+=(python3-venv); fi
if ! "$PYTHON" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null; then
  PACKAGES+=(python3-dev)             # Python.h for the extension module
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The venv: made once, torch pinned; a venv with another torch is corrected in place.
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "setup: making .venv with torch==$TORCH_VERSION"
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check "torch==$TORCH_VERSION"
fi
if [ "$with_tests" = 1 ] && ! .venv/bin/python -c 'import pytest, numpy' 2>/dev/null; then
  echo "setup: installing ${TEST_PIP[*]} into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check "${TEST_PIP[@]}"
fi
if [ "$with_cuda" = 1 ] && ! .venv-cuda/bin/python -c "import torch, torchvision, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_CUDA_VERSION')" 2>/dev/null; then
  echo "setup: making .venv-cuda with torch==$TORCH_CUDA_VERSION torchvision==$TORCHVISION_VERSION"
  [ -x .venv-cuda/bin/python ] || "$PYTHON" -m venv .venv-cuda
  .venv-cuda/bin/python -m pip install -q --disable-pip-version-check "torch==$TORCH_CUDA_VERSION" "torchvision==$TORCHVISION_VERSION"
fi
