// CUDA data-movement kernels: permute, expand and slice are one strided read (see launch.h),
// moving items by their bit pattern, so one kernel per item size serves every dtype.
#include <cstdint>

#include "backend/cuda/kernels/common.cuh"

namespace cstorch::cuda::k {

namespace {

template <class W>
__global__ void gather_strided_kernel(Strided s, const W* __restrict__ x, W* __restrict__ y,
                                      int64_t n) {
  CS_GRID_STRIDE(i, n) {
    int64_t rest = i, off = s.offset;
    for (int d = s.rank - 1; d >= 0; --d) {
      off += (rest % s.shape[d]) * s.strides[d];
      rest /= s.shape[d];
    }
    y[i] = x[off];
  }
}

template <class W>
void launch(const Strided& s, const void* x, void* y, int64_t n, void* stream) {
  gather_strided_kernel<W><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(
      s, static_cast<const W*>(x), static_cast<W*>(y), n);
}

}  // namespace

void gather_strided(const Strided& s, int item_bytes, const void* x, void* y, int64_t n,
                    void* stream) {
  switch (item_bytes) {
    case 1:
      return launch<uint8_t>(s, x, y, n, stream);
    case 2:
      return launch<uint16_t>(s, x, y, n, stream);
    case 4:
      return launch<uint32_t>(s, x, y, n, stream);
    default:
      return launch<uint64_t>(s, x, y, n, stream);
  }
}

}  // namespace cstorch::cuda::k
