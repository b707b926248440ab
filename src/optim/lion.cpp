// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2):
// c = b1*m + (1-b1)*g; p -= lr * (sign(c) + wd*p); m = b2*m + (1-b2)*g.
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

Lion::Lion(std::vector<Tensor> params, double lr, double beta1, double beta2, double weight_decay)
    : Optimizer(std::move(params),
                {{"lr", lr}, {"beta1", beta1}, {"beta2", beta2}, {"weight_decay", weight_decay}}) {
  check_beta("Lion", "beta1", beta1);
  check_beta("Lion", "beta2", beta2);
  check_nonneg("Lion", "weight_decay", weight_decay);
}

void Lion::preinitialize() {
  create_zero_states({"exp_avg"});
}

void Lion::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double b1 = option(g, "beta1"), b2 = option(g, "beta2");
    bool wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    for (auto& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      Tensor& m = state(p, "exp_avg");
      Tensor c = ema(m, grad, b1);
      Tensor u = sign(c);
      if (wd) u = addcmul(u, p, wdt);
      p.copy_(addcmul(p, u, -g.lr));
      m.copy_(ema(m, grad, b2));
    }
  }
}

}  // namespace cstorch::optim
