// bf16 rounding of 16 f32 lanes in AVX-512 registers, shared by the bf16 GEMM's stores
// (gemm_bf16.cpp, compiled with target attributes) and the Fused kernel's AVX-512 variant.
#pragma once
#include <immintrin.h>

namespace cstorch::cpu {

// bf16 bits of 16 f32 lanes, as bf16_t rounds: to nearest even, a NaN kept a quiet NaN (bit 6
// set). Integer arithmetic, not VCVTNEPS2BF16, which flushes denormal inputs to zero.
__attribute__((target("avx512f,avx512bw"))) inline __m256i to_bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                         _mm512_and_si512(high, _mm512_set1_epi32(1))),
                        16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i bits =
      _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(bits);
}

}  // namespace cstorch::cpu
