#!/usr/bin/env bash
# Builds cstorch with the CUDA backend in build-cuda and tests it.
#   Without a GPU (nvidia-smi fails): configure with -DCSTORCH_CUDA=ON, compile and link
#   everything (the kernels for every target architecture included), and run the CPU-side tests
#   of the backend (block cache, device table, capability table, FC-MNIST on the capability
#   stand-in) plus the device tests.
#   With a GPU: also the ctest label `cuda` (tests/cuda/: every CUDA kernel against the CPU, and
#   FC-MNIST trained 100 steps per optimizer on GPU:0 against the CPU).
# The toolkit comes from scripts/setup_cuda.sh (Debian's CUDA 11.8), or any nvcc on PATH / in
# CUDACXX (e.g. /usr/local/cuda/bin/nvcc). Environment: JOBS (default nproc), CUDA_ARCHS (default
# "80;90"), BUILD_DIR (default build-cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
BUILD_DIR=${BUILD_DIR:-build-cuda}
CUDA_ARCHS=${CUDA_ARCHS:-80;90}

NVCC=${CUDACXX:-$(command -v nvcc || true)}
if [[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [[ -z "$NVCC" ]]; then
  echo "test_cuda: no nvcc found (run scripts/setup_cuda.sh, or set CUDACXX)" >&2
  exit 1
fi
source scripts/cuda_env.sh
LAUNCHER=()
if command -v ccache >/dev/null; then
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCSTORCH_WERROR=ON \
  -DCSTORCH_PYTHON=/usr/bin/python3 \
  "-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS" "${LAUNCHER[@]}" "${CUDA_CMAKE_ARGS[@]}"
cmake --build "$BUILD_DIR" -j "$JOBS" --target cszoo unit_tests cuda_tests
echo "test_cuda: built in $(($(date +%s) - start)) s"

# The backend's host-side tests, and the device layer's.
"$BUILD_DIR/tests/unit_tests" --gtest_filter='CudaBlockCache.*:CudaDeviceTable.*:CudaCapabilities.*:*CudaFcMnist.*:CudaFcMnistRefusals.*:*CudaModels.*'
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" -R '^Device\.' -LE cuda

if nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  ctest --test-dir "$BUILD_DIR" --output-on-failure -L cuda --timeout 900
else
  echo "test_cuda: no GPU (nvidia-smi failed): compiled and linked, CPU-side tests only;" \
       "the cuda-labelled tests did not run"
fi
