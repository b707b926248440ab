// The one hook interface of the Trainer. Core pieces (checkpointing, logging, the legacy
// runner adapter) are callbacks too. Hooks run in this order during fit():
//
//   pre_setup, setup, post_setup                      (construction, per callback)
//   on_fit_start
//     on_train_start
//       on_train_epoch_start(e)
//         on_train_batch_start(step)
//           [traced once per signature:] on_before_forward, on_after_forward,
//           on_before_backward, on_after_backward, on_before_optimizer_step,
//           on_after_optimizer_step, on_before_scheduler_step, on_after_scheduler_step
//         on_train_batch_end(step)
//         (on_save_checkpoint at checkpoint steps; validation at eval_frequency)
//       on_train_epoch_end(e)
//     on_train_end
//   on_fit_end
//   finalize                                          (Trainer destruction)
//
// validate(): on_validate_start, on_validate_epoch_start, on_validate_batch_start/end...,
// on_validate_epoch_end, on_validate_end. An exception inside train / validate / fit calls
// on_train_exception / on_validate_exception / on_fit_exception (innermost first) and is
// rethrown; the matching *_end hooks are not called.
//
// Batch hooks run in the client loop, which runs ahead of execution: `step` numbers the step,
// but its values are not ready yet; read them with a cstorch::step_closure.
#pragma once
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "cstorch/runtime.h"
#include "cstorch/state.h"
#include "modelzoo/registry.h"

namespace modelzoo {

class Trainer;

class Callback {
 public:
  virtual ~Callback() = default;
  virtual std::string name() const { return "Callback"; }

  virtual void pre_setup(Trainer&) {}
  virtual void setup(Trainer&) {}
  virtual void post_setup(Trainer&) {}
  virtual void finalize(Trainer&) {}

  virtual void on_fit_start(Trainer&) {}
  virtual void on_fit_end(Trainer&) {}
  virtual void on_fit_exception(Trainer&, const std::exception&) {}

  virtual void on_train_start(Trainer&) {}
  virtual void on_train_end(Trainer&) {}
  virtual void on_train_exception(Trainer&, const std::exception&) {}
  virtual void on_train_epoch_start(Trainer&, int64_t epoch) {}
  virtual void on_train_epoch_end(Trainer&, int64_t epoch) {}
  virtual void on_train_batch_start(Trainer&, const cstorch::Batch&, int64_t step) {}
  // `loss` is the step's (not yet materialised) loss tensor.
  virtual void on_train_batch_end(Trainer&, const cstorch::Tensor& loss, int64_t step) {}

  virtual void on_validate_start(Trainer&) {}
  virtual void on_validate_end(Trainer&) {}
  virtual void on_validate_exception(Trainer&, const std::exception&) {}
  virtual void on_validate_epoch_start(Trainer&, int64_t epoch) {}
  virtual void on_validate_epoch_end(Trainer&, int64_t epoch) {}
  virtual void on_validate_batch_start(Trainer&, const cstorch::Batch&, int64_t step) {}
  virtual void on_validate_batch_end(Trainer&, const cstorch::Tensor& loss, int64_t step) {}

  // Inside the traced training step (run once per traced signature).
  virtual void on_before_forward(Trainer&, const cstorch::Batch&) {}
  virtual void on_after_forward(Trainer&, const cstorch::Tensor& loss) {}
  virtual void on_before_backward(Trainer&, const cstorch::Tensor& loss) {}
  virtual void on_after_backward(Trainer&) {}
  virtual void on_before_optimizer_step(Trainer&) {}
  virtual void on_after_optimizer_step(Trainer&) {}
  virtual void on_before_scheduler_step(Trainer&) {}
  virtual void on_after_scheduler_step(Trainer&) {}

  // A checkpoint is being written: add entries to `state` (a map). / One was loaded.
  virtual void on_save_checkpoint(Trainer&, cstorch::State& state) {}
  virtual void on_load_checkpoint(Trainer&, const cstorch::State& state) {}
};

using CallbackPtr = std::shared_ptr<Callback>;
// Callbacks by name (`callbacks: [{Name: {args}}]`).
Registry<CallbackPtr>& callbacks();

}  // namespace modelzoo
