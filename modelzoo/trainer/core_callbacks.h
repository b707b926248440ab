// The Trainer's core callbacks: logging and checkpointing. Besides the public hooks they get
// the step's outputs (loss and learning-rate tensors), checkpoint steps and validation results
// from the loop.
#pragma once
#include <cstdint>

#include "modelzoo/callback.h"

namespace modelzoo {

class CoreCallback : public Callback {
 public:
  // After each optimizer step (client side; the tensors materialise later).
  virtual void on_step_outputs(Trainer&, const cstorch::Tensor& loss, const cstorch::Tensor& lr) {}
  // At each checkpoint step of the training loop, after the step was queued.
  virtual void on_checkpoint_step(Trainer&) {}
  // After a validation pass, with its mean loss.
  virtual void on_validation_result(Trainer&, double mean_loss) {}
};

// Prints the loss and learning rate every `log_steps` steps (from a step closure, so values
// are read after their step ran) and validation results.
class LoggingCallback : public CoreCallback {
 public:
  explicit LoggingCallback(int64_t log_steps) : log_steps_(log_steps) {}
  std::string name() const override { return "Logging"; }
  void on_step_outputs(Trainer&, const cstorch::Tensor& loss, const cstorch::Tensor& lr) override;
  void on_validation_result(Trainer&, double mean_loss) override;

 private:
  int64_t log_steps_;
};

// Saves checkpoints at checkpoint steps (and at the end of training), keeping the newest N.
class CheckpointCallback : public CoreCallback {
 public:
  std::string name() const override { return "Checkpoint"; }
  void on_train_start(Trainer&) override;
  void on_checkpoint_step(Trainer&) override;
};

}  // namespace modelzoo
