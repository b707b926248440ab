// Per-element float formulas shared by the elementwise kernels (elementwise.cpp) and the fused
// kernel (fused.cpp), so a fused chain computes exactly what the separate kernels compute.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

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

}  // namespace cstorch::cpu
