// A 16 x 16 transpose of 32-bit elements in zmm registers, for packing GEMM operands (gemm.cpp's
// f32 panels, gemm_bf16.cpp's bf16 pairs as 32-bit words). AVX-512 builds only.
#pragma once
#include <cstdint>

#include "backend/cpu/isa.h"

#if CSTORCH_AVX512_KERNELS
namespace cstorch::cpu {

// GCC 12's unpack and shuffle intrinsics start from _mm512_undefined_ps(), which its
// -Wuninitialized reports once inlined (a false positive).
CSTORCH_INTRINSICS_BEGIN

// dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols (rows, cols <= 16); lanes
// rows..width-1 of each written dst row are zero (panel padding). width <= 16.
// `full`: rows == cols == width == 16, known at compile time (no masks, no branches).
template <bool full>
inline void transpose16(const float* src, int64_t lds, int rows, int cols, float* dst, int64_t ldd,
                        int width) {
  if constexpr (full) rows = cols = width = 16;
  const __mmask16 cmask = static_cast<__mmask16>((1u << cols) - 1);
  __m512 r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i)
    r[i] = full       ? _mm512_loadu_ps(src + i * lds)
           : i < rows ? _mm512_maskz_loadu_ps(cmask, src + i * lds)
                      : _mm512_setzero_ps();
  // Stage 1: interleave pairs of rows (32-bit), stage 2: 64-bit, stages 3-4: 128-bit lanes.
  __m512 t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 4) {
#pragma GCC unroll 16
    for (int j = 0; j < 2; ++j) {
      r[i + j] = _mm512_castpd_ps(
          _mm512_unpacklo_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
      r[i + j + 2] = _mm512_castpd_ps(
          _mm512_unpackhi_pd(_mm512_castps_pd(t[i + j]), _mm512_castps_pd(t[i + j + 2])));
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; i += 8) {
#pragma GCC unroll 16
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
  // After the shuffles, register q holds source column perm[q] (the 32-bit then 64-bit
  // interleaves leave column families 0, 2, 1, 3 in each group of four registers).
  static constexpr int perm[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
  const __mmask16 wmask = static_cast<__mmask16>((1u << width) - 1);
#pragma GCC unroll 16
  for (int q = 0; q < 16; ++q) {
    const int c = perm[q];
    if (full)
      _mm512_storeu_ps(dst + c * ldd, r[q]);
    else if (c < cols)
      _mm512_mask_storeu_ps(dst + c * ldd, wmask, r[q]);
  }
}

CSTORCH_INTRINSICS_END

}  // namespace cstorch::cpu
#endif
