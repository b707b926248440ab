// Per-element f32 formulas of the elementwise ops, the Fused program interpreter's per-element
// step and the random draws' per-element values, written as __host__ __device__ functions: the
// kernels (fused.cu, random.cu) run them on the GPU, and a host program can run the same code
// to compare it with the CPU's kernels (src/backend/cpu/elementwise_math.h, fused.cpp,
// random.cpp) without a GPU. C++17, no CUDA header needed (see launch.h).
//
// Rounding: each formula is the CPU's, with the CPU's contractions. GCC builds the CPU's x86-64-v3
// and v4 kernels with -ffp-contract=fast and fuses some products into the addition that follows
// (addcmul's a + b * c, gelu's x + k x^3, ...) but not others; nvcc would contract as it sees
// fit (and ptxas again). So the arithmetic here is spelled out: fmul / fadd / fsub (never fused)
// and ffma exactly where the CPU's v4 build fuses, as found by running both (its x86-64 baseline
// build, without FMA, rounds twice there and differs in the last bit). Division and sqrtf are
// IEEE (nvcc's default -prec-div / -prec-sqrt). Transcendentals (expf, logf, tanhf, erff, powf,
// cosf) are the CUDA library's, within a few ulps of the CPU's.
#pragma once
#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels/half.cuh"
#include "backend/cuda/kernels/host_device.h"
#include "backend/cuda/kernels/random_fused_launch.h"
#include "backend/philox.h"

namespace cstorch::cuda::k {

using rng::PhiloxBlock;
using rng::PhiloxStream;

// ---- IEEE single operations, each rounded once ----
CS_HD inline float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;  // a host build of this header must use -ffp-contract=off
#endif
}
CS_HD inline float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
CS_HD inline float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
// a * b + c, rounded once.
CS_HD inline float ffma(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The transcendental functions the formulas call. The kernels use this one; a host comparison
// may pass its own (the formulas take the library as a template parameter), e.g. the CPU's
// branch-free exp and tanh, which the CPU uses inside gelu and its gradient, to check the
// arithmetic around them bit for bit.
struct CudaMath {
  static CS_HD float exp(float x) { return expf(x); }
  static CS_HD float log(float x) { return logf(x); }
  static CS_HD float tanh(float x) { return tanhf(x); }
  static CS_HD float erf(float x) { return erff(x); }
  static CS_HD float pow(float x, float y) { return powf(x, y); }
  static CS_HD float cos(float x) { return cosf(x); }
  // Inside gelu's tanh form and the erf form's gradient (pdf).
  static CS_HD float gelu_tanh(float x) { return tanhf(x); }
  static CS_HD float gelu_exp(float x) { return expf(x); }
};

// maximum / minimum propagate NaN (as common.cuh's max_nan / min_nan, which are device-only).
CS_HD inline float max_nan_hd(float x, float y) {
  if (x != x) return x;
  if (y != y) return y;
  return x > y ? x : y;
}
CS_HD inline float min_nan_hd(float x, float y) {
  if (x != x) return x;
  if (y != y) return y;
  return x < y ? x : y;
}

CS_HD inline bool truthy(float x) {
  return x != 0.0f;
}
CS_HD inline float as_f32(bool b) {
  return b ? 1.0f : 0.0f;
}

// PyTorch's gelu constants, rounded to float from the same double expressions as the CPU's
// (glibc's M_SQRT1_2, M_SQRT2 and M_2_SQRTPI), so each is the CPU's float.
constexpr double kM_SQRT1_2 = 0.70710678118654752440, kM_SQRT2 = 1.41421356237309504880,
                 kM_2_SQRTPI = 1.12837916709551257390;
constexpr float kSqrt1_2 = static_cast<float>(kM_SQRT1_2);
constexpr float kGeluBeta = static_cast<float>(kM_SQRT2 * kM_2_SQRTPI * 0.5);  // sqrt(2 / pi)
constexpr float kGeluKappa = 0.044715f;
constexpr float kGeluPdf = static_cast<float>(kM_2_SQRTPI * kM_SQRT1_2 * 0.5);  // 1 / sqrt(2 pi)
constexpr float k3GeluKappa = 3.0f * kGeluKappa;

template <class M>
CS_HD inline float sigmoid_f(float x) {
  return 1.0f / fadd(1.0f, M::exp(-x));
}
template <class M>
CS_HD inline float silu_f(float x) {
  return x / fadd(1.0f, M::exp(-x));
}
CS_HD inline float rsqrt_f(float x) {
  return 1.0f / sqrtf(x);  // not rsqrtf: that one is approximate
}
CS_HD inline float relu_grad_f(float g, float y) {
  return y <= 0.0f ? 0.0f : g;
}

// gelu, erf form: x * 0.5 * (1 + erf(x / sqrt(2))).
template <class M>
CS_HD inline float gelu_erf(float x) {
  return fmul(fmul(x, 0.5f), fadd(1.0f, M::erf(fmul(x, kSqrt1_2))));
}
// gelu, tanh form: 0.5 x (1 + tanh(beta (x + kappa x^3))); x + (kappa x x) x is one fma.
template <class M>
CS_HD inline float gelu_tanh(float x) {
  const float inner = fmul(kGeluBeta, ffma(fmul(fmul(kGeluKappa, x), x), x, x));
  return fmul(fmul(0.5f, x), fadd(1.0f, M::gelu_tanh(inner)));
}
// dy * gelu'(x), erf form: dy * (cdf + x pdf), the sum one fma.
template <class M>
CS_HD inline float gelu_erf_grad(float dy, float x) {
  const float cdf = fmul(0.5f, fadd(1.0f, M::erf(fmul(x, kSqrt1_2))));
  const float pdf = fmul(kGeluPdf, M::gelu_exp(fmul(fmul(-0.5f, x), x)));
  return fmul(dy, ffma(x, pdf, cdf));
}
// dy * gelu'(x), tanh form by the product rule on 0.5 x * (1 + t). Where the CPU fuses here
// was measured on its x86-64-v4 build (GCC 12), not read off the source: x + kappa x^3 and
// 1 + 3 kappa x^2 are fused; 1 - t^2 and left_d + left * right_d are not.
template <class M>
CS_HD inline float gelu_tanh_grad(float dy, float x) {
  const float x2 = fmul(x, x);
  const float inner = fmul(kGeluBeta, ffma(fmul(kGeluKappa, x2), x, x));
  const float t = M::gelu_tanh(inner);
  const float left = fmul(0.5f, x);
  const float right = fadd(1.0f, t);
  const float left_d = fmul(0.5f, right);
  const float right_d = fmul(fmul(fsub(1.0f, fmul(t, t)), kGeluBeta), ffma(k3GeluKappa, x2, 1.0f));
  return fmul(dy, fadd(left_d, fmul(left, right_d)));
}

// pow: with `exact_forms` (one exponent for the whole tensor), the CPU's (PyTorch's) exact forms
// of common exponents; otherwise the library's powf.
template <class M>
CS_HD inline float pow_f(float x, float e, bool exact_forms) {
  if (exact_forms) {
    if (e == 2.0f) return fmul(x, x);
    if (e == 3.0f) return fmul(fmul(x, x), x);
    if (e == 1.0f) return x;
    if (e == 0.5f) return sqrtf(x);
    if (e == -0.5f) return 1.0f / sqrtf(x);
    if (e == -1.0f) return 1.0f / x;
    if (e == -2.0f) return 1.0f / fmul(x, x);
  }
  return M::pow(x, e);
}

// One instruction of a Fused program on register values a, b, c (the unused ones ignored):
// the CPU interpreter's per-instruction semantics (src/backend/cpu/fused.cpp). Bool values are
// 0 / 1 (any nonzero is true).
template <class M>
CS_HD inline float fused_apply(FOp op, bool flag, float a, float b, float c) {
  switch (op) {
    case FOp::Neg:
      return -a;
    case FOp::Abs:
      return fabsf(a);
    case FOp::Exp:
      return M::exp(a);
    case FOp::Log:
      return M::log(a);
    case FOp::Sqrt:
      return sqrtf(a);
    case FOp::Rsqrt:
      return rsqrt_f(a);
    case FOp::Reciprocal:
      return 1.0f / a;
    case FOp::Tanh:
      return M::tanh(a);
    case FOp::Sigmoid:
      return sigmoid_f<M>(a);
    case FOp::Relu:
      return a < 0.0f ? 0.0f : a;  // keeps NaN
    case FOp::Gelu:
      return flag ? gelu_tanh<M>(a) : gelu_erf<M>(a);
    case FOp::Silu:
      return silu_f<M>(a);
    case FOp::Erf:
      return M::erf(a);
    case FOp::Copy:
      return a;
    case FOp::Cast:
      return flag ? as_f32(truthy(a)) : a;
    case FOp::LogicalNot:
      return as_f32(!truthy(a));
    case FOp::Add:
      return fadd(a, b);
    case FOp::Sub:
      return fsub(a, b);
    case FOp::Mul:
      return fmul(a, b);
    case FOp::Div:
      return a / b;
    case FOp::Pow:
      return pow_f<M>(a, b, flag);
    case FOp::Maximum:
      return max_nan_hd(a, b);
    case FOp::Minimum:
      return min_nan_hd(a, b);
    case FOp::Eq:
      return as_f32(a == b);
    case FOp::Ne:
      return as_f32(a != b);
    case FOp::Lt:
      return as_f32(a < b);
    case FOp::Le:
      return as_f32(a <= b);
    case FOp::Gt:
      return as_f32(a > b);
    case FOp::Ge:
      return as_f32(a >= b);
    case FOp::LogicalAnd:
      return as_f32(truthy(a) && truthy(b));
    case FOp::LogicalOr:
      return as_f32(truthy(a) || truthy(b));
    case FOp::LogicalXor:
      return as_f32(truthy(a) != truthy(b));
    case FOp::Where:
      return truthy(a) ? b : c;
    case FOp::Addcmul:
      return ffma(b, c, a);  // a + b * c, fused as on the CPU
    case FOp::ReluGrad:
      return relu_grad_f(a, b);
    case FOp::GeluGrad:
      return flag ? gelu_tanh_grad<M>(a, b) : gelu_erf_grad<M>(a, b);
    case FOp::kCount:
      break;
  }
  return a;  // not reached: fused_plan.cpp admits only the ops above
}

// The Fused kernel's unit of work: the program's values at L consecutive output elements i0 ..
// i0 + cnt - 1 of n (L = 1 or kFusedLanes, cnt <= L): input r is read at element (i / div) % mod
// into register r, then each instruction writes the next register; an element's value does not
// depend on L (the same operations in the same order). Each input's index is computed once for
// the group and then stepped element by element (no division per element), and each
// instruction reads and writes its registers for the whole group at once
// (a register's lanes are contiguous and aligned; the registers are a per-thread array in local
// memory). Writes res[0, cnt). Below 2^31 elements (every input broadcasts to the output, so its
// offsets are too) the first index is computed in 32-bit arithmetic, several times cheaper than
// 64-bit division on the GPU; the values are the same. Groups of 4 measured
// faster on an H200 for short programs over large outputs and slower for long ones (AdamW's
// parameter update) and small outputs (fewer threads): fused_lanes picks.
constexpr int kFusedLanes = 4;
template <class M, int L>
CS_HD inline void fused_elements(const FusedProgram& p, int64_t i0, int cnt, int64_t n,
                                 float (&res)[L]) {
  alignas(16) float r[kFusedRegs][L];
  const bool small = n <= 0x7fffffff;
  for (int k = 0; k < p.ninputs; ++k) {
    const int64_t d = p.div[k], m = p.mod[k];
    // Element i reads index q = (i / d) % m; c = i % d. From i0's, each next element steps c
    // and carries into q, wrapping at m (where d * m == n, q < m anyway).
    int64_t q = 0, c = 0;
    if (m != 1) {
      if (small) {
        const uint32_t ii = static_cast<uint32_t>(i0), dd = static_cast<uint32_t>(d);
        uint32_t qq = d == 1 ? ii : ii / dd;
        c = d == 1 ? 0 : ii - qq * dd;
        if (d * m != n) qq %= static_cast<uint32_t>(m);
        q = qq;
      } else {
        q = d == 1 ? i0 : i0 / d;
        c = d == 1 ? 0 : i0 - q * d;
        if (d * m != n) q %= m;
      }
    }
    const bool is_bool = (p.bool_inputs >> k) & 1u, is_bf16 = (p.bf16_inputs >> k) & 1u;
    for (int e = 0; e < L; ++e) {
      if (e < cnt)
        r[k][e] = is_bool   ? as_f32(static_cast<const uint8_t*>(p.in[k])[q] != 0)
                  : is_bf16 ? load(static_cast<const bf16*>(p.in[k])[q])
                            : static_cast<const float*>(p.in[k])[q];
      else
        r[k][e] = 0.0f;  // past the end: computed, never stored
      if (m != 1 && ++c == d) {
        c = 0;
        if (++q == m) q = 0;
      }
    }
  }
  for (int k = 0; k < p.ncode; ++k) {
    const FusedIns& s = p.code[k];
    float a[L], b[L], cc[L], o[L];
    for (int e = 0; e < L; ++e) {
      a[e] = r[s.args[0]][e];
      b[e] = r[s.args[1]][e];
      cc[e] = r[s.args[2]][e];
    }
    for (int e = 0; e < L; ++e) o[e] = fused_apply<M>(s.op, s.flag != 0, a[e], b[e], cc[e]);
    for (int e = 0; e < L; ++e) r[p.ninputs + k][e] = o[e];
  }
  for (int e = 0; e < L; ++e) res[e] = r[p.ninputs + p.ncode - 1][e];
}

// The group size the Fused kernel uses for a program: kFusedLanes for programs of at most 9
// registers over at least 2^16 elements, else 1.
CS_HD inline int fused_lanes(const FusedProgram& p, int64_t n) {
  return n >= (int64_t{1} << 16) && p.ninputs + p.ncode <= 9 ? kFusedLanes : 1;
}

// ---- random draws: element i's value from its Philox block (random.cpp's formulas) ----

// 2^-24: a 24-bit integer times this is exact in float and < 1.
constexpr float k2Pow24Inv = 1.0f / 16777216.0f;
constexpr float kTwoPi = static_cast<float>(2.0 * 3.14159265358979323846);

// low + range * u, u = (top 24 bits of the first word) * 2^-24; the CPU fuses the last step.
CS_HD inline float uniform_value(const PhiloxBlock& r, float low, float range) {
  const float u = fmul(static_cast<float>(r.w[0] >> 8), k2Pow24Inv);
  return ffma(range, u, low);
}
// mean + stdev * z, z = sqrt(-2 log u1) cos(2 pi u2) (Box-Muller) on the first two words; u1 in
// (0, 1] keeps the log finite. The CPU fuses the last step.
template <class M>
CS_HD inline float normal_value(const PhiloxBlock& r, float mean, float stdev) {
  const float u1 = fmul(static_cast<float>((r.w[0] >> 8) + 1), k2Pow24Inv);
  const float u2 = fmul(static_cast<float>(r.w[1] >> 8), k2Pow24Inv);
  const float z = fmul(sqrtf(fmul(-2.0f, M::log(u1))), M::cos(fmul(kTwoPi, u2)));
  return ffma(stdev, z, mean);
}
// Whether the draw is 1 (see bernoulli_threshold).
CS_HD inline bool bernoulli_value(const PhiloxBlock& r, uint32_t threshold) {
  return (r.w[0] >> 8) < threshold;
}

}  // namespace cstorch::cuda::k
