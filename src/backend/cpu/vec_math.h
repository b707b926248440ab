// Float math written branch-free so loops that call it vectorise (the std:: versions do not).
#pragma once
#include <bit>
#include <cstdint>
#include <limits>

#include "backend/cpu/isa.h"

namespace cstorch::cpu {

// exp(x) for float, written branch-free so loops using it vectorise (std::exp does not):
// Cephes' expf, 2^n * p(r) with r = x - n ln2, |r| <= ln2 / 2; max relative error ~1e-7.
// Exact 0 below the float range, inf above, NaN kept.
[[gnu::always_inline]] inline float vexp(float x) {
  constexpr float kHi = 88.3762626647949f, kLo = -87.3365447504019f;
  float xc = x > kHi ? kHi : x;
  // Below the range the result is 0 (selected at the end), so the polynomial runs on 0 there
  // rather than on kLo: 2^-126 * p(r) can be subnormal, and a vector multiply with a subnormal
  // result takes a microcode assist (about 11x the time per element on an Intel Xeon). Masked
  // causal attention scores are -inf, a third of the exps there.
  xc = xc < kLo ? 0.0f : xc;
  // Round to nearest by the 1.5 * 2^23 trick (std::floor blocks vectorisation).
  float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  float y = p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  y = x < kLo ? 0.0f : y;
  y = x > kHi ? std::numeric_limits<float>::infinity() : y;
  return x != x ? x : y;
}

// tanh(x) for float, branch-free (vectorises): 1 - 2 / (exp(2|x|) + 1) with the sign restored;
// below |x| = 2^-4 an odd Taylor polynomial to x^7 (the subtraction would lose relative
// precision there). Max relative error ~3e-7; saturates to +-1, NaN kept.
[[gnu::always_inline]] inline float vtanh(float x) {
  const float a = x < 0 ? -x : x;
  const float e = vexp(2.0f * (a > 20.0f ? 20.0f : a));
  float big = 1.0f - 2.0f / (e + 1.0f);
  const float x2 = x * x;
  const float small = a * (1.0f + x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315))));
  float r = a < 0.0625f ? small : big;
  r = x < 0 ? -r : r;
  return x != x ? x : r;
}

#if CSTORCH_AVX512_KERNELS
CSTORCH_INTRINSICS_BEGIN
// vexp on 16 lanes, bitwise the scalar form as GCC compiles it in the AVX-512 variant (which
// contracts its multiply-adds into FMAs as written here), with min / max and blends for the
// scalar form's selects.
[[gnu::always_inline]] inline __m512 vexp16(__m512 x) {
  const auto k = [](float v) { return _mm512_set1_ps(v); };
  constexpr float kHi = 88.3762626647949f, kLo = -87.3365447504019f;
  __m512 xc = _mm512_min_ps(k(kHi), x);  // kHi < x ? kHi : x (a NaN stays)
  const __mmask16 below = _mm512_cmp_ps_mask(x, k(kLo), _CMP_LT_OQ);
  xc = _mm512_mask_blend_ps(below, xc, _mm512_setzero_ps());  // 0 below the range, as vexp
  const __m512 n =
      _mm512_sub_ps(_mm512_fmadd_ps(xc, k(1.44269504088896341f), k(12582912.0f)), k(12582912.0f));
  __m512 r = _mm512_fnmadd_ps(n, k(0.693359375f), xc);
  r = _mm512_fmadd_ps(n, k(2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(k(1.9875691500e-4f), r, k(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, k(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, k(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, k(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, k(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), k(1.0f));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
  __m512 y = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  y = _mm512_mask_blend_ps(below, y, _mm512_setzero_ps());
  y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, k(kHi), _CMP_GT_OQ), y,
                           k(std::numeric_limits<float>::infinity()));
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), y, x);
}
CSTORCH_INTRINSICS_END
#endif

#if CSTORCH_AVX2_KERNELS
CSTORCH_INTRINSICS_BEGIN
// vexp on 8 lanes for the AVX2 variant: vexp16's operations one for one (min, compares and
// blends for the scalar form's selects, the same FMAs), so bitwise the scalar form as GCC
// compiles it with FMA (CpuVariants.Avx2VectorMathIsBitwiseTheScalarForms).
[[gnu::always_inline]] inline __m256 vexp8(__m256 x) {
  const auto k = [](float v) { return _mm256_set1_ps(v); };
  constexpr float kHi = 88.3762626647949f, kLo = -87.3365447504019f;
  __m256 xc = _mm256_min_ps(k(kHi), x);  // kHi < x ? kHi : x (a NaN stays)
  const __m256 below = _mm256_cmp_ps(x, k(kLo), _CMP_LT_OQ);
  xc = _mm256_blendv_ps(xc, _mm256_setzero_ps(), below);  // 0 below the range, as vexp
  const __m256 n =
      _mm256_sub_ps(_mm256_fmadd_ps(xc, k(1.44269504088896341f), k(12582912.0f)), k(12582912.0f));
  __m256 r = _mm256_fnmadd_ps(n, k(0.693359375f), xc);
  r = _mm256_fmadd_ps(n, k(2.12194440e-4f), r);
  __m256 p = _mm256_fmadd_ps(k(1.9875691500e-4f), r, k(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, k(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, k(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, k(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, k(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), k(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  __m256 y = _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), below);
  y = _mm256_blendv_ps(y, k(std::numeric_limits<float>::infinity()),
                       _mm256_cmp_ps(x, k(kHi), _CMP_GT_OQ));
  return _mm256_blendv_ps(y, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
// The lanes below `left` (1..8) of a masked load or store.
[[gnu::always_inline]] inline __m256i lanes8(int64_t left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(left)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
CSTORCH_INTRINSICS_END
#endif

// o[i] = vexp(x[i] - shift) for i < n, bitwise the scalar forms (x - shift rounded, then vexp);
// o may be x. The softmax, log-softmax and attention kernels take their exps here, a chunk of a
// row at a time. Over a long array GCC's vectorised loop of vexp is as fast (0.38 ns an element
// on one Zen 4 core, in L1), but over 512-element chunks it made a log-softmax row of 50304
// 0.79 ns an element against 0.51 with this straight code and its one masked tail
// (CpuVariants.VectorExpIsBitwiseTheScalarOneInEveryVariant checks the bits).
inline void vexp_n(const float* x, float* o, int64_t n, float shift = 0.0f) {
#if CSTORCH_AVX512_KERNELS
  const __m512 s = _mm512_set1_ps(shift);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(o + i, vexp16(_mm512_sub_ps(_mm512_loadu_ps(x + i), s)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(o + i, m, vexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), s)));
  }
#elif CSTORCH_AVX2_KERNELS
  const __m256 s = _mm256_set1_ps(shift);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(o + i, vexp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s)));
  if (i < n) {
    const __m256i m = lanes8(n - i);
    _mm256_maskstore_ps(o + i, m, vexp8(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), s)));
  }
#else
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = vexp(x[i] - shift);
#endif
}

}  // namespace cstorch::cpu
