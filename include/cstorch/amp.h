// Mixed precision: loss scaling (GradScaler), the optimizer_step helper, gradient clipping and
// the autocast scope.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "cstorch/optim/optimizer.h"
#include "cstorch/state.h"
#include "cstorch/tensor.h"

namespace cstorch::amp {

// ---------------------------------------------------------------------------------------------
// Autocast. Inside the scope, matmul and linear cast their floating inputs (and bias) to
// `dtype` (bf16 or f16) and compute in it; softmax, log_softmax, the losses, layer_norm and the
// reductions (sum, mean, var, logsumexp, norm) cast 16-bit inputs to f32 and compute in f32.
// Parameters stay f32 ("master weights"): the casts are graph ops, so gradients flow back to
// f32. Scopes nest (the innermost wins); autocast(std::nullopt) switches it off. Thread-local.
// The backward pass runs with autocast off (gradients keep the dtypes of the forward values).
class autocast {
 public:
  explicit autocast(std::optional<DType> dtype = DType::bf16);
  ~autocast();
  autocast(const autocast&) = delete;
  autocast& operator=(const autocast&) = delete;

 private:
  std::optional<DType> prev_;
};
// The active autocast dtype, if any.
std::optional<DType> autocast_dtype();

// ---------------------------------------------------------------------------------------------
// Gradient clipping (as torch.nn.utils). Traceable: tensor ops only.

// Scales every gradient by min(1, max_norm / (total_norm + 1e-6)), total_norm the norm_type
// norm of all gradients together (norm_type inf: the largest absolute value). Returns the total
// norm (0-d f32). Parameters without a gradient are skipped. max_norm must be >= 0.
Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);
// Clamps every gradient to [-clip_value, clip_value]. clip_value must be >= 0.
void clip_grad_value_(const std::vector<Tensor>& params, double clip_value);

// ---------------------------------------------------------------------------------------------
// Loss scaling.
// Loss scaling. Defaults: loss_scale 0.0 (no scaling; a training loop builds a GradScaler only
// when loss_scale != 0.0), overflow_tolerance 0.05, max_gradient_norm 0.05 (which only applies
// with dynamic scaling and global gradient clipping on).
struct GradScalerOptions {
  // "dynamic"; a positive number: the static loss scale; 0.0: no scaling (scale() returns the
  // loss, step() is optimizer.step()). A negative or non-finite number is an error, as is one
  // above f32's largest value (3.4028235e+38): the scale is an f32 value in the step. The same
  // holds for init_scale and max_loss_scale.
  std::variant<double, std::string> loss_scale = 0.0;
  double init_scale = 32768.0;  // 2^15, dynamic only
  int64_t steps_per_increase = 2000;
  double min_loss_scale = 1.0 / 16384;  // 2^-14
  double max_loss_scale = 32768.0;      // 2^15
  // The largest fraction of steps with a non-finite gradient tolerated before the scale halves.
  double overflow_tolerance = 0.05;
  // Global gradient clipping built into the scaler (dynamic loss scaling with global gradient
  // clipping, "DLS + GCC"): with dynamic scaling and global_gradient_clipping on, unscale_()
  // clips the gradients to this global norm; otherwise it has no effect. Must be > 0.
  double max_gradient_norm = 0.05;
  bool global_gradient_clipping = false;
};

// Cerebras/PyTorch-style GradScaler. All counters are 0-d tensors, so scale(), unscale_(),
// step() and update() trace into the compiled step and run on every replay. Without scaling
// (loss_scale 0.0) every call keeps its order rules but changes nothing: scale() returns the
// loss, unscale_() leaves the gradients, step() runs optimizer.step().
//
// step(optimizer): unscales (if unscale_ was not called), then runs optimizer.step() and keeps
// its result only where the gradients' global norm is finite: every parameter and state tensor
// is reset with where(finite, new, old) (no host branch), num_skipped_steps counts the skipped
// ones, and optimizer.step_applied() is set to 0 so schedulers do not advance.
// update() (dynamic): steps += 1; overflows += !finite; if overflows / steps > tolerance: scale
// /= 2 and both counters reset; else if steps > steps_per_increase: scale *= 2 and both reset;
// then the scale is clamped to [min_loss_scale, max_loss_scale]. Static scaling keeps the scale.
// step() twice without update() is an error, as is update() without step().
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  // Convenience: GradScaler("dynamic"), GradScaler(128.0) or GradScaler(0.0) (no scaling).
  explicit GradScaler(std::variant<double, std::string> loss_scale);

  Tensor scale(const Tensor& loss);
  void unscale_(optim::Optimizer& optimizer);
  void step(optim::Optimizer& optimizer);
  void update();

  bool dynamic() const { return dynamic_; }
  // False for loss_scale 0.0 (no scaling).
  bool enabled() const { return enabled_; }
  // 0-d tensors (read them in a step closure).
  const Tensor& loss_scale() const { return scale_; }
  const Tensor& steps_since_rescale() const { return steps_; }
  const Tensor& overflows_since_rescale() const { return overflows_; }
  const Tensor& num_skipped_steps() const { return skipped_; }

  // {"loss_scale": float, "steps_since_rescale": int, "overflows_since_rescale": int,
  //  "num_skipped_steps": int}. A host read: call outside a traced step.
  State state_dict() const;
  // Accepts numbers or 0-d tensors under those keys; a missing or unknown key is an error.
  void load_state_dict(const State& sd);

 private:
  GradScalerOptions opt_;
  bool dynamic_ = true;
  bool enabled_ = true;
  Tensor scale_, steps_, overflows_, skipped_;  // f32, i64, i64, i64
  Tensor finite_;                               // this step's verdict (between step and update)
  optim::Optimizer* unscaled_ = nullptr;        // optimizer unscaled since the last update
  bool stepped_ = false;
};

// scale -> backward -> unscale -> clip (by norm or by value) -> step -> update. Without a
// grad scaler: backward -> clip -> step. Giving both clip limits is an error. Gradients are not
// zeroed (call optimizer.zero_grad()).
void optimizer_step(const Tensor& loss, optim::Optimizer& optimizer, GradScaler* grad_scaler,
                    std::optional<double> max_gradient_norm = std::nullopt,
                    std::optional<double> max_gradient_value = std::nullopt);

}  // namespace cstorch::amp
