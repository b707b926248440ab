// Adam and AdamW, as torch.optim.Adam / AdamW: t += 1; Adam adds wd*p to the gradient, AdamW
// decays p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2 (max(v) under amsgrad);
// p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps). The step count t is a state
// tensor, so the bias corrections are computed in the compiled step.
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

Adam::Adam(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
           double weight_decay, bool amsgrad, bool maximize)
    : Adam(std::move(params), lr, beta1, beta2, eps, weight_decay, amsgrad, maximize, false) {}

Adam::Adam(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
           double weight_decay, bool amsgrad, bool maximize, bool decoupled)
    : Optimizer(std::move(params),
                {{"lr", lr},
                 {"beta1", beta1},
                 {"beta2", beta2},
                 {"eps", eps},
                 {"weight_decay", weight_decay},
                 {"amsgrad", amsgrad ? 1.0 : 0.0},
                 {"maximize", maximize ? 1.0 : 0.0}},
                /*enable_global_step=*/true),
      decoupled_(decoupled) {
  const char* n = decoupled ? "AdamW" : "Adam";
  check_beta(n, "beta1", beta1);
  check_beta(n, "beta2", beta2);
  check_nonneg(n, "eps", eps);
  check_nonneg(n, "weight_decay", weight_decay);
}

AdamW::AdamW(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
             double weight_decay, bool amsgrad, bool maximize)
    : Adam(std::move(params), lr, beta1, beta2, eps, weight_decay, amsgrad, maximize, true) {}

void Adam::preinitialize() {
  for (auto& g : param_groups())
    for (auto& p : g.params) {
      create_state(p, "exp_avg", zeros_like(p));
      create_state(p, "exp_avg_sq", zeros_like(p));
      if (option(g, "amsgrad") != 0) create_state(p, "max_exp_avg_sq", zeros_like(p));
    }
}

void Adam::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double b1 = option(g, "beta1"), b2 = option(g, "beta2"), eps = option(g, "eps");
    bool amsgrad = option(g, "amsgrad") != 0, maximize = option(g, "maximize") != 0;
    bool wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    for (auto& p : g.params) {
      Tensor grad = grad_of(p, maximize);
      if (!grad.defined()) continue;
      Tensor t = increment_global_step(p);
      Tensor& m = state(p, "exp_avg");
      Tensor& v = state(p, "exp_avg_sq");
      if (wd) {
        if (decoupled_)
          p.copy_(p * (1.0 - g.lr * wdt));
        else
          grad = addcmul(grad, p, wdt);
      }
      m.copy_(ema(m, grad, b1));
      v.copy_(ema_sq(v, grad, b2));
      Tensor vv = v;
      if (amsgrad) {
        Tensor& mx = state(p, "max_exp_avg_sq");
        mx.copy_(maximum(mx, v));
        vv = mx;
      }
      Tensor denom = sqrt(vv) / sqrt(one_minus_pow(b2, t)) + eps;
      p.copy_(addcmul(p, m / denom, -(g.lr / one_minus_pow(b1, t))));
    }
  }
}

}  // namespace cstorch::optim
