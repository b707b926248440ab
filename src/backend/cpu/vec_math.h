// Float math written branch-free so loops that call it vectorise (the std:: versions do not).
#pragma once
#include <bit>
#include <cstdint>
#include <limits>

namespace cstorch::cpu {

// exp(x) for float, written branch-free so loops using it vectorise (std::exp does not):
// Cephes' expf, 2^n * p(r) with r = x - n ln2, |r| <= ln2 / 2; max relative error ~1e-7.
// Exact 0 below the float range, inf above, NaN kept.
inline float vexp(float x) {
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

}  // namespace cstorch::cpu
