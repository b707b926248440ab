#!/usr/bin/env bash
# Installs every dependency of cstorch from Debian packages, by name.
# Idempotent: packages already installed are skipped; apt runs only when something is missing.
# Uses sudo when not root. Safe to run repeatedly.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang-format
  libopenblas-openmp-dev      # CBLAS GEMM; the OpenMP build shares one thread pool with our kernels
  libfmt-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev
  libhdf5-dev
  zlib1g-dev                  # CRC-32 for checkpoint checksums and the tests' file checks
  libzip-dev                  # the zip container of .pt checkpoints and .npz arrays
  libcairo2-dev               # the loss/LR plot (modelzoo/loggers/plot.cpp): antialiased lines, text, PNG output
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev                 # bench_peak's second GEMM peer: oneDNN, whose kernels PyTorch's CPU build uses
  python3 python3-numpy python3-torch   # the PyTorch reference for tests and the benchmark peer
  python3-h5py
  openmpi-bin libopenmpi-dev  # multi-replica data parallel: replicas are MPI ranks (mpirun)
  clang libclang-rt-dev       # scripts/fuzz.sh: libFuzzer and clang's sanitizer runtimes
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
