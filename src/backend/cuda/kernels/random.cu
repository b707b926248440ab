// CUDA kernels for random draws: element i is Philox 4x32-10 block {offset, i} under key seed
// (backend/philox.h, the CPU's generator), with the generator state read from device memory by
// each thread. The values are elementwise_math.cuh's uniform_value / normal_value /
// bernoulli_value: the CPU's formulas (src/backend/cpu/random.cpp) operation for operation, so
// uniform and bernoulli draws equal the CPU's bit for bit and normal draws differ only where
// logf / cosf do.
//
// Rounding: the CPU's x86-64-v3 and v4 kernels (GCC, -ffp-contract=fast) compute low + range * u
// and mean + stdev * z as one fused multiply-add each (vfmadd in their code), so these do too,
// explicitly, and every other product is a plain rounded multiply that nvcc never contracts.
#include <type_traits>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/elementwise_math.cuh"
#include "backend/cuda/kernels/half.cuh"

namespace cstorch::cuda::k {

namespace {

__global__ void uniform_kernel(const int64_t* state, float low, float range, float* y, int64_t n) {
  const PhiloxStream s = PhiloxStream::of(state);
  CS_GRID_STRIDE(i, n) y[i] = uniform_value(s.at(i), low, range);
}

// The library's logf, sqrtf and cosf (not the fast intrinsics), as the CPU calls libm's.
__global__ void normal_kernel(const int64_t* state, float mean, float stdev, float* y, int64_t n) {
  const PhiloxStream s = PhiloxStream::of(state);
  CS_GRID_STRIDE(i, n) y[i] = normal_value<CudaMath>(s.at(i), mean, stdev);
}

template <class T>
__global__ void bernoulli_kernel(const int64_t* state, uint32_t threshold, T* y, int64_t n) {
  const PhiloxStream s = PhiloxStream::of(state);
  CS_GRID_STRIDE(i, n) {
    const bool one = bernoulli_value(s.at(i), threshold);
    if constexpr (std::is_same_v<T, bool>)
      y[i] = one;
    else if constexpr (is_half_v<T>)  // dropout's mask in autocast's 16-bit region
      y[i] = store<T>(one ? 1.0f : 0.0f);
    else
      y[i] = one ? T(1) : T(0);
  }
}

}  // namespace

void rand_uniform(const int64_t* state, float low, float range, float* y, int64_t n, void* stream) {
  uniform_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(state, low, range, y, n);
}

void rand_normal(const int64_t* state, float mean, float stdev, float* y, int64_t n, void* stream) {
  normal_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(state, mean, stdev, y, n);
}

void bernoulli(const int64_t* state, uint32_t threshold, Ty t, void* y, int64_t n, void* stream) {
  const unsigned g = blocks_for(n);
  cudaStream_t s = as_stream(stream);
  switch (t) {
    case Ty::f32:
      bernoulli_kernel<float><<<g, kThreads, 0, s>>>(state, threshold, static_cast<float*>(y), n);
      break;
    case Ty::i32:
      bernoulli_kernel<int32_t>
          <<<g, kThreads, 0, s>>>(state, threshold, static_cast<int32_t*>(y), n);
      break;
    case Ty::i64:
      bernoulli_kernel<int64_t>
          <<<g, kThreads, 0, s>>>(state, threshold, static_cast<int64_t*>(y), n);
      break;
    case Ty::b8:
      bernoulli_kernel<bool><<<g, kThreads, 0, s>>>(state, threshold, static_cast<bool*>(y), n);
      break;
    case Ty::bf16:
      bernoulli_kernel<bf16><<<g, kThreads, 0, s>>>(state, threshold, static_cast<bf16*>(y), n);
      break;
    case Ty::f16:
      bernoulli_kernel<f16><<<g, kThreads, 0, s>>>(state, threshold, static_cast<f16*>(y), n);
      break;
  }
}

}  // namespace cstorch::cuda::k
