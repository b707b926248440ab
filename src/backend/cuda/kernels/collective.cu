// CUDA kernels around the collectives (runtime/collective_ops.cpp): the bucket's scaled copies
// and the mean's division. The reduction itself runs on the host, through the replica group's
// communicator, on a host copy of the bucket.
#include "backend/cuda/kernels/common.cuh"

namespace cstorch::cuda::k {

namespace {

__global__ void scale_kernel(const float* __restrict__ x, float* y, float w, int64_t n) {
  CS_GRID_STRIDE(i, n) y[i] = x[i] * w;
}

__global__ void divide_kernel(float* y, float d, int64_t n) {
  CS_GRID_STRIDE(i, n) y[i] = y[i] / d;
}

}  // namespace

void scale(const float* x, float* y, float w, int64_t n, void* stream) {
  scale_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(x, y, w, n);
}

void divide(float* y, float d, int64_t n, void* stream) {
  divide_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(y, d, n);
}

}  // namespace cstorch::cuda::k
