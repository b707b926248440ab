// AdamW, as torch.optim.AdamW: p *= 1 - lr*wd; m = lerp(m, g, 1-b1); v = b2*v + (1-b2)*g^2;
// p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps), with max(v) under amsgrad. The
// step count t is a state tensor, so bias corrections are computed in the compiled step.
#include "core/internal.h"
#include "cstorch/optim/optimizer.h"

namespace cstorch::optim {

AdamW::AdamW(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
             double weight_decay, bool amsgrad, bool maximize)
    : Optimizer(std::move(params), {{"lr", lr},
                                    {"beta1", beta1},
                                    {"beta2", beta2},
                                    {"eps", eps},
                                    {"weight_decay", weight_decay},
                                    {"amsgrad", amsgrad ? 1.0 : 0.0},
                                    {"maximize", maximize ? 1.0 : 0.0}}) {
  CS_CHECK(beta1 >= 0 && beta1 < 1, "AdamW: invalid beta1 {} (must be in [0, 1))", beta1);
  CS_CHECK(beta2 >= 0 && beta2 < 1, "AdamW: invalid beta2 {} (must be in [0, 1))", beta2);
  CS_CHECK(eps >= 0, "AdamW: invalid eps {}", eps);
  CS_CHECK(weight_decay >= 0, "AdamW: invalid weight_decay {}", weight_decay);
}

void AdamW::preinitialize() {
  for (auto& g : param_groups())
    for (auto& p : g.params) {
      create_state(p, "step", zeros({}, DType::f32));
      create_state(p, "exp_avg", zeros_like(p));
      create_state(p, "exp_avg_sq", zeros_like(p));
      if (option(g, "amsgrad") != 0) create_state(p, "max_exp_avg_sq", zeros_like(p));
    }
}

void AdamW::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double b1 = option(g, "beta1"), b2 = option(g, "beta2"), eps = option(g, "eps");
    double wd = option(g, "weight_decay");
    bool amsgrad = option(g, "amsgrad") != 0, maximize = option(g, "maximize") != 0;
    for (auto& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (maximize) grad = -grad;
      Tensor& t = state(p, "step");
      Tensor& m = state(p, "exp_avg");
      Tensor& v = state(p, "exp_avg_sq");
      Tensor c1 = scalar_tensor(1 - b1, DType::f32);
      t.copy_(t + 1.0);
      if (wd != 0) p.copy_(p * (1.0 - g.lr * wd));
      // torch's lerp for weight < 0.5: m + w * (g - m)
      m.copy_(addcmul(m, grad - m, c1));
      v.copy_(addcmul(v * b2, grad, grad * (1 - b2)));  // b2*v + (1-b2)*g*g, as torch's addcmul_
      Tensor bc1 = 1.0 - pow(b1, t);
      Tensor bc2_sqrt = sqrt(1.0 - pow(b2, t));
      Tensor vv = v;
      if (amsgrad) {
        Tensor& mx = state(p, "max_exp_avg_sq");
        mx.copy_(maximum(mx, v));
        vv = mx;
      }
      Tensor denom = sqrt(vv) / bc2_sqrt + eps;
      p.copy_(addcmul(p, m / denom, -(g.lr / bc1)));  // torch's addcdiv_(m, denom, -step_size)
    }
  }
}

}  // namespace cstorch::optim
