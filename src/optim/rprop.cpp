// Rprop, as torch.optim.Rprop: s = sign(g * prev); step_size = clamp(step_size * (s > 0 ? eta+ :
// s < 0 ? eta- : 1), min, max); g = s < 0 ? 0 : g; p -= sign(g) * step_size; prev = g.
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

Rprop::Rprop(std::vector<Tensor> params, double lr, double etaminus, double etaplus,
             double step_size_min, double step_size_max, bool maximize)
    : Optimizer(std::move(params),
                {{"lr", lr},
                 {"etaminus", etaminus},
                 {"etaplus", etaplus},
                 {"step_size_min", step_size_min},
                 {"step_size_max", step_size_max},
                 {"maximize", maximize ? 1.0 : 0.0}},
                /*enable_global_step=*/true) {
  CS_CHECK(0 < etaminus && etaminus < 1 && etaplus > 1,
           "Rprop: invalid eta values ({}, {}): need 0 < etaminus < 1 < etaplus", etaminus,
           etaplus);
}

void Rprop::preinitialize() {
  for (auto& g : param_groups())
    for (auto& p : g.params) {
      create_state(p, "prev", zeros_like(p));
      create_state(p, "step_size", full_like(p, g.options.at("lr")));
    }
}

void Rprop::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double em = option(g, "etaminus"), ep = option(g, "etaplus");
    double lo = option(g, "step_size_min"), hi = option(g, "step_size_max");
    bool maximize = option(g, "maximize") != 0;
    for (auto& p : g.params) {
      Tensor grad = grad_of(p, maximize);
      if (!grad.defined()) continue;
      increment_global_step(p);  // a count only (torch's "step"); no update reads it
      Tensor& prev = state(p, "prev");
      Tensor& ss = state(p, "step_size");
      Tensor s = sign(grad * prev);
      Tensor factor = where(s > 0.0, scalar_tensor(ep), where(s < 0.0, scalar_tensor(em), 1.0));
      ss.copy_(clamp(ss * factor, lo, hi));
      Tensor g2 = where(s < 0.0, 0.0, grad);
      p.copy_(addcmul(p, sign(g2), ss, -1.0));
      prev.copy_(g2);
    }
  }
}

Optimizer::Layout Rprop::layout() const {
  Layout l = Optimizer::layout();
  l.integer_step = true;
  return l;
}

}  // namespace cstorch::optim
