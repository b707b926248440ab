// Adadelta, as torch.optim.Adadelta: v = rho*v + (1-rho)*g^2; d = sqrt(u + eps)/sqrt(v + eps)*g;
// u = rho*u + (1-rho)*d^2; p -= lr*d (g includes wd*p).
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

Adadelta::Adadelta(std::vector<Tensor> params, double lr, double rho, double eps,
                   double weight_decay, bool maximize)
    : Optimizer(std::move(params),
                {{"lr", lr},
                 {"rho", rho},
                 {"eps", eps},
                 {"weight_decay", weight_decay},
                 {"maximize", maximize ? 1.0 : 0.0}},
                /*enable_global_step=*/true) {
  CS_CHECK(rho >= 0 && rho <= 1, "Adadelta: invalid rho {} (must be in [0, 1])", rho);
  check_nonneg("Adadelta", "eps", eps);
  check_nonneg("Adadelta", "weight_decay", weight_decay);
}

void Adadelta::preinitialize() {
  create_zero_states({"square_avg", "acc_delta"});
}

void Adadelta::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double rho = option(g, "rho"), eps = option(g, "eps");
    bool maximize = option(g, "maximize") != 0, wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    Tensor neg_lr = -g.lr;
    for (auto& p : g.params) {
      Tensor grad = grad_of(p, maximize);
      if (!grad.defined()) continue;
      increment_global_step(p);  // a count only (torch's "step"); no update reads it
      if (wd) grad = addcmul(grad, p, wdt);
      Tensor& v = state(p, "square_avg");
      Tensor& u = state(p, "acc_delta");
      v.copy_(ema_sq(v, grad, rho));
      Tensor delta = sqrt(u + eps) / sqrt(v + eps) * grad;
      u.copy_(ema_sq(u, delta, rho));
      p.copy_(addcmul(p, delta, neg_lr));
    }
  }
}

Optimizer::Layout Adadelta::layout() const {
  Layout l = Optimizer::layout();
  l.integer_step = true;
  return l;
}

}  // namespace cstorch::optim
