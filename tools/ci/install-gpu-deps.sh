#!/usr/bin/env bash
# Installs what `make GPU=hip` needs on Debian 12 (run as root): Debian's hipcc (HIP 5.2, clang 15),
# the HIP runtime and the AMD GPU device libraries (~30 s, +656 MB). `make GPU=cuda` needs the
# CUDA toolkit with cuBLAS instead (nvcc under /usr/local/cuda, or CUDA_HOME=...), which Debian 12
# does not package: see docs/gpu.md. Idempotent like tools/install-deps.sh: skips apt entirely
# when everything is already present.
set -euo pipefail
PKGS=(
  hipcc              # the HIP compiler driver (clang-15 with the amdgcn target)
  libamdhip64-dev    # HIP runtime headers and libamdhip64.so
  rocm-device-libs   # amdgcn bitcode device libraries (ocml/ockl) the kernels link against
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-gpu-deps: all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-gpu-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq "${missing[@]}" # with recommends: what was measured (docs/gpu.md)
