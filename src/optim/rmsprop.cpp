// RMSprop, as torch.optim.RMSprop: v = a*v + (1-a)*g^2; centered: ga = a*ga + (1-a)*g and
// avg = sqrt(v - ga^2) + eps, else avg = sqrt(v) + eps; momentum: buf = m*buf + g/avg,
// p -= lr*buf; else p -= lr*g/avg (g includes wd*p).
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

RMSprop::RMSprop(std::vector<Tensor> params, double lr, double alpha, double eps,
                 double weight_decay, double momentum, bool centered, bool maximize)
    : Optimizer(std::move(params),
                {{"lr", lr},
                 {"alpha", alpha},
                 {"eps", eps},
                 {"weight_decay", weight_decay},
                 {"momentum", momentum},
                 {"centered", centered ? 1.0 : 0.0},
                 {"maximize", maximize ? 1.0 : 0.0}},
                /*enable_global_step=*/true) {
  check_nonneg("RMSprop", "alpha", alpha);
  check_nonneg("RMSprop", "eps", eps);
  check_nonneg("RMSprop", "weight_decay", weight_decay);
  check_nonneg("RMSprop", "momentum", momentum);
}

void RMSprop::preinitialize() {
  for (auto& g : param_groups())
    for (auto& p : g.params) {
      create_state(p, "square_avg", zeros_like(p));
      if (option(g, "momentum") > 0) create_state(p, "momentum_buffer", zeros_like(p));
      if (option(g, "centered") != 0) create_state(p, "grad_avg", zeros_like(p));
    }
}

void RMSprop::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double a = option(g, "alpha"), eps = option(g, "eps"), mom = option(g, "momentum");
    bool centered = option(g, "centered") != 0, maximize = option(g, "maximize") != 0;
    bool wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    Tensor neg_lr = -g.lr;
    for (auto& p : g.params) {
      Tensor grad = grad_of(p, maximize);
      if (!grad.defined()) continue;
      increment_global_step(p);  // a count only (torch's "step"); no update reads it
      if (wd) grad = addcmul(grad, p, wdt);
      Tensor& v = state(p, "square_avg");
      v.copy_(ema_sq(v, grad, a));
      Tensor avg;
      if (centered) {
        Tensor& ga = state(p, "grad_avg");
        ga.copy_(ema(ga, grad, a));
        avg = sqrt(addcmul(v, ga, ga, -1.0)) + eps;
      } else {
        avg = sqrt(v) + eps;
      }
      if (mom > 0) {
        Tensor& buf = state(p, "momentum_buffer");
        buf.copy_(buf * mom + grad / avg);
        p.copy_(addcmul(p, buf, neg_lr));
      } else {
        p.copy_(addcmul(p, grad / avg, neg_lr));
      }
    }
  }
}

Optimizer::Layout RMSprop::layout() const {
  Layout l = Optimizer::layout();
  l.integer_step = true;
  return l;
}

}  // namespace cstorch::optim
