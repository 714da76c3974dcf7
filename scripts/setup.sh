#!/usr/bin/env bash
# Installs everything mixtrain needs from Debian 12's archive.
# Idempotent: when every package is already installed it does nothing (no apt-get update).
# Uses sudo when not root.
set -euo pipefail

PACKAGES=(
  cmake g++ make ccache pkg-config
  libtorch-dev libopenblas0-pthread   # OpenBLAS is essential: without it libtorch uses reference BLAS (~35x slower)
  libgloo-dev                         # headers libtorch's c10d Gloo process group includes (mixtrain::distributed)
  dataset-fashion-mnist
  zlib1g-dev libgtest-dev
  iproute2                            # network namespaces for the 2-node launch test
  libcli11-dev nlohmann-json3-dev libfmt-dev
  clang-14 libclang-rt-14-dev          # the ASan+UBSan build and libFuzzer (make sanitize, make fuzz)
  libomp-14-dev                        # OpenMP for the clang build (not on every image)
  python3-torch                        # exports TorchScript test models and runs the Python comparison scripts
  python3-dev pybind11-dev             # the Python package's extension (python/), over libtorch_python
  python3-pytest python3-torchvision   # its tests: pytest, and an eager torchvision model for the doctor
  fortunes                             # the built-in transformer's text corpus (/usr/share/games/fortunes)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
