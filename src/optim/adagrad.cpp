// Adagrad, as torch.optim.Adagrad: t += 1; s += g^2; p -= lr / (1 + (t-1)*lr_decay) * g /
// (sqrt(s) + eps) (g includes wd*p).
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

Adagrad::Adagrad(std::vector<Tensor> params, double lr, double lr_decay, double weight_decay,
                 double initial_accumulator_value, double eps, bool maximize)
    : Optimizer(std::move(params),
                {{"lr", lr},
                 {"lr_decay", lr_decay},
                 {"weight_decay", weight_decay},
                 {"initial_accumulator_value", initial_accumulator_value},
                 {"eps", eps},
                 {"maximize", maximize ? 1.0 : 0.0}},
                /*enable_global_step=*/true) {
  check_nonneg("Adagrad", "lr_decay", lr_decay);
  check_nonneg("Adagrad", "weight_decay", weight_decay);
  check_nonneg("Adagrad", "initial_accumulator_value", initial_accumulator_value);
  check_nonneg("Adagrad", "eps", eps);
}

void Adagrad::preinitialize() {
  for (auto& g : param_groups())
    for (auto& p : g.params)
      create_state(p, "sum", full_like(p, option(g, "initial_accumulator_value")));
}

void Adagrad::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double lr_decay = option(g, "lr_decay"), eps = option(g, "eps");
    bool maximize = option(g, "maximize") != 0, wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    for (auto& p : g.params) {
      Tensor grad = grad_of(p, maximize);
      if (!grad.defined()) continue;
      Tensor t = increment_global_step(p);
      if (wd) grad = addcmul(grad, p, wdt);
      Tensor& s = state(p, "sum");
      s.copy_(addcmul(s, grad, grad));
      Tensor clr = g.lr / ((t - 1.0) * lr_decay + 1.0);
      p.copy_(addcmul(p, grad / (sqrt(s) + eps), -clr));
    }
  }
}

}  // namespace cstorch::optim
