// NAdam, as torch.optim.NAdam: mu_t = b1*(1 - 0.5*0.96^(t*psi)); prod *= mu_t;
// m, v as Adam; d = sqrt(v / (1-b2^t)) + eps;
// p -= lr*(1-mu_t)/(1-prod) * g/d + lr*mu_{t+1}/(1-prod*mu_{t+1}) * m/d (g includes wd*p).
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

NAdam::NAdam(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
             double weight_decay, double momentum_decay)
    : Optimizer(std::move(params),
                {{"lr", lr},
                 {"beta1", beta1},
                 {"beta2", beta2},
                 {"eps", eps},
                 {"weight_decay", weight_decay},
                 {"momentum_decay", momentum_decay}},
                /*enable_global_step=*/true) {
  check_beta("NAdam", "beta1", beta1);
  check_beta("NAdam", "beta2", beta2);
  check_nonneg("NAdam", "eps", eps);
  check_nonneg("NAdam", "weight_decay", weight_decay);
  check_nonneg("NAdam", "momentum_decay", momentum_decay);
}

void NAdam::preinitialize() {
  for (auto& g : param_groups())
    for (auto& p : g.params) {
      create_state(p, "mu_product", ones({}, DType::f32));
      create_state(p, "exp_avg", zeros_like(p));
      create_state(p, "exp_avg_sq", zeros_like(p));
    }
}

void NAdam::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double b1 = option(g, "beta1"), b2 = option(g, "beta2"), eps = option(g, "eps");
    double psi = option(g, "momentum_decay");
    bool wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    for (auto& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      Tensor t = increment_global_step(p);
      if (wd) grad = addcmul(grad, p, wdt);
      Tensor& prod = state(p, "mu_product");
      Tensor& m = state(p, "exp_avg");
      Tensor& v = state(p, "exp_avg_sq");
      Tensor mu = (1.0 - 0.5 * pow_of(0.96, t * psi)) * b1;
      Tensor mu_next = (1.0 - 0.5 * pow_of(0.96, (t + 1.0) * psi)) * b1;
      prod.copy_(prod * mu);
      Tensor prod_next = prod * mu * mu_next;
      m.copy_(ema(m, grad, b1));
      v.copy_(ema_sq(v, grad, b2));
      Tensor denom = sqrt(v / one_minus_pow(b2, t)) + eps;
      Tensor np = addcmul(p, grad / denom, -g.lr * (1.0 - mu) / (1.0 - prod));
      p.copy_(addcmul(np, m / denom, -g.lr * mu_next / (1.0 - prod_next)));
    }
  }
}

}  // namespace cstorch::optim
