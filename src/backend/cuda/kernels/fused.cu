// The Fused op's kernel: one thread per group of output elements (grid-stride; fused_lanes)
// interprets the node's elementwise program (elementwise_math.cuh), its registers a float array
// of the thread. The program is a kernel parameter, so every thread reads it from the constant
// bank and all threads take the same branches. The work is fused_elements, which a host program
// can run as well (see elementwise_math.cuh).
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/elementwise_math.cuh"

namespace cstorch::cuda::k {

namespace {

// A thread reads all its elements of every input before writing any of its outputs, so `out`
// may alias an input of the output's shape and element size.
template <class T, int L>
__global__ void fused_kernel(const FusedProgram p, T* out, int64_t n) {
  const int64_t groups = (n + L - 1) / L;
  CS_GRID_STRIDE(g, groups) {
    const int64_t i0 = g * L;
    const int cnt = n - i0 < L ? static_cast<int>(n - i0) : L;
    float v[L];
    fused_elements<CudaMath, L>(p, i0, cnt, n, v);
#pragma unroll
    for (int e = 0; e < L; ++e)
      if (e < cnt) out[i0 + e] = store<T>(v[e]);
  }
}

template <int L>
void launch(const FusedProgram& p, void* out, int64_t n, cudaStream_t stream) {
  const unsigned blocks = blocks_for((n + L - 1) / L);
  if (p.out_bf16)
    fused_kernel<bf16, L><<<blocks, kThreads, 0, stream>>>(p, static_cast<bf16*>(out), n);
  else
    fused_kernel<float, L><<<blocks, kThreads, 0, stream>>>(p, static_cast<float*>(out), n);
}

}  // namespace

void fused(const FusedProgram& p, void* out, int64_t n, void* stream) {
  if (fused_lanes(p, n) == kFusedLanes)
    launch<kFusedLanes>(p, out, n, as_stream(stream));
  else
    launch<1>(p, out, n, as_stream(stream));
}

}  // namespace cstorch::cuda::k
