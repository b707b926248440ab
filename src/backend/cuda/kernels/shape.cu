// CUDA data-movement kernels: permute, expand and slice are one strided read (see launch.h), and
// tril / triu a masked copy, moving items by their bit pattern, so one kernel per item size
// serves every dtype.
#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels/common.cuh"

namespace cstorch::cuda::k {

namespace {

template <class W>
__global__ void gather_strided_kernel(Strided s, const W* __restrict__ x, W* __restrict__ y,
                                      int64_t n) {
  if (s.small) {  // 32-bit index arithmetic (see Strided::small)
    CS_GRID_STRIDE(i, n) {
      uint32_t rest = static_cast<uint32_t>(i), off = static_cast<uint32_t>(s.offset);
      for (int d = s.rank - 1; d >= 0; --d) {
        const uint32_t len = static_cast<uint32_t>(s.shape[d]), q = rest / len;
        off += (rest - q * len) * static_cast<uint32_t>(s.strides[d]);
        rest = q;
      }
      y[i] = x[off];
    }
    return;
  }
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

// Zero bits are zero in every dtype.
template <class W>
__global__ void tri_kernel(bool upper, int64_t diagonal, const W* __restrict__ x, W* __restrict__ y,
                           int64_t m, int64_t n, int64_t total) {
  CS_GRID_STRIDE(e, total) {
    const int64_t j = e % n, i = (e / n) % m;
    const bool keep = upper ? j >= i + diagonal : j <= i + diagonal;
    y[e] = keep ? x[e] : W(0);
  }
}

}  // namespace

void tri(bool upper, int64_t diagonal, int item_bytes, const void* x, void* y, int64_t rows,
         int64_t m, int64_t n, void* stream) {
  const int64_t total = rows * m * n;
  with_word(item_bytes, [&](auto* tag) {
    using W = std::remove_pointer_t<decltype(tag)>;
    tri_kernel<W><<<blocks_for(total), kThreads, 0, as_stream(stream)>>>(
        upper, diagonal, static_cast<const W*>(x), static_cast<W*>(y), m, n, total);
  });
}

void gather_strided(const Strided& s, int item_bytes, const void* x, void* y, int64_t n,
                    void* stream) {
  with_word(item_bytes,
            [&](auto* tag) { launch<std::remove_pointer_t<decltype(tag)>>(s, x, y, n, stream); });
}

}  // namespace cstorch::cuda::k
