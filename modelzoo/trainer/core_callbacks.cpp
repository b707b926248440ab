// Logging and checkpoint callbacks.
#include "modelzoo/trainer/core_callbacks.h"

#include "cstorch/runtime.h"
#include "modelzoo/trainer.h"

namespace modelzoo {

void LoggingCallback::on_step_outputs(Trainer& t, const cstorch::Tensor& loss,
                                      const cstorch::Tensor& lr) {
  const int64_t step = t.global_step();
  if (step % log_steps_ != 0) return;
  auto print = cstorch::step_closure([step](const cstorch::Tensor& l, const cstorch::Tensor& r) {
    fmt::print("step {:6d}  loss {:.5f}  lr {:.4g}\n", step, l.item<float>(), r.item<float>());
    std::fflush(stdout);
  });
  print(loss, lr);
}

void LoggingCallback::on_validation_result(Trainer& t, double mean_loss) {
  fmt::print("validation at step {}: loss {:.5f}\n", t.global_step(), mean_loss);
  std::fflush(stdout);
}

void CheckpointCallback::on_train_start(Trainer& t) {
  if (t.checkpoint_config().save_initial_checkpoint && t.global_step() == 0) t.save_checkpoint();
}

void CheckpointCallback::on_checkpoint_step(Trainer& t) {
  t.save_checkpoint();
}

}  // namespace modelzoo
