// Per-element float formulas shared by the elementwise kernels (elementwise.cpp) and the fused
// kernel (fused.cpp), so a fused chain computes exactly what the separate kernels compute.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "backend/cpu/isa.h"
#include "backend/cpu/vec_math.h"

namespace cstorch::cpu {

// The bf16 bits of the f32 with bits v, as bf16_t rounds (to nearest even, a NaN kept a quiet
// NaN), without a branch so that loops of it vectorise.
inline uint16_t bf16_bits_of(uint32_t v) {
  const uint32_t rounded = (v + 0x7fffu + ((v >> 16) & 1u)) >> 16;
  const uint32_t nan = (v >> 16) | 0x40u;
  return static_cast<uint16_t>((v & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// Runs of n values between bf16 bits and f32 as bit operations that vectorise (bf16_t's element
// conversions round the same way but stay scalar), on the calling thread: the whole-array casts
// split them over the team, the 16-bit elementwise chunks and the bf16 products call them as is.
inline void bf16_bits_to_f32(const uint16_t* x, float* o, int64_t n) {
  uint32_t* u = reinterpret_cast<uint32_t*>(o);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) u[i] = static_cast<uint32_t>(x[i]) << 16;
}
inline void f32_to_bf16_bits(const float* x, uint16_t* o, int64_t n) {
  const uint32_t* u = reinterpret_cast<const uint32_t*>(x);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = bf16_bits_of(u[i]);
}
// x <- x rounded to bf16, kept as f32 (exact).
inline void round_f32_to_bf16(float* x, int64_t n) {
  uint32_t* u = reinterpret_cast<uint32_t*>(x);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) u[i] = static_cast<uint32_t>(bf16_bits_of(u[i])) << 16;
}

// maximum/minimum propagate nan like PyTorch.
template <class C>
inline C max_nan(C x, C y) {
  if constexpr (std::is_floating_point_v<C>) {
    if (x != x) return x;
    if (y != y) return y;
  }
  return x > y ? x : y;
}
template <class C>
inline C min_nan(C x, C y) {
  if constexpr (std::is_floating_point_v<C>) {
    if (x != x) return x;
    if (y != y) return y;
  }
  return x < y ? x : y;
}

inline float rsqrt_f(float x) {
  return 1.0f / std::sqrt(x);
}
inline float sigmoid_f(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}
inline float silu_f(float x) {
  return x / (1.0f + std::exp(-x));
}
// threshold_backward: the gradient where the relu output y is positive (y <= 0 gives 0).
inline float relu_grad_f(float g, float y) {
  return y <= 0.0f ? 0.0f : g;
}

// pow with one exponent `e` for a whole tensor: PyTorch's exact cheaper forms for common
// exponents. Calls run(f) with the per-element form and returns true, or returns false (use
// std::pow).
template <class Run>
inline bool pow_exact_form(float e, Run&& run) {
  if (e == 2.0f) return run([](float x) { return x * x; }), true;
  if (e == 3.0f) return run([](float x) { return x * x * x; }), true;
  if (e == 1.0f) return run([](float x) { return x; }), true;
  if (e == 0.5f) return run([](float x) { return std::sqrt(x); }), true;
  if (e == -0.5f) return run([](float x) { return 1.0f / std::sqrt(x); }), true;
  if (e == -1.0f) return run([](float x) { return 1.0f / x; }), true;
  if (e == -2.0f) return run([](float x) { return 1.0f / (x * x); }), true;
  return false;
}

// PyTorch's gelu constants.
constexpr float kSqrt1_2 = static_cast<float>(M_SQRT1_2);
constexpr float kGeluBeta = static_cast<float>(M_SQRT2 * M_2_SQRTPI * 0.5);  // sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;
constexpr float kGeluPdf = static_cast<float>(M_2_SQRTPI * M_SQRT1_2 * 0.5);  // 1/sqrt(2pi)

inline float gelu_erf(float x) {
  return x * 0.5f * (1.0f + std::erf(x * kSqrt1_2));
}
[[gnu::always_inline]] inline float gelu_tanh(float x) {
  float inner = kGeluBeta * (x + kGeluKappa * x * x * x);
  return 0.5f * x * (1.0f + vtanh(inner));
}
inline float gelu_erf_grad(float dy, float x) {
  float cdf = 0.5f * (1.0f + std::erf(x * kSqrt1_2));
  float pdf = kGeluPdf * vexp(-0.5f * x * x);
  return dy * (cdf + x * pdf);
}
[[gnu::always_inline]] inline float gelu_tanh_grad(float dy, float x) {
  float x2 = x * x;
  float inner = kGeluBeta * (x + kGeluKappa * x2 * x);
  float t = vtanh(inner);
  float left = 0.5f * x;
  float right = 1.0f + t;
  float left_d = 0.5f * right;
  float right_d = (1.0f - t * t) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * x2);
  return dy * (left_d + left * right_d);
}

// The tanh-form gelu and its gradient over arrays: o[i] = gelu_tanh(x[i]), o[i] =
// gelu_tanh_grad(dy[i], x[i]), i < n. In the AVX-512 variant as straight vector code: GCC 12
// vectorises the scalar forms' selects (vexp's clamps, vtanh's two branches, NaN) into chains of
// mask-register operations, ~75 instructions a vector, 61 cycles; written with min / max and
// blends they take 0.70 ns an element instead of 1.04 (gelu) and 0.82 instead of 1.16 (its
// gradient), one core of a Zen 4. Each is bitwise the scalar form as GCC compiles it in this
// variant, which fuses x + kappa x^3 (and 1 + 3 kappa x^2, and the gradient's
// 0.5 (1 + t) + left * right_d as one FMA, the same value as unfused: 0.5 (1 + t) is exact) but
// not 1 - t^2: compared over all 2^32 inputs (and the gradient at three dy; the CUDA kernels'
// spelled-out formulas, run on the host with this tanh and exp, give the same bits too);
// CpuVariants.GeluIsBitwiseTheSameInEveryVariant keeps checking it
// against the AVX2 variant's scalar loops. The products that must stay unfused use the
// _round_ intrinsics, which GCC does not contract into FMAs (plain _mm512_mul_ps it does).
#if CSTORCH_AVX512_KERNELS
// (CSTORCH_INTRINSICS_BEGIN: see isa.h. The array functions below are kept out of line so the
// diagnostic state covers where this code is compiled.)
CSTORCH_INTRINSICS_BEGIN
namespace gelu_avx512 {
[[gnu::always_inline]] inline __m512 k(float v) {
  return _mm512_set1_ps(v);
}
[[gnu::always_inline]] inline __m512 exp16(__m512 x) {  // vexp
  return vexp16(x);
}
[[gnu::always_inline]] inline __m512 tanh16(__m512 x) {  // vtanh
  const __m512 a = _mm512_abs_ps(x);
  const __m512 e = exp16(_mm512_mul_ps(k(2.0f), _mm512_min_ps(k(20.0f), a)));
  const __m512 big = _mm512_sub_ps(k(1.0f), _mm512_div_ps(k(2.0f), _mm512_add_ps(e, k(1.0f))));
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_fmadd_ps(x2, k(-17.0f / 315), k(2.0f / 15));
  p = _mm512_fmadd_ps(x2, p, k(-1.0f / 3));
  p = _mm512_fmadd_ps(x2, p, k(1.0f));
  const __m512 small = _mm512_mul_ps(a, p);
  __m512 r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, k(0.0625f), _CMP_LT_OQ), big, small);
  r = _mm512_or_ps(r, _mm512_and_ps(x, k(-0.0f)));  // the sign of x
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, x);
}
[[gnu::always_inline]] inline __m512 gelu16(__m512 x) {  // gelu_tanh
  const __m512 inner = _mm512_mul_ps(
      k(kGeluBeta), _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(k(kGeluKappa), x), x), x, x));
  return _mm512_mul_ps(_mm512_mul_ps(k(0.5f), x), _mm512_add_ps(k(1.0f), tanh16(inner)));
}
[[gnu::always_inline]] inline __m512 gelu_grad16(__m512 dy, __m512 x) {  // gelu_tanh_grad
  const __m512 x2 = _mm512_mul_ps(x, x);
  const __m512 inner =
      _mm512_mul_ps(k(kGeluBeta), _mm512_fmadd_ps(_mm512_mul_ps(k(kGeluKappa), x2), x, x));
  const __m512 t = tanh16(inner);
  const __m512 one_minus_t2 =
      _mm512_sub_ps(k(1.0f), _mm512_mul_round_ps(t, t, _MM_FROUND_CUR_DIRECTION));
  const __m512 right_d = _mm512_mul_ps(_mm512_mul_ps(one_minus_t2, k(kGeluBeta)),
                                       _mm512_fmadd_ps(k(3.0f * kGeluKappa), x2, k(1.0f)));
  const __m512 left = _mm512_mul_ps(k(0.5f), x);
  return _mm512_mul_ps(
      dy, _mm512_fmadd_ps(_mm512_add_ps(k(1.0f), t), k(0.5f), _mm512_mul_ps(left, right_d)));
}
}  // namespace gelu_avx512
#endif

#if CSTORCH_AVX2_KERNELS
// The same on 8 lanes for the AVX2 variant, operation for operation (compares and blends for the
// masks; the product t * t, which the scalar form does not fuse into 1 - t^2, passes through an
// empty asm statement so that GCC cannot contract it either): GCC 12 compiles the scalar forms
// there into scalar code with a branch per select, 24 ns an element on one Zen 1 core.
// (CSTORCH_INTRINSICS_BEGIN as above, to the end of the array functions.)
CSTORCH_INTRINSICS_BEGIN
namespace gelu_avx2 {
[[gnu::always_inline]] inline __m256 k(float v) {
  return _mm256_set1_ps(v);
}
[[gnu::always_inline]] inline __m256 tanh8(__m256 x) {  // vtanh
  const __m256 a = _mm256_andnot_ps(k(-0.0f), x);
  const __m256 e = vexp8(_mm256_mul_ps(k(2.0f), _mm256_min_ps(k(20.0f), a)));
  const __m256 big = _mm256_sub_ps(k(1.0f), _mm256_div_ps(k(2.0f), _mm256_add_ps(e, k(1.0f))));
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_fmadd_ps(x2, k(-17.0f / 315), k(2.0f / 15));
  p = _mm256_fmadd_ps(x2, p, k(-1.0f / 3));
  p = _mm256_fmadd_ps(x2, p, k(1.0f));
  const __m256 small = _mm256_mul_ps(a, p);
  __m256 r = _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, k(0.0625f), _CMP_LT_OQ));
  r = _mm256_or_ps(r, _mm256_and_ps(x, k(-0.0f)));  // the sign of x
  return _mm256_blendv_ps(r, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}
[[gnu::always_inline]] inline __m256 gelu8(__m256 x) {  // gelu_tanh
  const __m256 inner = _mm256_mul_ps(
      k(kGeluBeta), _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(k(kGeluKappa), x), x), x, x));
  return _mm256_mul_ps(_mm256_mul_ps(k(0.5f), x), _mm256_add_ps(k(1.0f), tanh8(inner)));
}
[[gnu::always_inline]] inline __m256 gelu_grad8(__m256 dy, __m256 x) {  // gelu_tanh_grad
  const __m256 x2 = _mm256_mul_ps(x, x);
  const __m256 inner =
      _mm256_mul_ps(k(kGeluBeta), _mm256_fmadd_ps(_mm256_mul_ps(k(kGeluKappa), x2), x, x));
  const __m256 t = tanh8(inner);
  __m256 t2 = _mm256_mul_ps(t, t);
  asm("" : "+x"(t2));  // keeps 1 - t * t unfused
  const __m256 one_minus_t2 = _mm256_sub_ps(k(1.0f), t2);
  const __m256 right_d = _mm256_mul_ps(_mm256_mul_ps(one_minus_t2, k(kGeluBeta)),
                                       _mm256_fmadd_ps(k(3.0f * kGeluKappa), x2, k(1.0f)));
  const __m256 left = _mm256_mul_ps(k(0.5f), x);
  return _mm256_mul_ps(
      dy, _mm256_fmadd_ps(_mm256_add_ps(k(1.0f), t), k(0.5f), _mm256_mul_ps(left, right_d)));
}
}  // namespace gelu_avx2
#endif

[[gnu::noinline]] inline void gelu_tanh_n(const float* x, float* o, int64_t n) {
#if CSTORCH_AVX512_KERNELS
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(o + i, gelu_avx512::gelu16(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(o + i, m, gelu_avx512::gelu16(_mm512_maskz_loadu_ps(m, x + i)));
  }
#elif CSTORCH_AVX2_KERNELS
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, gelu_avx2::gelu8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = lanes8(n - i);
    _mm256_maskstore_ps(o + i, m, gelu_avx2::gelu8(_mm256_maskload_ps(x + i, m)));
  }
#else
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = gelu_tanh(x[i]);
#endif
}
[[gnu::noinline]] inline void gelu_tanh_grad_n(const float* dy, const float* x, float* o,
                                               int64_t n) {
#if CSTORCH_AVX512_KERNELS
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(o + i,
                     gelu_avx512::gelu_grad16(_mm512_loadu_ps(dy + i), _mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(o + i, m,
                          gelu_avx512::gelu_grad16(_mm512_maskz_loadu_ps(m, dy + i),
                                                   _mm512_maskz_loadu_ps(m, x + i)));
  }
#elif CSTORCH_AVX2_KERNELS
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(o + i, gelu_avx2::gelu_grad8(_mm256_loadu_ps(dy + i), _mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = lanes8(n - i);
    _mm256_maskstore_ps(
        o + i, m,
        gelu_avx2::gelu_grad8(_mm256_maskload_ps(dy + i, m), _mm256_maskload_ps(x + i, m)));
  }
#else
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) o[i] = gelu_tanh_grad(dy[i], x[i]);
#endif
}
#if CSTORCH_AVX512_KERNELS || CSTORCH_AVX2_KERNELS
CSTORCH_INTRINSICS_END
#endif
// gelu's gradient over arrays in either form: the GeluGrad kernel's per-element functions (the
// kernel, a Fused program's instruction and a GEMM epilogue all call this, so their bits agree).
// o may be dy.
inline void gelu_grad_n(bool tanh_form, const float* dy, const float* x, float* o, int64_t n) {
  if (tanh_form) return gelu_tanh_grad_n(dy, x, o, n);
  for (int64_t i = 0; i < n; ++i) o[i] = gelu_erf_grad(dy[i], x[i]);
}

}  // namespace cstorch::cpu
