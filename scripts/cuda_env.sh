# Sourced by scripts/test.sh and scripts/test_cuda.sh: the CMake arguments for building the CUDA
# backend with the nvcc named by $NVCC, in the array CUDA_CMAKE_ARGS.
# nvcc runs ptxas and friends from PATH: its own folder goes first, so that a machine with two
# toolkits (Debian's 11.8 in /usr/bin, another in /usr/local/cuda/bin) does not mix them.
# CUDA 11.x accepts GCC up to 11 (bookworm's default is 12): g++-11 is named as the host
# compiler (Debian's nvcc would also find it through its wrapper; naming it keeps the choice
# visible in the configure output).
NVCC_VERSION=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\.[0-9]*\).*/\1/p')
echo "cuda: nvcc $NVCC_VERSION ($NVCC)"
export PATH="$(dirname "$NVCC"):$PATH"
CUDA_CMAKE_ARGS=(-DCSTORCH_CUDA=ON "-DCMAKE_CUDA_COMPILER=$NVCC")
if [[ "$NVCC_VERSION" == 11.* ]]; then
  if ! command -v g++-11 >/dev/null; then
    echo "cuda: CUDA $NVCC_VERSION needs g++-11 (scripts/setup_cuda.sh installs it)" >&2
    exit 1
  fi
  CUDA_CMAKE_ARGS+=(-DCMAKE_CUDA_HOST_COMPILER=g++-11)
fi
