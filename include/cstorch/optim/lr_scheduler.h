// Learning-rate (and other hyper-parameter) schedules in closed form. A scheduler keeps its
// step s as a 0-d i64 tensor and computes the value as tensor ops of s (closed_form_lr), so
// scheduler.step() inside a traced step changes the value on every replay without retracing.
//
// Step counting (as PyTorch and Cerebras): construction sets s = last_epoch + 1 (0 by
// default) and writes f(s); each step() adds one to s and writes f(s). A step that GradScaler
// skipped (non-finite gradients) does not advance s (s += optimizer.step_applied()).
//
// Every value is written to all parameter groups of the optimizer, under the group key the
// scheduler drives: "lr" by default, or another hyper-parameter (weight_decay, ...) given as
// {optimizer, "weight_decay"} in place of the optimizer.
//
// Arguments are checked when the scheduler is built: rates, bounds, factors and exponents must
// be finite (the learning rates of ConstantLR, LinearLR and PolynomialLR and its power also
// >= 0; ExponentialLR's decay_rate, MultiplicativeLR's coefficient and OneCycleLR's
// final_div_factor > 0), and so must the value written by start() and load_state_dict(), as
// f32; each error names the scheduler, the argument (or the step) and the value. step() does
// not read its value back to check it: inside a traced step that would stall every step.
//
// Values are computed in f32 with forms chosen for accuracy: powers as pow(f32(b), k) with a
// first-order correction for the rounding of b, and 1 + cos(x) as 2 cos^2(x/2) or 2 sin^2 of the
// complement, so cosine schedules keep their relative accuracy near zero. Steps are exact up
// to 2^24.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cstorch/optim/optimizer.h"
#include "cstorch/state.h"

namespace cstorch::optim::lr_scheduler {

// What a scheduler drives: an optimizer's group key ("lr" unless given). The scheduler refers
// to the optimizer, which must outlive it (as in PyTorch, where a scheduler holds its
// optimizer): destroy a scheduler before its optimizer, e.g. declare it after the optimizer.
struct Target {
  Target(Optimizer& o, std::string k = "lr") : optimizer(&o), key(std::move(k)) {}
  Optimizer* optimizer;
  std::string key;
};

class LRScheduler {
 public:
  // total_iters: the schedule's length where it has one (informational for most; SequentialLR
  // configuration uses it). last_epoch: the step before the first one (-1 = a fresh start).
  LRScheduler(Target target, std::optional<int64_t> total_iters = std::nullopt,
              int64_t last_epoch = -1);
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // The schedule as tensor ops of the step `s` (0-d f32 holding an integer). No branch on a
  // tensor value (use where()); loops and branches on constructor arguments are fine.
  virtual Tensor closed_form_lr(const Tensor& s) const = 0;
  virtual std::string name() const = 0;
  // The value at s = 0, used by ChainedLR to normalise (f(0) computed once, eagerly).
  virtual double initial_value() const;
  // Whether closed_form_lr computes element by element, so that an s holding many steps (a
  // 1-d f32 tensor) gives each step's value (check_steps uses it). The built-in schedules do
  // except LambdaLR (its function is given one step); a user-written one says no unless it
  // overrides this.
  virtual bool elementwise() const { return false; }

  // Advances the step by one (by optimizer.step_applied()) and writes the new value.
  void step();
  // Writes f(last_epoch + 1) if not written yet. Built-in schedulers call it at the end of
  // their constructor; a user-written scheduler should too (otherwise it runs at first use:
  // the optimizer's next step(), this scheduler's step(), last_lr() or state_dict()).
  void start();

  // The value last written (0-d f32 tensor; read it in a step closure to print it).
  Tensor last_lr();
  // The value last written, as a number per parameter group (a host read).
  std::vector<double> get_last_lr();
  // The step counter (0-d i64 tensor).
  const Tensor& step_tensor() const { return step_; }
  std::optional<int64_t> total_iters() const { return total_iters_; }
  Optimizer& optimizer() const { return *target_.optimizer; }
  const std::string& param_group_key() const { return target_.key; }

  // Checks the values of the next `steps` steps after the current one, before they are taken:
  // each must be finite as f32, or the error names the first step that is not, as
  // load_state_dict()'s does. A run that knows its length calls it before its first step (the
  // Trainer does), so that a growing schedule (an ExponentialLR with decay_rate above 1) is
  // refused at the start instead of turning the parameters into NaN at the step it overflows.
  // Computed eagerly on the host, nothing written: every step where elementwise() (in blocks,
  // up to step 2^24, past which steps are not exact in f32, and the last step), otherwise the
  // last step only. Not inside a traced step. A nested scheduler's owner checks it.
  void check_steps(int64_t steps) const;

  // {"last_epoch": int, "_last_lr": [float per group]}. A host read: call outside a trace.
  State state_dict();
  // Restores last_epoch and rewrites the value for it.
  void load_state_dict(const State& sd);

  // Used by SequentialLR / ChainedLR: this scheduler only provides closed_form_lr from now on
  // and never writes the optimizer (its step() becomes an error).
  void make_nested(const std::string& owner);

 protected:
  Target target_;
  std::optional<int64_t> total_iters_;

 private:
  void write(const Tensor& value);
  // An error naming the scheduler, the key and the step when `value` is not finite as f32.
  void check_value(const Tensor& value, int64_t step) const;
  Tensor step_;  // 0-d i64
  int64_t last_epoch_;
  int64_t hook_ = -1;
  bool started_ = false;
  std::string owner_;  // non-empty when nested
};

using SchedulerPtr = std::shared_ptr<LRScheduler>;

// lr constant (total_iters only informs SequentialLR configuration).
class ConstantLR final : public LRScheduler {
 public:
  ConstantLR(Target t, double learning_rate, std::optional<int64_t> total_iters = std::nullopt);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "ConstantLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return lr_; }

 private:
  double lr_;
};

// s >= T ? end : (init - end) (1 - s/T)^power + end; cycle: T is multiplied by
// max(1, ceil(s/T)) so the decay restarts.
class PolynomialLR final : public LRScheduler {
 public:
  PolynomialLR(Target t, double initial_learning_rate, double end_learning_rate,
               int64_t total_iters, double power = 1.0, bool cycle = false);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "PolynomialLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  double init_, end_, power_;
  bool cycle_;
};

// PolynomialLR with power 1 (PyTorch's LinearLR with start/end factors times the base rate).
class LinearLR final : public LRScheduler {
 public:
  LinearLR(Target t, double initial_learning_rate, double end_learning_rate, int64_t total_iters);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "LinearLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  double init_, end_;
};

// init * decay_rate^(s / T) (floor(s / T) with staircase). T = 1 is PyTorch's ExponentialLR.
class ExponentialLR final : public LRScheduler {
 public:
  ExponentialLR(Target t, double initial_learning_rate, int64_t total_iters, double decay_rate,
                bool staircase = false);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "ExponentialLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  double init_, rate_;
  bool staircase_;
};

// init / (1 + decay_rate * s^step_exponent / T) (floor of s^e / T with staircase).
class InverseExponentialTimeDecayLR final : public LRScheduler {
 public:
  InverseExponentialTimeDecayLR(Target t, double initial_learning_rate, double step_exponent,
                                int64_t total_iters, double decay_rate, bool staircase = false);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "InverseExponentialTimeDecayLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  double init_, exponent_, rate_;
  bool staircase_;
};

// init * scale / sqrt(max(warmup_steps, s)).
class InverseSquareRootDecayLR final : public LRScheduler {
 public:
  InverseSquareRootDecayLR(Target t, double initial_learning_rate = 1.0, double scale = 1.0,
                           int64_t warmup_steps = 1);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "InverseSquareRootDecayLR"; }
  bool elementwise() const override { return true; }

 private:
  double init_, scale_;
  int64_t warmup_;
};

// end + (init - end) * (1 + cos(pi * min(s, T) / T)) / 2.
class CosineDecayLR final : public LRScheduler {
 public:
  CosineDecayLR(Target t, double initial_learning_rate, double end_learning_rate,
                int64_t total_iters);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "CosineDecayLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  double init_, end_;
};

// eta_min + (init - eta_min) * (1 + cos(pi * s / T_max)) / 2 (periodic past T_max, as torch).
class CosineAnnealingLR final : public LRScheduler {
 public:
  CosineAnnealingLR(Target t, double initial_learning_rate, int64_t T_max, double eta_min = 0);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "CosineAnnealingLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  double init_, eta_min_;
  int64_t t_max_;
};

// Cosine annealing restarting after T_0, T_0*T_mult, T_0*T_mult^2, ... steps (torch's
// CosineAnnealingWarmRestarts; T_mult an integer >= 1).
class CosineAnnealingWarmRestarts final : public LRScheduler {
 public:
  CosineAnnealingWarmRestarts(Target t, double initial_learning_rate, int64_t T_0,
                              int64_t T_mult = 1, double eta_min = 0);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "CosineAnnealingWarmRestarts"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  double init_, eta_min_;
  int64_t t0_, mult_;
};

// init * gamma^floor(s / step_size).
class StepLR final : public LRScheduler {
 public:
  StepLR(Target t, double initial_learning_rate, int64_t step_size, double gamma = 0.1);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "StepLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  double init_, gamma_;
  int64_t step_size_;
};

// init * gamma^(number of milestones <= s).
class MultiStepLR final : public LRScheduler {
 public:
  MultiStepLR(Target t, double initial_learning_rate, std::vector<int64_t> milestones,
              double gamma = 0.1);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "MultiStepLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  double init_, gamma_;
  std::vector<int64_t> milestones_;
};

// init * coefficient^s (torch's MultiplicativeLR with a constant factor).
class MultiplicativeLR final : public LRScheduler {
 public:
  MultiplicativeLR(Target t, double initial_learning_rate, double coefficient);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "MultiplicativeLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  double init_, coefficient_;
};

// init * fn(s), fn written with tensor ops of the f32 step tensor.
class LambdaLR final : public LRScheduler {
 public:
  LambdaLR(Target t, double initial_learning_rate, std::function<Tensor(const Tensor&)> fn);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "LambdaLR"; }

 private:
  double init_;
  std::function<Tensor(const Tensor&)> fn_;
};

// torch's CyclicLR: triangular, triangular2 or exp_range between base_lr and max_lr
// (momentum is not cycled).
class CyclicLR final : public LRScheduler {
 public:
  CyclicLR(Target t, double base_lr, double max_lr, int64_t step_size_up = 2000,
           std::optional<int64_t> step_size_down = std::nullopt,
           const std::string& mode = "triangular", double gamma = 1.0);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "CyclicLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return base_; }

 private:
  double base_, max_, gamma_;
  int64_t up_, down_;
  std::string mode_;
};

// torch's OneCycleLR (momentum is not cycled): from initial_learning_rate up to max_lr over
// pct_start of total_steps, then down to initial / final_div_factor (three_phase: back to the
// initial rate first), annealing by "cos" or "linear". Steps 0 .. total_steps - 1 are the
// schedule, with torch's values. At s = total_steps (reached by one step() per batch for
// total_steps batches) torch continues the last phase one step past its end: that value is kept
// unless it is negative (linear annealing with a small final rate), when the value of step
// total_steps - 1 is written instead. After total_steps (where torch raises) the value of step
// total_steps - 1 is held, so the rate never goes negative or rises again. Arguments that give a
// phase zero steps (pct_start * total_steps = 1; pct_start = 1; with three_phase,
// 2 * pct_start * total_steps = total_steps + 1), for which torch raises ZeroDivisionError, are
// an error.
class OneCycleLR final : public LRScheduler {
 public:
  OneCycleLR(Target t, double initial_learning_rate, double max_lr, int64_t total_steps,
             double pct_start = 0.25, double final_div_factor = 1e4, bool three_phase = false,
             const std::string& anneal_strategy = "cos");
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "OneCycleLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return init_; }

 private:
  // torch's value at step s (0 <= s <= total_steps).
  Tensor phase_lr(const Tensor& s) const;
  struct Phase {
    double end_step, start_lr, end_lr;
  };
  std::vector<Phase> phases_;
  double init_;
  int64_t total_;
  bool cos_;
  bool keep_total_ = false;  // torch's value at s = total_steps is not negative
};

// learning_rates[i] for milestones[i-1] <= s < milestones[i] (one more rate than milestones).
class PiecewiseConstantLR final : public LRScheduler {
 public:
  PiecewiseConstantLR(Target t, std::vector<double> learning_rates,
                      std::vector<int64_t> milestones);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "PiecewiseConstantLR"; }
  bool elementwise() const override { return true; }
  double initial_value() const override { return lrs_.front(); }

 private:
  std::vector<double> lrs_;
  std::vector<int64_t> milestones_;
};

// Scheduler i from milestones[i-1] on, seeing its local step s - milestones[i-1].
class SequentialLR final : public LRScheduler {
 public:
  SequentialLR(Target t, std::vector<SchedulerPtr> schedulers, std::vector<int64_t> milestones);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "SequentialLR"; }
  double initial_value() const override { return scheds_.front()->initial_value(); }
  bool elementwise() const override;  // every scheduler in it is

 private:
  std::vector<SchedulerPtr> scheds_;
  std::vector<int64_t> milestones_;
};

// first(s) * prod over the others of other(s) / other.initial_value() (torch's
// ChainedScheduler for multiplicative schedules).
class ChainedLR final : public LRScheduler {
 public:
  ChainedLR(Target t, std::vector<SchedulerPtr> schedulers);
  Tensor closed_form_lr(const Tensor& s) const override;
  std::string name() const override { return "ChainedLR"; }
  double initial_value() const override { return scheds_.front()->initial_value(); }
  bool elementwise() const override;  // every scheduler in it is

 private:
  std::vector<SchedulerPtr> scheds_;
};
using ChainedScheduler = ChainedLR;

}  // namespace cstorch::optim::lr_scheduler

namespace cstorch::optim {

// Builds a scheduler from configuration:
//   a number                   -> ConstantLR with that rate;
//   {scheduler: Name, args...} -> that scheduler (Name case-insensitive, "LR" suffix optional;
//                                 "param_group_key" picks the driven group key);
//   a list of such maps        -> SequentialLR with milestones the running sum of each entry's
//                                 total_iters, or ChainedLR when an entry has
//                                 main_scheduler: ChainedLR.
// Errors: an unknown name lists the valid ones; an unknown key lists the accepted ones; an old
// alias (steps, decay_steps, base_lr, learning_rate, values, boundaries) names its new key.
std::shared_ptr<lr_scheduler::LRScheduler> configure_lr_scheduler(Optimizer& optimizer,
                                                                  const Config& learning_rate);
// The same, for a value read from a config file at `key_path` (e.g.
// "trainer.init.schedulers[0].LinearLR"): errors start with the key path of the offending value,
// as every config error does, e.g.
//   trainer.init.schedulers[0].LinearLR.foo: unknown key 'foo' of LinearLR; valid keys: ...
// (an empty key_path is the form above: "configure_lr_scheduler: learning_rate...").
std::shared_ptr<lr_scheduler::LRScheduler> configure_lr_scheduler(Optimizer& optimizer,
                                                                  const Config& learning_rate,
                                                                  const std::string& key_path);
// The scheduler names configure_lr_scheduler knows.
std::vector<std::string> lr_scheduler_names();
// The keys a scheduler's map accepts besides `scheduler` (its own arguments, total_iters and
// param_group_key), for a name as configure_lr_scheduler matches it (any case, "LR" suffix
// optional); nullopt for a name it does not know.
std::optional<std::vector<std::string>> lr_scheduler_arguments(const std::string& scheduler);

}  // namespace cstorch::optim
