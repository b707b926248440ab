// The Trainer's core callbacks: logging and checkpointing. Besides the public hooks they get
// the step's outputs (loss and learning-rate tensors), checkpoint steps and validation results
// from the loop.
#pragma once
#include <cmath>
#include <cstdint>

#include <memory>
#include <optional>

#include "cstorch/amp.h"
#include "cstorch/nn/module.h"
#include "cstorch/optim/optimizer.h"
#include "modelzoo/callback.h"
#include "modelzoo/config_view.h"
#include "modelzoo/loggers.h"

namespace modelzoo {

class CoreCallback : public Callback {
 public:
  // After each optimizer step (client side; the tensors materialise later).
  virtual void on_step_outputs(Trainer&, const cstorch::Tensor& loss, const cstorch::Tensor& lr) {}
  // At each checkpoint step of the training loop, after the step was queued.
  virtual void on_checkpoint_step(Trainer&) {}
  // After a validation pass, with its results (eval/loss and eval/<metric>).
  virtual void on_validation_result(Trainer&, const Scalars& results) {}
};

// Sends the loss and learning rate every `log_steps` steps (from a step closure, so values
// are read after their step ran) and validation results (mean loss and every live metric) to
// the configured loggers; draws the progress bar during fit(); writes the loss/LR plot at
// the end of fit() when a metrics file is being written.
class LoggingCallback : public CoreCallback {
 public:
  // `progress_every`: 0 for no progress bar; else its plain-line period off a terminal.
  LoggingCallback(int64_t log_steps, std::shared_ptr<MultiLogger> loggers, int64_t progress_every,
                  std::string metrics_file, std::string plot_file)
      : log_steps_(log_steps),
        loggers_(std::move(loggers)),
        progress_every_(progress_every),
        metrics_file_(std::move(metrics_file)),
        plot_file_(std::move(plot_file)) {}
  std::string name() const override { return "Logging"; }
  void on_train_start(Trainer&) override;
  void on_train_end(Trainer&) override;
  void on_train_exception(Trainer&, const std::exception&) override;
  void on_fit_end(Trainer&) override;
  void finalize(Trainer&) override;
  void on_step_outputs(Trainer&, const cstorch::Tensor& loss, const cstorch::Tensor& lr) override;
  void on_validation_result(Trainer&, const Scalars& results) override;
  // The loss of the latest step whose values were read (NaN before any); read it after
  // cstorch::synchronize().
  double last_loss() const { return *last_loss_; }
  // Whether a training loss that was not a finite number was read (and warned about).
  bool saw_not_finite() const { return *warned_not_finite_; }

 private:
  std::shared_ptr<double> last_loss_ = std::make_shared<double>(std::nan(""));
  // Whether a training loss that is not a finite number was reported (once a run).
  std::shared_ptr<bool> warned_not_finite_ = std::make_shared<bool>(false);
  void end_progress();
  int64_t log_steps_;
  std::shared_ptr<MultiLogger> loggers_;
  int64_t progress_every_;
  std::shared_ptr<ProgressBar> progress_;
  std::string metrics_file_, plot_file_;
};

// Mixed precision and gradient clipping (trainer.init.precision): opens the autocast scope
// around the forward pass (on_before_forward / on_after_forward), scales the loss for the
// backward pass and steps the optimizer through the GradScaler, and keeps the GradScaler's
// state in checkpoints (on_save_checkpoint / on_load_checkpoint).
class PrecisionCallback : public CoreCallback {
 public:
  // From the `precision` map (`view` may be null: no precision settings).
  explicit PrecisionCallback(const ConfigView& view);
  std::string name() const override { return "Precision"; }
  void on_before_forward(Trainer&, const cstorch::Batch&) override;
  void on_after_forward(Trainer&, const cstorch::Tensor& loss) override;
  // A forward pass that threw leaves the scope open: close it.
  void on_train_exception(Trainer&, const std::exception&) override;
  void on_save_checkpoint(Trainer&, cstorch::State& state) override;
  void on_load_checkpoint(Trainer&, const cstorch::State& state) override;

  // The loss to call backward() on.
  cstorch::Tensor scale_loss(const cstorch::Tensor& loss);
  // Unscales and clips the gradients as configured, then steps (skipping a non-finite step
  // without a host branch when loss scaling is on).
  void optimizer_step(cstorch::nn::Module& model, cstorch::optim::Optimizer& optimizer);
  cstorch::amp::GradScaler* grad_scaler() { return scaler_.get(); }
  // "f32", or "bf16 mixed" / "f16 mixed, dynamic loss scaling" for the run header.
  std::string describe() const;

 private:
  std::optional<cstorch::DType> dtype_;
  std::unique_ptr<cstorch::amp::GradScaler> scaler_;
  std::optional<double> max_norm_, max_value_;
  std::optional<cstorch::amp::autocast> scope_;
};

// Saves checkpoints at checkpoint steps (and at the end of training), keeping the newest N.
class CheckpointCallback : public CoreCallback {
 public:
  std::string name() const override { return "Checkpoint"; }
  void on_train_start(Trainer&) override;
  void on_checkpoint_step(Trainer&) override;
};

}  // namespace modelzoo
