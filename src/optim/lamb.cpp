// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning", Algorithm 2):
// m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; r = (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)
// + wd*p; p -= lr * phi(||p||) / ||r|| * r with phi the identity, and a trust ratio of 1 when
// either norm is 0 (a where(), not a branch).
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

Lamb::Lamb(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
           double weight_decay, bool adam)
    : Optimizer(std::move(params),
                {{"lr", lr},
                 {"beta1", beta1},
                 {"beta2", beta2},
                 {"eps", eps},
                 {"weight_decay", weight_decay},
                 {"adam", adam ? 1.0 : 0.0}},
                /*enable_global_step=*/true) {
  check_beta("Lamb", "beta1", beta1);
  check_beta("Lamb", "beta2", beta2);
  check_nonneg("Lamb", "eps", eps);
  check_nonneg("Lamb", "weight_decay", weight_decay);
}

void Lamb::preinitialize() {
  create_zero_states({"exp_avg", "exp_avg_sq"});
}

void Lamb::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double b1 = option(g, "beta1"), b2 = option(g, "beta2"), eps = option(g, "eps");
    bool adam = option(g, "adam") != 0, wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    for (auto& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      Tensor t = increment_global_step(p);
      Tensor& m = state(p, "exp_avg");
      Tensor& v = state(p, "exp_avg_sq");
      m.copy_(ema(m, grad, b1));
      v.copy_(ema_sq(v, grad, b2));
      Tensor r = (m / one_minus_pow(b1, t)) / (sqrt(v / one_minus_pow(b2, t)) + eps);
      if (wd) r = addcmul(r, p, wdt);
      Tensor scale = g.lr;
      if (!adam) {
        Tensor wn = norm(p), rn = norm(r);
        Tensor ok = logical_and(wn > 0.0, rn > 0.0);
        scale = g.lr * where(ok, wn / where(ok, rn, 1.0), 1.0);
      }
      p.copy_(addcmul(p, r, -scale));
    }
  }
}

}  // namespace cstorch::optim
