// GradScaler (static and dynamic loss scaling) and the optimizer_step helper. Every decision
// that depends on gradient values is a where() on 0-d tensors, so a traced step makes it anew
// on every replay.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "core/internal.h"
#include "cstorch/amp.h"
#include "cstorch/distributed.h"
#include "runtime/trace_context.h"

namespace cstorch::amp {

namespace {
std::vector<Tensor> all_params(optim::Optimizer& o) {
  std::vector<Tensor> r;
  for (auto& g : o.param_groups())
    for (auto& p : g.params) r.push_back(p);
  return r;
}
// A copy of t's current value (eager: a new buffer; traced: the current node).
Tensor snapshot(const Tensor& t) {
  return cstorch::detail::dispatch(ir::OpCode::Copy, ir::NoAttrs{}, {t});
}
}  // namespace

GradScaler::GradScaler(std::variant<double, std::string> loss_scale)
    : GradScaler(GradScalerOptions{.loss_scale = std::move(loss_scale)}) {}

// The scale is an f32 value in the step: a double above f32's largest value would be infinity
// there, and every scaled loss with it.
constexpr double kF32Max = std::numeric_limits<float>::max();

GradScaler::GradScaler(GradScalerOptions o) : opt_(std::move(o)) {
  double init = 0;
  if (auto* s = std::get_if<std::string>(&opt_.loss_scale)) {
    CS_CHECK(*s == "dynamic",
             "GradScaler: loss_scale must be \"dynamic\" or a positive number, got \"{}\"", *s);
    dynamic_ = true;
    init = opt_.init_scale;
  } else {
    double v = std::get<double>(opt_.loss_scale);
    CS_CHECK(v >= 0 && v <= kF32Max,
             "GradScaler: a static loss_scale must be a positive number, finite as f32 (or 0.0 "
             "for no loss scaling), got {}",
             v);
    dynamic_ = false;
    enabled_ = v != 0.0;
    init = enabled_ ? v : 1.0;
  }
  CS_CHECK(opt_.init_scale > 0 && opt_.init_scale <= kF32Max,
           "GradScaler: init_scale must be > 0 and finite as f32, got {}", opt_.init_scale);
  CS_CHECK(opt_.steps_per_increase >= 1, "GradScaler: steps_per_increase must be >= 1, got {}",
           opt_.steps_per_increase);
  CS_CHECK(opt_.min_loss_scale > 0 && opt_.min_loss_scale <= opt_.max_loss_scale &&
               opt_.max_loss_scale <= kF32Max,
           "GradScaler: need 0 < min_loss_scale <= max_loss_scale, both finite as f32, got {} "
           "and {}",
           opt_.min_loss_scale, opt_.max_loss_scale);
  // A fraction of the steps since the last change: at 1 or above the scale could never drop.
  CS_CHECK(opt_.overflow_tolerance >= 0 && opt_.overflow_tolerance < 1,
           "GradScaler: overflow_tolerance must be in [0, 1) (the fraction of steps that may "
           "overflow before the scale halves), got {}",
           opt_.overflow_tolerance);
  CS_CHECK(opt_.max_gradient_norm > 0 && std::isfinite(opt_.max_gradient_norm),
           "GradScaler: max_gradient_norm must be > 0, got {}", opt_.max_gradient_norm);
  if (dynamic_ && (init < opt_.min_loss_scale || init > opt_.max_loss_scale)) {
    const double clamped = std::clamp(init, opt_.min_loss_scale, opt_.max_loss_scale);
    // The dynamic scale stays within [min, max]: an initial value outside starts at the bound,
    // said rather than done silently (the run's first steps are not scaled as configured).
    if (distributed::is_main_process())
      std::fprintf(stderr,
                   "warning: GradScaler: init_scale %g is outside [min_loss_scale, "
                   "max_loss_scale] = [%g, %g]; the scale starts at %g\n",
                   init, opt_.min_loss_scale, opt_.max_loss_scale, clamped);
    init = clamped;
  }
  runtime::SuspendTrace eager;
  scale_ = scalar_tensor(init, DType::f32);
  steps_ = scalar_tensor(0, DType::i64);
  overflows_ = scalar_tensor(0, DType::i64);
  skipped_ = scalar_tensor(0, DType::i64);
  scale_.set_name("grad_scaler.loss_scale");
  steps_.set_name("grad_scaler.steps_since_rescale");
  overflows_.set_name("grad_scaler.overflows_since_rescale");
  skipped_.set_name("grad_scaler.num_skipped_steps");
}

Tensor GradScaler::scale(const Tensor& loss) {
  CS_CHECK(loss.defined(), "GradScaler.scale: the loss is undefined");
  if (!enabled_) return loss;
  return loss * cast(scale_, loss.dtype());
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  CS_CHECK(unscaled_ != &optimizer,
           "GradScaler.unscale_: already called for this optimizer since the last update()");
  CS_CHECK(unscaled_ == nullptr,
           "GradScaler.unscale_: another optimizer was unscaled since the last update(); one "
           "GradScaler serves one optimizer per step");
  CS_CHECK(!stepped_, "GradScaler.unscale_: called after step(); call update() first");
  if (!enabled_) {
    unscaled_ = &optimizer;
    return;
  }
  NoGradGuard ng;
  Tensor inv = 1.0 / scale_;
  std::vector<Tensor> norms;
  auto params = all_params(optimizer);
  for (auto& p : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    g.mul_(cast(inv, g.dtype()));
    norms.push_back(sum(cast(g, DType::f32) * cast(g, DType::f32)));
  }
  // Finite iff the global gradient norm is (an inf or NaN anywhere makes the sum non-finite).
  finite_ = norms.empty() ? ones({}, DType::boolean) : isfinite(sum(stack(norms)));
  if (dynamic_ && opt_.global_gradient_clipping) clip_grad_norm_(params, opt_.max_gradient_norm);
  unscaled_ = &optimizer;
}

void GradScaler::step(optim::Optimizer& optimizer) {
  CS_CHECK(!stepped_,
           "GradScaler.step: called twice without update() in between; call "
           "grad_scaler.update() after each step()");
  if (unscaled_ == nullptr) unscale_(optimizer);
  CS_CHECK(unscaled_ == &optimizer,
           "GradScaler.step: a different optimizer was unscaled since the last update()");
  if (!enabled_) {
    optimizer.step();
    stepped_ = true;
    return;
  }
  std::vector<Tensor> live = optimizer.params_and_state();
  std::vector<Tensor> old;
  {
    NoGradGuard ng;
    for (auto& t : live) old.push_back(snapshot(t));
  }
  optimizer.step();
  NoGradGuard ng;
  for (size_t i = 0; i < live.size(); ++i) live[i].copy_(where(finite_, live[i], old[i]));
  Tensor applied = cast(finite_, DType::i64);
  optimizer.step_applied().copy_(applied);
  skipped_.copy_(skipped_ + (1 - applied));
  stepped_ = true;
}

void GradScaler::update() {
  CS_CHECK(stepped_, "GradScaler.update: called without step() since the last update()");
  if (dynamic_) {
    NoGradGuard ng;
    Tensor steps = steps_ + 1;
    Tensor overflows = overflows_ + cast(logical_not(finite_), DType::i64);
    Tensor dec = (cast(overflows, DType::f32) / cast(steps, DType::f32)) > opt_.overflow_tolerance;
    Tensor inc =
        logical_and(logical_not(dec), steps > static_cast<double>(opt_.steps_per_increase));
    Tensor s = where(dec, scale_ * 0.5, where(inc, scale_ * 2.0, scale_));
    Tensor reset = logical_or(dec, inc);
    scale_.copy_(clamp(s, opt_.min_loss_scale, opt_.max_loss_scale));
    steps_.copy_(where(reset, 0.0, steps));
    overflows_.copy_(where(reset, 0.0, overflows));
  }
  stepped_ = false;
  unscaled_ = nullptr;
  finite_ = Tensor();
}

State GradScaler::state_dict() const {
  CS_CHECK(!cstorch::detail::in_trace(),
           "GradScaler.state_dict: called inside a traced step; call it from a step closure or "
           "between steps");
  return State::map({{"loss_scale", static_cast<double>(scale_.item<float>())},
                     {"steps_since_rescale", steps_.item<int64_t>()},
                     {"overflows_since_rescale", overflows_.item<int64_t>()},
                     {"num_skipped_steps", skipped_.item<int64_t>()}});
}

void GradScaler::load_state_dict(const State& sd) {
  static const char* kKeys[] = {"loss_scale", "steps_since_rescale", "overflows_since_rescale",
                                "num_skipped_steps"};
  CS_CHECK(!cstorch::detail::in_trace(), "GradScaler.load_state_dict: called inside a traced step");
  CS_CHECK(sd.is_map(), "GradScaler.load_state_dict: expected a map, got {}", sd.repr());
  for (const auto& k : sd.keys()) {
    bool known = false;
    for (const char* kk : kKeys) known = known || k == kk;
    CS_CHECK(known,
             "GradScaler.load_state_dict: unknown key '{}'; expected loss_scale, "
             "steps_since_rescale, overflows_since_rescale, num_skipped_steps",
             k);
  }
  std::vector<double> v;
  for (const char* k : kKeys) {
    CS_CHECK(sd.contains(k), "GradScaler.load_state_dict: missing key '{}'", k);
    const State& e = sd.at(k);
    if (e.is_tensor()) {
      CS_CHECK(e.as_tensor().numel() == 1, "GradScaler.load_state_dict: '{}' must be one value", k);
      v.push_back(e.as_tensor().item<double>());
    } else {
      CS_CHECK(e.is_number(), "GradScaler.load_state_dict: '{}' must be a number, got {}", k,
               e.repr());
      v.push_back(e.as_double());
    }
  }
  CS_CHECK(v[0] > 0, "GradScaler.load_state_dict: loss_scale must be > 0, got {}", v[0]);
  NoGradGuard ng;
  scale_.fill_(v[0]);
  steps_.fill_(v[1]);
  overflows_.fill_(v[2]);
  skipped_.fill_(v[3]);
}

void optimizer_step(const Tensor& loss, optim::Optimizer& optimizer, GradScaler* grad_scaler,
                    std::optional<double> max_gradient_norm,
                    std::optional<double> max_gradient_value) {
  CS_CHECK(!(max_gradient_norm && max_gradient_value),
           "optimizer_step: max_gradient_norm and max_gradient_value are mutually exclusive; "
           "give at most one");
  if (grad_scaler) {
    grad_scaler->scale(loss).backward();
    grad_scaler->unscale_(optimizer);
  } else {
    loss.backward();
  }
  auto params = all_params(optimizer);
  if (max_gradient_norm) clip_grad_norm_(params, *max_gradient_norm);
  if (max_gradient_value) clip_grad_value_(params, *max_gradient_value);
  if (grad_scaler) {
    grad_scaler->step(optimizer);
    grad_scaler->update();
  } else {
    optimizer.step();
  }
}

}  // namespace cstorch::amp
