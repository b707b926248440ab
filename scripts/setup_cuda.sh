#!/usr/bin/env bash
# Installs the CUDA toolkit that builds cstorch's CUDA backend (src/backend/cuda/): Debian
# bookworm's nvidia-cuda-toolkit (CUDA 11.8: nvcc, the runtime, cuBLAS/cuBLASLt), which lives in
# the non-free component. Adds a small sources file that enables non-free (and contrib, where
# some of the toolkit's dependencies live) next to the machine's own sources; the existing
# sources files are not edited. No GPU is needed to install it or to build with it.
# Idempotent: does nothing when the toolkit is already installed. Uses sudo when not root.
set -euo pipefail

# nvidia-cuda-toolkit-gcc: CUDA 11.8's nvcc accepts GCC up to 11, and Debian's nvcc picks its host
# compiler through a wrapper that looks for g++-11 (GCC 12, bookworm's default, is refused). This
# package pulls in g++-11 (and makes the choice explicit instead of whatever the toolkit's
# alternative dependency found, such as clang-14).
PACKAGES=(nvidia-cuda-toolkit nvidia-cuda-toolkit-gcc)
missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  echo "setup_cuda: nvidia-cuda-toolkit already installed ($(dpkg-query -W -f='${Version}' nvidia-cuda-toolkit))"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

. /etc/os-release
if [[ "${VERSION_CODENAME:-}" != "bookworm" ]]; then
  echo "setup_cuda: this script knows Debian bookworm's packages; this is '${VERSION_CODENAME:-unknown}'" >&2
  exit 1
fi

SOURCES=/etc/apt/sources.list.d/cstorch-cuda-nonfree.sources
if [[ ! -f $SOURCES ]]; then
  echo "setup_cuda: enabling contrib and non-free in $SOURCES"
  $SUDO tee "$SOURCES" >/dev/null <<'SRC'
# Added by cstorch's scripts/setup_cuda.sh: the CUDA toolkit (nvidia-cuda-toolkit) is in non-free.
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: contrib non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# Without recommends: the profilers, debuggers and documentation are not needed to build.
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup_cuda: installed nvidia-cuda-toolkit $(dpkg-query -W -f='${Version}' nvidia-cuda-toolkit)"
nvcc --version | tail -n 2
