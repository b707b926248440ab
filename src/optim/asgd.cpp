// Averaged SGD, as torch.optim.ASGD: t += 1; p *= 1 - lambd*eta; p -= eta*g; ax = mu == 1 ? p :
// ax + (p - ax)*mu; eta = lr / (1 + lambd*lr*t)^alpha; mu = 1 / max(1, t - t0). eta and mu are
// state tensors computed in the step (torch computes them on the host).
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

ASGD::ASGD(std::vector<Tensor> params, double lr, double lambd, double alpha, double t0,
           double weight_decay, bool maximize)
    : Optimizer(std::move(params),
                {{"lr", lr},
                 {"lambd", lambd},
                 {"alpha", alpha},
                 {"t0", t0},
                 {"weight_decay", weight_decay},
                 {"maximize", maximize ? 1.0 : 0.0}},
                /*enable_global_step=*/true) {
  check_nonneg("ASGD", "weight_decay", weight_decay);
}

void ASGD::preinitialize() {
  for (auto& g : param_groups())
    for (auto& p : g.params) {
      create_state(p, "eta", g.lr);
      create_state(p, "mu", ones({}, DType::f32));
      create_state(p, "ax", zeros_like(p));
    }
}

void ASGD::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double lambd = option(g, "lambd"), alpha = option(g, "alpha"), t0 = option(g, "t0");
    bool maximize = option(g, "maximize") != 0, wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    for (auto& p : g.params) {
      Tensor grad = grad_of(p, maximize);
      if (!grad.defined()) continue;
      Tensor t = increment_global_step(p);
      if (wd) grad = addcmul(grad, p, wdt);
      Tensor& eta = state(p, "eta");
      Tensor& mu = state(p, "mu");
      Tensor& ax = state(p, "ax");
      Tensor np = p * (1.0 - eta * lambd);
      np = addcmul(np, grad, -eta);
      p.copy_(np);
      ax.copy_(where(mu == 1.0, np, ax + (np - ax) * mu));
      eta.copy_(g.lr / pow(g.lr * (lambd * t) + 1.0, alpha));
      mu.copy_(1.0 / maximum(t - t0, ones({}, DType::f32)));
    }
  }
}

}  // namespace cstorch::optim
