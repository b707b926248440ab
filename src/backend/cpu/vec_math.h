// Float math written branch-free so loops that call it vectorise (the std:: versions do not).
#pragma once
#include <bit>
#include <cstdint>
#include <limits>

namespace cstorch::cpu {

// exp(x) for float, written branch-free so loops using it vectorise (std::exp does not):
// Cephes' expf, 2^n * p(r) with r = x - n ln2, |r| <= ln2 / 2; max relative error ~1e-7.
// Exact 0 below the float range, inf above, NaN kept.
[[gnu::always_inline]] inline float vexp(float x) {
  constexpr float kHi = 88.3762626647949f, kLo = -87.3365447504019f;
  float xc = x > kHi ? kHi : x;
  xc = xc < kLo ? kLo : xc;
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

}  // namespace cstorch::cpu
