// SGD, as torch.optim.SGD: d = g (+ wd*p); buf = m*buf + (1-dampening)*d (buf = d on the first
// step); d = nesterov ? d + m*buf : buf; p -= lr*d. The first-step rule needs no branch:
// with dampening 0 a zero-initialised buffer gives buf = d exactly; with dampening != 0 a
// per-parameter "initialized" flag selects it with where().
#include "optim/common.h"

namespace cstorch::optim {

SGD::SGD(std::vector<Tensor> params, double lr, double momentum, double dampening,
         double weight_decay, bool nesterov, bool maximize)
    : Optimizer(std::move(params), {{"lr", lr},
                                    {"momentum", momentum},
                                    {"dampening", dampening},
                                    {"weight_decay", weight_decay},
                                    {"nesterov", nesterov ? 1.0 : 0.0},
                                    {"maximize", maximize ? 1.0 : 0.0}}) {
  impl::check_nonneg("SGD", "momentum", momentum);
  impl::check_nonneg("SGD", "weight_decay", weight_decay);
  // torch puts no bound on dampening; an infinite one still turns the buffer into NaN.
  CS_CHECK(std::isfinite(dampening), "SGD: invalid dampening {} (must be finite)", dampening);
  CS_CHECK(!nesterov || (momentum > 0 && dampening == 0),
           "SGD: Nesterov momentum requires a momentum and zero dampening");
}

void SGD::preinitialize() {
  for (auto& g : param_groups()) {
    if (option(g, "momentum") == 0) continue;
    for (auto& p : g.params) {
      create_state(p, "momentum_buffer", zeros_like(p));
      if (option(g, "dampening") != 0) create_state(p, "initialized", zeros({}, p.dtype()));
    }
  }
}

void SGD::step() {
  ensure_initialized();
  NoGradGuard ng;
  for (auto& g : param_groups()) {
    double momentum = option(g, "momentum"), dampening = option(g, "dampening");
    bool wd = active(g, "weight_decay");
    Tensor wdt = wd ? hyper(g, "weight_decay") : Tensor();
    bool nesterov = option(g, "nesterov") != 0, maximize = option(g, "maximize") != 0;
    Tensor neg_lr = -g.lr;  // once per group; every update is then one fused kernel
    Tensor mom = momentum != 0 ? scalar_tensor(momentum, DType::f32) : Tensor();
    for (auto& p : g.params) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      Tensor d = maximize ? -grad : grad;
      if (wd) d = addcmul(d, p, wdt);
      if (momentum != 0) {
        Tensor& buf = state(p, "momentum_buffer");
        Tensor nb;
        if (dampening == 0) {
          nb = addcmul(d, buf, mom);
        } else {
          Tensor& init = state(p, "initialized");
          nb = where(init > 0.5, addcmul(d * (1 - dampening), buf, mom), d);
          init.fill_(1);
        }
        buf.copy_(nb);
        d = nesterov ? addcmul(d, nb, mom) : nb;
      }
      p.copy_(addcmul(p, d, neg_lr));  // p + d * (-lr), as torch's p.add_(d, alpha=-lr)
    }
  }
}

void SGD::state_to_dict(const ParamGroup&, State& ps) const {
  if (!ps.contains("initialized")) return;
  if (ps.at("initialized").as_tensor().item<float>() == 0) ps.erase("momentum_buffer");
  ps.erase("initialized");
}

State SGD::state_from_dict(const ParamGroup& g, const State& ps) const {
  State r = ps;
  if (g.options.at("momentum") == 0 || g.options.at("dampening") == 0 || r.contains("initialized"))
    return r;  // no flag here, or cstorch's own layout (the flag is in the dict)
  bool has_buffer = r.contains("momentum_buffer") && !r.at("momentum_buffer").is_none();
  r.set("initialized", has_buffer ? 1.0 : 0.0);
  return r;
}

}  // namespace cstorch::optim
