// Shared pieces of the CUDA kernels: launch shapes, the broadcast offset walk and block
// reductions. C++17 (see launch.h).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels/launch.h"

namespace cstorch::cuda::k {

constexpr int kThreads = 256;

inline cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

// Blocks for a grid-stride loop over n elements: enough to fill the device, capped so the
// launch stays valid (the loop covers the rest).
inline unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

#define CS_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Calls f with a null pointer of the unsigned word of `item_bytes` (1, 2, 4 or 8): kernels that
// only move items are instantiated per size, not per dtype.
template <class F>
void with_word(int item_bytes, F&& f) {
  switch (item_bytes) {
    case 1:
      return f(static_cast<uint8_t*>(nullptr));
    case 2:
      return f(static_cast<uint16_t*>(nullptr));
    case 4:
      return f(static_cast<uint32_t*>(nullptr));
    default:
      return f(static_cast<uint64_t*>(nullptr));
  }
}

// The offsets of output element i in each of `nin` inputs.
template <int nin>
__device__ inline void bcast_offsets(const Bcast& b, int64_t i, int64_t* off) {
  if (b.small) {
    uint32_t r = static_cast<uint32_t>(i), o[nin] = {};
    for (int d = b.rank - 1; d >= 0; --d) {
      const uint32_t n = static_cast<uint32_t>(b.shape[d]), q = r / n, c = r - q * n;
      r = q;
      for (int k = 0; k < nin; ++k) o[k] += c * static_cast<uint32_t>(b.strides[k][d]);
    }
    for (int k = 0; k < nin; ++k) off[k] = o[k];
    return;
  }
  for (int k = 0; k < nin; ++k) off[k] = 0;
  for (int d = b.rank - 1; d >= 0; --d) {
    const int64_t c = i % b.shape[d];
    i /= b.shape[d];
    for (int k = 0; k < nin; ++k) off[k] += c * b.strides[k][d];
  }
}

__device__ inline float max_nan(float x, float y) {
  if (x != x) return x;
  if (y != y) return y;
  return x > y ? x : y;
}
__device__ inline float min_nan(float x, float y) {
  if (x != x) return x;
  if (y != y) return y;
  return x < y ? x : y;
}

// Block-wide reductions (blockDim.x a multiple of 32, at most 1024). Every thread gets the
// result. `scratch` holds 32 values of T.
template <class T, class Op>
__device__ inline T block_reduce(T v, Op op, T* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  if (warp == 0) {
    v = lane < warps ? scratch[lane] : scratch[0];
    for (int o = 16; o > 0; o >>= 1) {
      const T other = __shfl_down_sync(0xffffffffu, v, o);
      if (lane + o < warps) v = op(v, other);
    }
    __syncwarp();  // every lane has read its scratch entry before lane 0 overwrites scratch[0]
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  return scratch[0];
}

// Stores `code` (kErrorTarget, kErrorIndex) in the backend's mapped error word, which the host
// reads when it next waits for the device.
__device__ inline void report(int* error, int code) {
  *static_cast<volatile int*>(error) = code;
}

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxNanOp {
  __device__ float operator()(float a, float b) const { return max_nan(a, b); }
};
struct MinNanOp {
  __device__ float operator()(float a, float b) const { return min_nan(a, b); }
};

}  // namespace cstorch::cuda::k
