// Adamax, as torch.optim.Adamax: t += 1; m = b1*m + (1-b1)*g; u = max(b2*u, |g| + eps);
// p -= lr / (1 - b1^t) * m / u (g includes wd*p).
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

Adamax::Adamax(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
               double weight_decay, bool maximize)
    : Optimizer(std::move(params),
                {{"lr", lr},
                 {"beta1", beta1},
                 {"beta2", beta2},
                 {"eps", eps},
                 {"weight_decay", weight_decay},
                 {"maximize", maximize ? 1.0 : 0.0}},
                /*enable_global_step=*/true) {
  check_beta("Adamax", "beta1", beta1);
  check_beta("Adamax", "beta2", beta2);
  check_nonneg("Adamax", "eps", eps);
  check_nonneg("Adamax", "weight_decay", weight_decay);
}

void Adamax::preinitialize() {
  create_zero_states({"exp_avg", "exp_inf"});
}

void Adamax::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double b1 = option(g, "beta1"), b2 = option(g, "beta2"), eps = option(g, "eps");
    bool maximize = option(g, "maximize") != 0, wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    for (auto& p : g.params) {
      Tensor grad = grad_of(p, maximize);
      if (!grad.defined()) continue;
      Tensor t = increment_global_step(p);
      if (wd) grad = addcmul(grad, p, wdt);
      Tensor& m = state(p, "exp_avg");
      Tensor& u = state(p, "exp_inf");
      m.copy_(ema(m, grad, b1));
      u.copy_(maximum(u * b2, abs(grad) + eps));
      p.copy_(addcmul(p, m / u, -(g.lr / one_minus_pow(b1, t))));
    }
  }
}

}  // namespace cstorch::optim
