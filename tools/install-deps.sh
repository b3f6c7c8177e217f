#!/usr/bin/env bash
# Installs every Debian package flux-sim needs to build and test (Debian 12, run as root).
# Idempotent: skips apt entirely when everything is already present.
set -euo pipefail
PKGS=(
  build-essential pkg-config make
  libopenblas-dev                  # cblas_sgemm / cblas_dgemm
  libdnnl-dev                      # oneDNN: float32 GEMMs where OpenBLAS misdetects the CPU, bf16 on AVX512-BF16 / AMX (sim/backend/fs_gemm.c)
  libopenmpi-dev openmpi-bin       # MPI ranks
  libhdf5-openmpi-dev hdf5-tools   # parallel HDF5 (flux-dump files), h5dump for users
  libcmocka-dev                    # unit tests
  libcjson-dev                     # config.json and safetensors headers
  python3-h5py python3-numpy       # tools/ scripts and cross-checks of dumps
  gdb                              # tools/debug/flux-sim.gdb, the debugging walkthrough test
  python3-torch                    # tools/torch/torch_dump.py's test (PyTorch forward hooks → flux-dump)
  clang libclang-rt-14-dev libomp-dev  # make fuzz: libFuzzer harnesses (clang's -fopenmp needs libomp)
  valgrind                         # make valgrind / make sanitize: tests/valgrind.sh
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
else
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# The pinned peer venv (PyPI torch 2.15.0 + diffusers 0.42.1, .venv-peer/): tests/peer_diffusers.sh
# judges diffusers' real FLUX.1/FLUX.2 runs in it. ~2.6 GB downloaded once into
# ~/.cache/flux-sim-peer (2 min), then rebuilt from that cache in ~80 s, 4 s when up to date.
# FLUX_NO_PEER=1 leaves it out (that test then says SKIPPED).
if [ "${FLUX_NO_PEER:-0}" != 1 ]; then
  "$(dirname "$0")/install-peer.sh"
fi
