// LRScheduler base (step counting, writing the driven group value, state) and the built-in
// closed-form schedules. See include/cstorch/optim/lr_scheduler.h for the formulas.
#include "cstorch/optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include <fmt/ranges.h>

#include "core/internal.h"
#include "core/warn_once.h"
#include "cstorch/distributed.h"
#include "optim/common.h"
#include "runtime/trace_context.h"

namespace cstorch::optim::lr_scheduler {

namespace {

Tensor num(double v) {
  return scalar_tensor(v, DType::f32);
}

// b^k for a tensor k holding exact values (integers, or s/T): pow(f32(b), k) * (1 + k*delta)
// with delta = b / f32(b) - 1, which removes the error of rounding b to f32 (k * 6e-8 relative
// otherwise: 6e-5 after 1000 steps of ExponentialLR(0.99)).
Tensor pow_exact(double b, const Tensor& k) {
  float bf = static_cast<float>(b);
  if (b <= 0 || bf == b) return pow(num(b), k);
  double delta = b / static_cast<double>(bf) - 1;
  return pow(num(b), k) * (k * delta + 1.0);
}

// a * (1 + cos(pi x)) / 2 + b * (1 - cos(pi x)) / 2 with x = num / den (den > 0), i.e.
// a cos^2(pi x / 2) + b sin^2(pi x / 2): the cosine schedules written as a sum of two
// non-negative terms, so no value is the small difference of two large ones (1 + cos(x) near
// x = pi, or end + (start - end) * ... near the end). cos(pi x / 2) is taken as sin(pi (den -
// num) / (2 den)) in the second half (and sin likewise) so each factor keeps its relative
// accuracy; `rest` = den - num is given separately so callers can compute it exactly.
Tensor cos_mix(double a, double b, const Tensor& numer, const Tensor& den, const Tensor& rest) {
  Tensor x = numer * M_PI / (den * 2.0), y = rest * M_PI / (den * 2.0);
  Tensor first = numer * 2.0 <= den;
  Tensor c = where(first, cos(x), sin(y));
  Tensor s = where(first, sin(x), cos(y));
  return (c * c) * a + (s * s) * b;
}

// a * f + b * (1 - f) with f = rest / den and 1 - f = numer / den (numer + rest = den), for
// linear interpolation without cancellation.
Tensor lin_mix(double a, double b, const Tensor& numer, const Tensor& rest, double den) {
  return (rest / den) * a + (numer / den) * b;
}

// A schedule's length, checked before it reaches the LRScheduler base (which checks it too, for
// schedulers written by users) so that the error names the scheduler and the argument the user
// gave, e.g. T_max, not the base's total_iters.
std::optional<int64_t> checked_length(std::optional<int64_t> n, const char* scheduler,
                                      const char* argument) {
  CS_CHECK(!n || *n > 0, "{}: invalid {} {} (must be > 0)", scheduler, argument, n.value_or(0));
  return n;
}

// Checks of the numeric arguments, naming the scheduler and the argument as the user gave it.
// NaN fails every comparison and infinity is refused too, as the optimizers refuse them for a
// learning rate: an infinite rate (or factor) turns the parameters into NaN at the first step
// that uses it, without a word.
void check_finite(const char* scheduler, const std::string& argument, double v) {
  CS_CHECK(std::isfinite(v), "{}: invalid {} {} (must be finite)", scheduler, argument, v);
}
using optim::impl::check_nonneg;
void check_positive(const char* scheduler, const std::string& argument, double v) {
  CS_CHECK(v > 0 && std::isfinite(v), "{}: invalid {} {} (must be > 0 and finite)", scheduler,
           argument, v);
}

// The error for a computed value that is not finite as f32, naming the scheduler, the driven
// key and the step (`context` adds how far a check looked).
[[noreturn]] void refuse_value(const std::string& scheduler, const std::string& key, int64_t step,
                               double v, std::string_view context) {
  cstorch::fail("{}: the computed {} at step {} is {}, not a finite number{}", scheduler, key, step,
                v, context);
}

// Whether every part of a SequentialLR / ChainedLR computes element by element.
bool all_elementwise(const std::vector<SchedulerPtr>& parts) {
  return std::all_of(parts.begin(), parts.end(), [](auto& c) { return c->elementwise(); });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Base.

LRScheduler::LRScheduler(Target target, std::optional<int64_t> total_iters, int64_t last_epoch)
    : target_(std::move(target)), total_iters_(total_iters), last_epoch_(last_epoch) {
  CS_CHECK(target_.optimizer, "LRScheduler: no optimizer given");
  CS_CHECK(last_epoch >= -1, "LRScheduler: invalid last_epoch {} (must be >= -1)", last_epoch);
  CS_CHECK(!total_iters || *total_iters > 0, "LRScheduler: invalid total_iters {} (must be > 0)",
           total_iters.value_or(0));
  // A scheduler writes one value to every parameter group, so values the groups were given
  // apart are not kept (PyTorch's schedulers scale each group's own): said once for each
  // optimizer and key, as a program that gives groups their own rates means them.
  std::vector<double> given;
  for (const auto& g : target_.optimizer->param_groups())
    if (auto it = g.options.find(target_.key); it != g.options.end()) given.push_back(it->second);
  if (std::adjacent_find(given.begin(), given.end(), std::not_equal_to<>()) != given.end() &&
      distributed::is_main_process())
    cstorch::detail::warn_once(
        fmt::format("scheduler {} {}", static_cast<const void*>(target_.optimizer), target_.key),
        fmt::format("a scheduler of {} on an optimizer whose {} parameter groups have different "
                    "values ({:g}): it sets one value for every group, so the groups' own values "
                    "are not kept",
                    target_.key, target_.optimizer->param_groups().size(), fmt::join(given, ", ")));
  // The key must be schedulable: make it tensor-held now, before any step is traced.
  for (size_t g = 0; g < target_.optimizer->param_groups().size(); ++g)
    target_.optimizer->hyper_tensor(g, target_.key);
  runtime::SuspendTrace eager;
  step_ = scalar_tensor(static_cast<double>(last_epoch + 1), DType::i64);
  step_.set_name("lr_scheduler.last_epoch");
  hook_ = target_.optimizer->add_start_hook([this] {
    hook_ = -1;
    start();
  });
}

LRScheduler::~LRScheduler() {
  if (hook_ >= 0) target_.optimizer->remove_start_hook(hook_);
}

double LRScheduler::initial_value() const {
  runtime::SuspendTrace eager;
  NoGradGuard ng;
  return closed_form_lr(num(0)).item<float>();
}

// Checked where the value is computed eagerly anyway (start(), load_state_dict()): finite
// arguments can still give a value that is not finite as f32, such as a product of two large
// factors (a rate argument above f32's range is refused as an argument, check_nonneg) or a
// growing schedule restored at a step past its overflow. step() is not checked: inside a traced
// step the value is computed on the device at every replay, and reading it back would stall
// every step.
void LRScheduler::check_value(const Tensor& value, int64_t step) const {
  const double v = value.item<float>();
  if (!std::isfinite(v)) refuse_value(name(), target_.key, step, v, "");
}

void LRScheduler::check_steps(int64_t steps) const {
  CS_CHECK(!detail::in_trace(), "{}: check_steps() inside a traced step", name());
  if (steps <= 0 || !owner_.empty()) return;
  runtime::SuspendTrace eager;
  NoGradGuard ng;
  const int64_t first = step_.item<int64_t>() + 1, last = first + steps - 1;
  const std::string through = fmt::format(
      " (the schedule's values were checked through step {}, where this run ends)", last);
  const auto refuse = [&](int64_t s, double v) {
    refuse_value(name(), target_.key, s, v, through);
  };
  // Steps in f32, as the traced step computes them: exact up to 2^24.
  constexpr int64_t kExact = int64_t{1} << 24, kBlock = int64_t{1} << 20;
  if (elementwise()) {
    for (int64_t b = first; b <= std::min(last, kExact); b += kBlock) {
      const int64_t e = std::min({b + kBlock - 1, last, kExact});
      const Tensor v = closed_form_lr(
          arange(static_cast<double>(b), static_cast<double>(e + 1), 1.0, DType::f32));
      CS_CHECK(v.numel() == e - b + 1 && v.dtype() == DType::f32,
               "{}: internal: closed_form_lr of {} steps gave {} values of {}", name(), e - b + 1,
               v.numel(), dtype_name(v.dtype()));
      const std::vector<float> x = v.to_vector<float>();
      for (size_t i = 0; i < x.size(); ++i)
        if (!std::isfinite(x[i])) refuse(b + static_cast<int64_t>(i), x[i]);
    }
    if (last <= kExact) return;
  }
  const double v =
      closed_form_lr(cast(scalar_tensor(static_cast<double>(last), DType::i64), DType::f32))
          .item<float>();
  if (!std::isfinite(v)) refuse(last, v);
}

void LRScheduler::write(const Tensor& value) {
  Optimizer& o = *target_.optimizer;
  for (size_t g = 0; g < o.param_groups().size(); ++g) o.hyper_tensor(g, target_.key).copy_(value);
}

void LRScheduler::start() {
  if (started_) return;
  started_ = true;
  if (hook_ >= 0) {
    target_.optimizer->remove_start_hook(hook_);
    hook_ = -1;
  }
  if (!owner_.empty()) return;
  runtime::SuspendTrace eager;
  NoGradGuard ng;
  Tensor value = closed_form_lr(cast(step_, DType::f32));
  check_value(value, last_epoch_ + 1);
  write(value);
}

void LRScheduler::step() {
  CS_CHECK(owner_.empty(), "{}: this scheduler is part of a {}; call step() on the {} instead",
           name(), owner_, owner_);
  start();
  NoGradGuard ng;
  step_.copy_(step_ + target_.optimizer->step_applied());
  write(closed_form_lr(cast(step_, DType::f32)));
}

void LRScheduler::make_nested(const std::string& owner) {
  owner_ = owner;
  started_ = true;
  if (hook_ >= 0) {
    target_.optimizer->remove_start_hook(hook_);
    hook_ = -1;
  }
}

Tensor LRScheduler::last_lr() {
  start();
  return target_.optimizer->hyper_tensor(0, target_.key);
}

std::vector<double> LRScheduler::get_last_lr() {
  start();
  std::vector<double> r;
  Optimizer& o = *target_.optimizer;
  for (size_t g = 0; g < o.param_groups().size(); ++g)
    r.push_back(o.hyper_tensor(g, target_.key).item<float>());
  return r;
}

State LRScheduler::state_dict() {
  CS_CHECK(!detail::in_trace(),
           "{}: state_dict() inside a traced step; call it from a step "
           "closure or between steps",
           name());
  start();
  State lrs = State::list();
  for (double v : get_last_lr()) lrs.push_back(v);
  return State::map({{"last_epoch", step_.item<int64_t>()}, {"_last_lr", lrs}});
}

void LRScheduler::load_state_dict(const State& sd) {
  CS_CHECK(!detail::in_trace(), "{}: load_state_dict() inside a traced step", name());
  CS_CHECK(sd.is_map() && sd.contains("last_epoch"),
           "{}.load_state_dict: expected a map with key 'last_epoch', got {}", name(), sd.repr());
  const State& le = sd.at("last_epoch");
  int64_t s = 0;
  if (le.is_tensor())
    s = le.as_tensor().item<int64_t>();
  else
    CS_CHECK(le.is_int(), "{}.load_state_dict: last_epoch must be an integer, got {}", name(),
             le.repr());
  if (le.is_int()) s = le.as_int();
  CS_CHECK(s >= 0, "{}.load_state_dict: invalid last_epoch {}", name(), s);
  start();
  NoGradGuard ng;
  if (owner_.empty()) {
    // Checked before anything changes, so a refused step leaves the scheduler as it was.
    Tensor value =
        closed_form_lr(cast(scalar_tensor(static_cast<double>(s), DType::i64), DType::f32));
    check_value(value, s);
    step_.fill_(static_cast<double>(s));
    write(value);
  } else {
    step_.fill_(static_cast<double>(s));
  }
}

// ---------------------------------------------------------------------------------------------
// Built-in schedules.

ConstantLR::ConstantLR(Target t, double learning_rate, std::optional<int64_t> total_iters)
    : LRScheduler(std::move(t), checked_length(total_iters, "ConstantLR", "total_iters")),
      lr_(learning_rate) {
  check_nonneg("ConstantLR", "learning_rate", learning_rate);
  start();
}
Tensor ConstantLR::closed_form_lr(const Tensor& s) const {
  return full_like(s, lr_);
}

PolynomialLR::PolynomialLR(Target t, double init, double end, int64_t total_iters, double power,
                           bool cycle)
    : LRScheduler(std::move(t), checked_length(total_iters, "PolynomialLR", "total_iters")),
      init_(init),
      end_(end),
      power_(power),
      cycle_(cycle) {
  check_nonneg("PolynomialLR", "initial_learning_rate", init);
  check_nonneg("PolynomialLR", "end_learning_rate", end);
  check_nonneg("PolynomialLR", "power", power);
  start();
}
Tensor PolynomialLR::closed_form_lr(const Tensor& s) const {
  double T = static_cast<double>(*total_iters_);
  Tensor d = num(T), sc = minimum(s, num(T));
  if (cycle_) {
    d = maximum(-floor(-s / T), num(1)) * T;  // T * max(1, ceil(s / T))
    sc = s;
  }
  // init * f^p + end * (1 - f^p), f = (d - s) / d: two non-negative terms (no cancellation
  // when end is the larger rate); 1 - f^p = s / d for p = 1, -expm1(p ln f) otherwise.
  Tensor f = (d - sc) / d;
  if (power_ == 1) return f * init_ + (sc / d) * end_;
  return pow(f, power_) * init_ - expm1(log(f) * power_) * end_;
}

LinearLR::LinearLR(Target t, double init, double end, int64_t total_iters)
    : LRScheduler(std::move(t), checked_length(total_iters, "LinearLR", "total_iters")),
      init_(init),
      end_(end) {
  check_nonneg("LinearLR", "initial_learning_rate", init);
  check_nonneg("LinearLR", "end_learning_rate", end);
  start();
}
Tensor LinearLR::closed_form_lr(const Tensor& s) const {
  double T = static_cast<double>(*total_iters_);
  Tensor sc = minimum(s, num(T));
  return lin_mix(init_, end_, sc, T - sc, T);
}

ExponentialLR::ExponentialLR(Target t, double init, int64_t total_iters, double decay_rate,
                             bool staircase)
    : LRScheduler(std::move(t), checked_length(total_iters, "ExponentialLR", "total_iters")),
      init_(init),
      rate_(decay_rate),
      staircase_(staircase) {
  check_finite("ExponentialLR", "initial_learning_rate", init);
  check_positive("ExponentialLR", "decay_rate", decay_rate);
  start();
}
Tensor ExponentialLR::closed_form_lr(const Tensor& s) const {
  double T = static_cast<double>(*total_iters_);
  if (staircase_) return pow_exact(rate_, floor(s / T)) * init_;
  // rate^(s/T) = (rate^(1/T))^s with the base computed in double, so the exponent is exact.
  return pow_exact(std::pow(rate_, 1.0 / T), s) * init_;
}

InverseExponentialTimeDecayLR::InverseExponentialTimeDecayLR(Target t, double init,
                                                             double step_exponent,
                                                             int64_t total_iters, double decay_rate,
                                                             bool staircase)
    : LRScheduler(std::move(t),
                  checked_length(total_iters, "InverseExponentialTimeDecayLR", "total_iters")),
      init_(init),
      exponent_(step_exponent),
      rate_(decay_rate),
      staircase_(staircase) {
  check_finite("InverseExponentialTimeDecayLR", "initial_learning_rate", init);
  check_finite("InverseExponentialTimeDecayLR", "step_exponent", step_exponent);
  check_finite("InverseExponentialTimeDecayLR", "decay_rate", decay_rate);
  start();
}
Tensor InverseExponentialTimeDecayLR::closed_form_lr(const Tensor& s) const {
  double T = static_cast<double>(*total_iters_);
  Tensor x = (exponent_ == 1 ? s : pow(s, exponent_)) / T;
  if (staircase_) x = floor(x);
  return init_ / (x * rate_ + 1.0);
}

InverseSquareRootDecayLR::InverseSquareRootDecayLR(Target t, double init, double scale,
                                                   int64_t warmup_steps)
    : LRScheduler(std::move(t)), init_(init), scale_(scale), warmup_(warmup_steps) {
  check_finite("InverseSquareRootDecayLR", "initial_learning_rate", init);
  check_finite("InverseSquareRootDecayLR", "scale", scale);
  CS_CHECK(warmup_steps >= 1, "InverseSquareRootDecayLR: invalid warmup_steps {} (must be >= 1)",
           warmup_steps);
  start();
}
Tensor InverseSquareRootDecayLR::closed_form_lr(const Tensor& s) const {
  return rsqrt(maximum(s, num(static_cast<double>(warmup_)))) * (init_ * scale_);
}

CosineDecayLR::CosineDecayLR(Target t, double init, double end, int64_t total_iters)
    : LRScheduler(std::move(t), checked_length(total_iters, "CosineDecayLR", "total_iters")),
      init_(init),
      end_(end) {
  check_finite("CosineDecayLR", "initial_learning_rate", init);
  check_finite("CosineDecayLR", "end_learning_rate", end);
  start();
}
Tensor CosineDecayLR::closed_form_lr(const Tensor& s) const {
  Tensor T = num(static_cast<double>(*total_iters_));
  Tensor sc = minimum(s, T);
  return cos_mix(init_, end_, sc, T, T - sc);
}

CosineAnnealingLR::CosineAnnealingLR(Target t, double init, int64_t T_max, double eta_min)
    : LRScheduler(std::move(t), checked_length(T_max, "CosineAnnealingLR", "T_max")),
      init_(init),
      eta_min_(eta_min),
      t_max_(T_max) {
  check_finite("CosineAnnealingLR", "initial_learning_rate", init);
  check_finite("CosineAnnealingLR", "eta_min", eta_min);
  start();
}
Tensor CosineAnnealingLR::closed_form_lr(const Tensor& s) const {
  double T = static_cast<double>(t_max_);
  Tensor r = s - floor(s / (2 * T)) * (2 * T);  // s mod 2T, exact for integers
  Tensor u = minimum(r, 2 * T - r);             // cos(pi r / T) = cos(pi u / T), u in [0, T]
  Tensor Tt = num(T);
  return cos_mix(init_, eta_min_, u, Tt, T - u);
}

CosineAnnealingWarmRestarts::CosineAnnealingWarmRestarts(Target t, double init, int64_t T_0,
                                                         int64_t T_mult, double eta_min)
    : LRScheduler(std::move(t)), init_(init), eta_min_(eta_min), t0_(T_0), mult_(T_mult) {
  CS_CHECK(T_0 > 0, "CosineAnnealingWarmRestarts: invalid T_0 {} (must be > 0)", T_0);
  CS_CHECK(T_mult >= 1, "CosineAnnealingWarmRestarts: invalid T_mult {} (must be >= 1)", T_mult);
  check_finite("CosineAnnealingWarmRestarts", "initial_learning_rate", init);
  check_finite("CosineAnnealingWarmRestarts", "eta_min", eta_min);
  start();
}
Tensor CosineAnnealingWarmRestarts::closed_form_lr(const Tensor& s) const {
  double T0 = static_cast<double>(t0_);
  Tensor cur, len;
  if (mult_ == 1) {
    cur = s - floor(s / T0) * T0;
    len = full_like(s, T0);
  } else {
    // Cycle i starts at T_0 (m^i - 1) / (m - 1) and lasts T_0 m^i; the starts are static, so
    // the current cycle is a chain of where()s over the ones below 2^24 (exact in f32).
    cur = s;
    len = full_like(s, T0);
    double start = T0, length = T0 * static_cast<double>(mult_);
    while (start < 16777216.0) {
      Tensor in = s >= start;
      cur = where(in, s - start, cur);
      len = where(in, num(length), len);
      start += length;
      length *= static_cast<double>(mult_);
    }
  }
  return cos_mix(init_, eta_min_, cur, len, len - cur);
}

StepLR::StepLR(Target t, double init, int64_t step_size, double gamma)
    : LRScheduler(std::move(t)), init_(init), gamma_(gamma), step_size_(step_size) {
  CS_CHECK(step_size > 0, "StepLR: invalid step_size {} (must be > 0)", step_size);
  check_finite("StepLR", "initial_learning_rate", init);
  check_finite("StepLR", "gamma", gamma);
  start();
}
Tensor StepLR::closed_form_lr(const Tensor& s) const {
  return pow_exact(gamma_, floor(s / static_cast<double>(step_size_))) * init_;
}

MultiStepLR::MultiStepLR(Target t, double init, std::vector<int64_t> milestones, double gamma)
    : LRScheduler(std::move(t)), init_(init), gamma_(gamma), milestones_(std::move(milestones)) {
  for (size_t i = 1; i < milestones_.size(); ++i)
    CS_CHECK(milestones_[i] >= milestones_[i - 1],
             "MultiStepLR: milestones must be increasing, got {} after {}", milestones_[i],
             milestones_[i - 1]);
  check_finite("MultiStepLR", "initial_learning_rate", init);
  check_finite("MultiStepLR", "gamma", gamma);
  start();
}
Tensor MultiStepLR::closed_form_lr(const Tensor& s) const {
  Tensor k = zeros_like(s);
  for (int64_t m : milestones_) k = k + cast(s >= static_cast<double>(m), DType::f32);
  return pow_exact(gamma_, k) * init_;
}

MultiplicativeLR::MultiplicativeLR(Target t, double init, double coefficient)
    : LRScheduler(std::move(t)), init_(init), coefficient_(coefficient) {
  check_finite("MultiplicativeLR", "initial_learning_rate", init);
  check_positive("MultiplicativeLR", "coefficient", coefficient);
  start();
}
Tensor MultiplicativeLR::closed_form_lr(const Tensor& s) const {
  return pow_exact(coefficient_, s) * init_;
}

LambdaLR::LambdaLR(Target t, double init, std::function<Tensor(const Tensor&)> fn)
    : LRScheduler(std::move(t)), init_(init), fn_(std::move(fn)) {
  CS_CHECK(fn_ != nullptr, "LambdaLR: no function given");
  check_finite("LambdaLR", "initial_learning_rate", init);
  start();
}
Tensor LambdaLR::closed_form_lr(const Tensor& s) const {
  Tensor f = fn_(s);
  CS_CHECK(f.defined() && f.numel() == 1,
           "LambdaLR: the function must return a one-element tensor, got {}",
           f.defined() ? shape_str(f.shape()) : std::string("an undefined tensor"));
  return cast(f.reshape({}), DType::f32) * init_;
}

CyclicLR::CyclicLR(Target t, double base_lr, double max_lr, int64_t step_size_up,
                   std::optional<int64_t> step_size_down, const std::string& mode, double gamma)
    : LRScheduler(std::move(t)),
      base_(base_lr),
      max_(max_lr),
      gamma_(gamma),
      up_(step_size_up),
      down_(step_size_down.value_or(step_size_up)),
      mode_(ascii_lower(mode)) {
  CS_CHECK(up_ > 0 && down_ > 0, "CyclicLR: step sizes must be > 0 (got {} and {})", up_, down_);
  CS_CHECK(mode_ == "triangular" || mode_ == "triangular2" || mode_ == "exp_range",
           "CyclicLR: unknown mode '{}'; valid modes: triangular, triangular2, exp_range", mode);
  check_finite("CyclicLR", "base_lr", base_lr);
  check_finite("CyclicLR", "max_lr", max_lr);
  check_finite("CyclicLR", "gamma", gamma);
  start();
}
Tensor CyclicLR::closed_form_lr(const Tensor& s) const {
  double total = static_cast<double>(up_ + down_);
  Tensor k = floor(s / total);
  Tensor r = s - k * total;  // position in the cycle, exact
  Tensor f = where(r <= static_cast<double>(up_), r / static_cast<double>(up_),
                   (total - r) / static_cast<double>(down_));
  Tensor h = f * (max_ - base_);
  if (mode_ == "triangular2") h = h * pow_exact(0.5, k);
  if (mode_ == "exp_range") h = h * pow_exact(gamma_, s);
  return h + base_;
}

OneCycleLR::OneCycleLR(Target t, double init, double max_lr, int64_t total_steps, double pct_start,
                       double final_div_factor, bool three_phase,
                       const std::string& anneal_strategy)
    : LRScheduler(std::move(t), checked_length(total_steps, "OneCycleLR", "total_steps")),
      init_(init),
      total_(total_steps) {
  CS_CHECK(pct_start >= 0 && pct_start <= 1, "OneCycleLR: invalid pct_start {} (must be in [0, 1])",
           pct_start);
  check_finite("OneCycleLR", "initial_learning_rate", init);
  check_finite("OneCycleLR", "max_lr", max_lr);
  // The final rate is initial_learning_rate / final_div_factor: 0 would make it infinite, a
  // negative factor negative.
  check_positive("OneCycleLR", "final_div_factor", final_div_factor);
  std::string a = ascii_lower(anneal_strategy);
  CS_CHECK(a == "cos" || a == "linear",
           "OneCycleLR: unknown anneal_strategy '{}'; valid: cos, linear", anneal_strategy);
  cos_ = a == "cos";
  double min_lr = init / final_div_factor, T = static_cast<double>(total_steps);
  // The phase ends as torch computes them (same double operations), so that a phase has zero
  // steps exactly when it has there.
  if (three_phase)
    phases_ = {{pct_start * T - 1, init, max_lr},
               {2 * pct_start * T - 2, max_lr, init},
               {T - 1, init, min_lr}};
  else
    phases_ = {{pct_start * T - 1, init, max_lr}, {T - 1, max_lr, min_lr}};
  // A phase's rate is its position divided by its length, so a phase of zero steps gives 0/0
  // (a NaN rate, then NaN weights) at the step that reaches it: the first phase (and the
  // second of three, as long) at step 0, the last at step total_steps, which the documented
  // loop (one step() per batch) reaches. torch raises ZeroDivisionError for exactly these
  // arguments. Phases of negative length are never reached before total_steps and torch runs
  // them, so they are allowed.
  double start_step = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    if (phases_[i].end_step == start_step) {
      bool last = i + 1 == phases_.size();
      std::string what =
          i == 0  ? "the rise from initial_learning_rate to max_lr"
          : !last ? "the fall from max_lr back to initial_learning_rate"
                  : fmt::format("the fall from {} to initial_learning_rate / final_div_factor",
                                three_phase ? "initial_learning_rate" : "max_lr");
      std::string rule =
          !last ? "pct_start * total_steps must not be 1"
          : three_phase
              ? fmt::format("2 * pct_start * total_steps must not be total_steps + 1 ({})",
                            total_steps + 1)
              : "pct_start must be below 1";
      fail(
          "OneCycleLR: pct_start {} with total_steps {}{} gives {} zero steps (it starts and "
          "ends at step {}), so no rate can be interpolated over it (PyTorch raises "
          "ZeroDivisionError); {}",
          pct_start, total_steps, three_phase ? " and three_phase" : "", what, start_step, rule);
    }
    start_step = phases_[i].end_step;
  }
  // torch's value at step total_steps continues the last phase one step past its end (for the
  // usual arguments: above the final rate with cos; below it with linear, and negative unless
  // the final rate is large). It is kept unless negative; torch raises past total_steps, so the
  // steps after it have no torch value to match.
  {
    runtime::SuspendTrace eager;
    NoGradGuard ng;
    keep_total_ = phase_lr(num(T)).item<float>() >= 0;
  }
  start();
}
Tensor OneCycleLR::closed_form_lr(const Tensor& s) const {
  // The step whose value is written: s up to the last step of the schedule (total_steps - 1),
  // total_steps itself when its torch value is kept, and the last step's after that, so the
  // rate rests at its final value (never negative, never rising again).
  double last = static_cast<double>(total_ - 1);
  return phase_lr(keep_total_ ? where(s > static_cast<double>(total_), num(last), s)
                              : minimum(s, num(last)));
}
Tensor OneCycleLR::phase_lr(const Tensor& s) const {
  Tensor result;
  double start_step = 0;
  // Phases from the last to the first: where(s <= end_i, phase i, later phases), as torch's
  // loop takes the first phase whose end is >= s.
  std::vector<Tensor> vals;
  for (const auto& ph : phases_) {
    double den = ph.end_step - start_step;
    Tensor numer = s - start_step;
    // end_step may be fractional: end - s as (integer part - s) + fraction keeps it exact.
    double ei = std::floor(ph.end_step), ef = ph.end_step - ei;
    Tensor rest = (ei - s) + ef;
    Tensor v = cos_ ? cos_mix(ph.start_lr, ph.end_lr, numer, num(den), rest)
                    : lin_mix(ph.start_lr, ph.end_lr, numer, rest, den);
    vals.push_back(v);
    start_step = ph.end_step;
  }
  result = vals.back();
  for (size_t i = phases_.size() - 1; i-- > 0;)
    result = where(s <= std::floor(phases_[i].end_step), vals[i], result);
  return result;
}

PiecewiseConstantLR::PiecewiseConstantLR(Target t, std::vector<double> learning_rates,
                                         std::vector<int64_t> milestones)
    : LRScheduler(std::move(t)),
      lrs_(std::move(learning_rates)),
      milestones_(std::move(milestones)) {
  CS_CHECK(lrs_.size() == milestones_.size() + 1,
           "PiecewiseConstantLR: need one more learning rate than milestones, got {} rates and "
           "{} milestones",
           lrs_.size(), milestones_.size());
  for (size_t i = 1; i < milestones_.size(); ++i)
    CS_CHECK(milestones_[i] > milestones_[i - 1],
             "PiecewiseConstantLR: milestones must be increasing, got {} after {}", milestones_[i],
             milestones_[i - 1]);
  for (size_t i = 0; i < lrs_.size(); ++i)
    check_finite("PiecewiseConstantLR", fmt::format("learning_rates[{}]", i), lrs_[i]);
  start();
}
Tensor PiecewiseConstantLR::closed_form_lr(const Tensor& s) const {
  Tensor v = full_like(s, lrs_[0]);
  for (size_t i = 0; i < milestones_.size(); ++i)
    v = where(s >= static_cast<double>(milestones_[i]), num(lrs_[i + 1]), v);
  return v;
}

SequentialLR::SequentialLR(Target t, std::vector<SchedulerPtr> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(std::move(t)),
      scheds_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  CS_CHECK(!scheds_.empty(), "SequentialLR: no schedulers given");
  CS_CHECK(milestones_.size() + 1 == scheds_.size(),
           "SequentialLR: expected {} milestones for {} schedulers, got {}", scheds_.size() - 1,
           scheds_.size(), milestones_.size());
  for (size_t i = 0; i < milestones_.size(); ++i)
    CS_CHECK(milestones_[i] > (i ? milestones_[i - 1] : 0),
             "SequentialLR: milestones must be positive and increasing, got {}",
             fmt::join(milestones_, ", "));
  for (auto& sc : scheds_) {
    CS_CHECK(sc != nullptr, "SequentialLR: a scheduler is null");
    CS_CHECK(&sc->optimizer() == target_.optimizer,
             "SequentialLR: scheduler {} belongs to a different optimizer", sc->name());
    sc->make_nested("SequentialLR");
  }
  start();
}
bool SequentialLR::elementwise() const {
  return all_elementwise(scheds_);
}
Tensor SequentialLR::closed_form_lr(const Tensor& s) const {
  Tensor v = scheds_[0]->closed_form_lr(s);
  for (size_t i = 0; i < milestones_.size(); ++i) {
    double m = static_cast<double>(milestones_[i]);
    v = where(s >= m, scheds_[i + 1]->closed_form_lr(maximum(s - m, num(0))), v);
  }
  return v;
}

ChainedLR::ChainedLR(Target t, std::vector<SchedulerPtr> schedulers)
    : LRScheduler(std::move(t)), scheds_(std::move(schedulers)) {
  CS_CHECK(!scheds_.empty(), "ChainedLR: no schedulers given");
  for (auto& sc : scheds_) {
    CS_CHECK(sc != nullptr, "ChainedLR: a scheduler is null");
    CS_CHECK(&sc->optimizer() == target_.optimizer,
             "ChainedLR: scheduler {} belongs to a different optimizer", sc->name());
    sc->make_nested("ChainedLR");
  }
  for (size_t i = 1; i < scheds_.size(); ++i)
    CS_CHECK(scheds_[i]->initial_value() != 0,
             "ChainedLR: scheduler {} ({}) starts at 0, so it cannot be chained (its value is "
             "divided by its initial value)",
             i, scheds_[i]->name());
  start();
}
bool ChainedLR::elementwise() const {
  return all_elementwise(scheds_);
}
Tensor ChainedLR::closed_form_lr(const Tensor& s) const {
  Tensor v = scheds_[0]->closed_form_lr(s);
  for (size_t i = 1; i < scheds_.size(); ++i)
    v = v * (scheds_[i]->closed_form_lr(s) / scheds_[i]->initial_value());
  return v;
}

}  // namespace cstorch::optim::lr_scheduler
