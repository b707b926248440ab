// Gradient clipping by global norm and by value (torch.nn.utils.clip_grad_norm_ /
// clip_grad_value_), with tensor ops only so it traces into the compiled step.
#include <cmath>

#include "core/internal.h"
#include "cstorch/amp.h"

namespace cstorch::amp {

namespace {
std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> r;
  for (const auto& p : params) {
    CS_CHECK(p.defined(), "gradient clipping: a parameter is undefined");
    if (p.grad().defined()) r.push_back(p.grad());
  }
  return r;
}
}  // namespace

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  CS_CHECK(max_norm >= 0 && !std::isnan(max_norm), "clip_grad_norm_: max_norm must be >= 0, got {}",
           max_norm);
  CS_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be > 0 (or infinity), got {}",
           norm_type);
  NoGradGuard ng;
  auto grads = grads_of(params);
  if (grads.empty()) return zeros({}, DType::f32);
  std::vector<Tensor> norms;
  bool inf = std::isinf(norm_type);
  for (auto& g : grads) {
    Tensor gf = cast(g, DType::f32);
    norms.push_back(inf ? amax(abs(gf)) : norm(gf, norm_type));
  }
  Tensor all = stack(norms);
  Tensor total = inf ? amax(all) : norm(all, norm_type);
  Tensor coef = minimum(max_norm / (total + 1e-6), ones({}, DType::f32));
  for (auto& g : grads) g.mul_(cast(coef, g.dtype()));
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip_value) {
  CS_CHECK(clip_value >= 0 && !std::isnan(clip_value),
           "clip_grad_value_: clip_value must be >= 0, got {}", clip_value);
  NoGradGuard ng;
  for (auto& g : grads_of(params)) g.copy_(clamp(g, -clip_value, clip_value));
}

}  // namespace cstorch::amp
