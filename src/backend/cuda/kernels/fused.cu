// The Fused op's kernel: one thread per output element (grid-stride) interprets the node's
// elementwise program (elementwise_math.cuh), its registers a float array of the thread. The
// program is a kernel parameter, so every thread reads it from the constant bank and all
// threads take the same branches. The per-element work is fused_element, which a host program
// can run as well (see elementwise_math.cuh).
#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/elementwise_math.cuh"

namespace cstorch::cuda::k {

namespace {

template <class T>
__global__ void fused_kernel(const FusedProgram p, T* out, int64_t n) {
  CS_GRID_STRIDE(i, n) out[i] = store<T>(fused_element<CudaMath>(p, i, n));
}

}  // namespace

void fused(const FusedProgram& p, void* out, int64_t n, void* stream) {
  if (p.out_bf16)
    fused_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, static_cast<bf16*>(out), n);
  else
    fused_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(p, static_cast<float*>(out), n);
}

}  // namespace cstorch::cuda::k
