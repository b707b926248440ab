// Helpers shared by the optimizer implementations (internal).
#pragma once
#include <cmath>
#include <limits>
#include <string_view>

#include "core/internal.h"
#include "cstorch/optim/optimizer.h"

namespace cstorch::optim::impl {

// 1 - b^t for a step tensor t, as -expm1(t * ln b): accurate to a few f32 ulps even when b^t
// is close to 1 (1 - 0.999^1 computed as 1 - f32(0.999) would be off by 1.3e-5 relative).
inline Tensor one_minus_pow(double b, const Tensor& t) {
  if (b == 0) return ones_like(t);
  return -expm1(t * std::log(b));
}

// b^t for b > 0 and a step tensor t.
inline Tensor pow_of(double b, const Tensor& t) {
  if (b == 0) return zeros_like(t);
  return exp(t * std::log(b));
}

// The gradient to use (negated for maximize); undefined when the parameter has none.
inline Tensor grad_of(const Tensor& p, bool maximize) {
  Tensor g = p.grad();
  if (g.defined() && maximize) g = -g;
  return g;
}

// torch's mul_(b).add_(x, alpha=1-b) for a running average.
inline Tensor ema(const Tensor& avg, const Tensor& x, double b) {
  return addcmul(avg * b, x, scalar_tensor(1 - b, avg.dtype()));
}
// torch's mul_(b).addcmul_(x, x, value=1-b).
inline Tensor ema_sq(const Tensor& avg, const Tensor& x, double b) {
  return addcmul(avg * b, x, x * (1 - b));
}

inline void check_beta(const char* opt, const char* name, double b) {
  CS_CHECK(b >= 0 && b < 1, "{}: invalid {} {} (must be in [0, 1))", opt, name, b);
}
// A rate or other non-negative hyper-parameter: NaN fails the comparison, and infinity fails
// too (it passes `>= 0` and turns the first step's parameters into NaN without a word). The
// step computes in f32, so finite means finite there: a double above f32's largest value
// (about 3.4e38) would become infinity in the step just the same.
inline bool nonneg_finite(double v) {
  return v >= 0 && v <= std::numeric_limits<float>::max();
}
// The rule a value nonneg_finite refused broke, for its message.
inline std::string_view nonneg_rule(double v) {
  return std::isfinite(v) && v > 0 ? "must be >= 0 and finite as f32, at most 3.4028235e+38"
                                   : "must be >= 0 and finite";
}
inline void check_nonneg(std::string_view opt, std::string_view name, double v) {
  CS_CHECK(nonneg_finite(v), "{}: invalid {} {} ({})", opt, name, v, nonneg_rule(v));
}

}  // namespace cstorch::optim::impl
