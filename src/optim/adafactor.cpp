// Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory
// Cost", Algorithms 4 and 5 with update clipping and relative step sizes), in the form of the
// widely used reference implementations:
//   t += 1; rho = relative_step ? min(warmup_init ? 1e-6 t : 1e-2, 1/sqrt(t)) : lr;
//   a = scale_parameter ? max(eps2, RMS(p)) * rho : rho; b2 = 1 - t^decay_rate;
//   G = g^2 + eps1; rank >= 2: R = b2 R + (1-b2) mean_last(G), C = b2 C + (1-b2) mean_2nd_last(G),
//   V = (R / mean(R)) outer C; else V = b2 V + (1-b2) G;
//   U = g / sqrt(V); U /= max(1, RMS(U) / d); U *= a; beta1: m = b1 m + (1-b1) U, U = m;
//   p -= wd * a * p; p -= U.
#include "optim/common.h"

namespace cstorch::optim {
using namespace impl;

namespace {
Tensor rms(const Tensor& x) {
  return norm(x) / std::sqrt(static_cast<double>(std::max<int64_t>(x.numel(), 1)));
}
}  // namespace

Adafactor::Adafactor(std::vector<Tensor> params, std::optional<double> lr, double eps1, double eps2,
                     double clip_threshold, double decay_rate, std::optional<double> beta1,
                     double weight_decay, bool scale_parameter, bool relative_step,
                     bool warmup_init)
    : Optimizer(std::move(params),
                {{"lr", lr.value_or(0.0)},
                 {"eps1", eps1},
                 {"eps2", eps2},
                 {"clip_threshold", clip_threshold},
                 {"decay_rate", decay_rate},
                 {"beta1", beta1.value_or(-1.0)},
                 {"weight_decay", weight_decay},
                 {"scale_parameter", scale_parameter ? 1.0 : 0.0},
                 {"relative_step", relative_step ? 1.0 : 0.0},
                 {"warmup_init", warmup_init ? 1.0 : 0.0}},
                /*enable_global_step=*/true) {
  CS_CHECK(!(lr && relative_step),
           "Adafactor: a learning rate and relative_step=true are mutually exclusive (relative "
           "steps compute their own rate); pass relative_step=false to use lr={}",
           *lr);
  CS_CHECK(lr || relative_step, "Adafactor: relative_step=false needs a learning rate 'lr'");
  CS_CHECK(!warmup_init || relative_step, "Adafactor: warmup_init=true needs relative_step=true");
  CS_CHECK(!beta1 || (*beta1 >= 0 && *beta1 < 1), "Adafactor: invalid beta1 {}", beta1.value_or(0));
  check_nonneg("Adafactor", "weight_decay", weight_decay);
  CS_CHECK(clip_threshold > 0, "Adafactor: invalid clip_threshold {} (must be > 0)",
           clip_threshold);
}

std::vector<std::string> Adafactor::schedulable_keys() const {
  const auto& groups = param_groups();
  if (!groups.empty() && groups[0].options.count("relative_step") &&
      groups[0].options.at("relative_step") != 0)
    return {"weight_decay"};
  return Optimizer::schedulable_keys();
}

void Adafactor::preinitialize() {
  for (auto& g : param_groups())
    for (auto& p : g.params) {
      if (option(g, "beta1") >= 0) create_state(p, "exp_avg", zeros_like(p));
      if (p.dim() >= 2) {
        Shape row(p.shape().begin(), p.shape().end() - 1);
        Shape col(p.shape().begin(), p.shape().end() - 2);
        col.push_back(p.shape().back());
        create_state(p, "exp_avg_sq_row", zeros(row, p.dtype(), p.device()));
        create_state(p, "exp_avg_sq_col", zeros(col, p.dtype(), p.device()));
      } else {
        create_state(p, "exp_avg_sq", zeros_like(p));
      }
    }
}

void Adafactor::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double eps1 = option(g, "eps1"), eps2 = option(g, "eps2");
    double clip = option(g, "clip_threshold"), decay = option(g, "decay_rate");
    double b1 = option(g, "beta1");
    bool scale_parameter = option(g, "scale_parameter") != 0;
    bool relative = option(g, "relative_step") != 0, warmup = option(g, "warmup_init") != 0;
    bool wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    for (auto& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      Tensor t = increment_global_step(p);
      Tensor rho = g.lr;
      if (relative) {
        Tensor min_step = warmup ? t * 1e-6 : scalar_tensor(1e-2);
        rho = minimum(min_step, rsqrt(t));
      }
      Tensor a = scale_parameter ? maximum(rms(p), scalar_tensor(eps2)) * rho : rho;
      Tensor b2 = 1.0 - pow(t, decay);
      Tensor sq = grad * grad + eps1;
      Tensor u;
      if (p.dim() >= 2) {
        Tensor& r = state(p, "exp_avg_sq_row");
        Tensor& c = state(p, "exp_avg_sq_col");
        r.copy_(addcmul(r * b2, mean(sq, {-1}), 1.0 - b2));
        c.copy_(addcmul(c * b2, mean(sq, {-2}), 1.0 - b2));
        Tensor rf = rsqrt(r / mean(r, {-1}, true)).unsqueeze(-1);
        Tensor cf = rsqrt(c.unsqueeze(-2));
        u = rf * cf * grad;
      } else {
        Tensor& v = state(p, "exp_avg_sq");
        v.copy_(addcmul(v * b2, sq, 1.0 - b2));
        u = rsqrt(v) * grad;
      }
      u = u / maximum(rms(u) / clip, ones({}, DType::f32));
      u = u * a;
      if (b1 >= 0) {
        Tensor& m = state(p, "exp_avg");
        m.copy_(ema(m, u, b1));
        u = m;
      }
      Tensor np = p;
      if (wd) np = addcmul(np, np, -(wdt * a));
      p.copy_(np - u);
    }
  }
}

}  // namespace cstorch::optim
