// The built-in user callbacks, named in YAML under trainer.init.callbacks (guide:
// docs/callbacks.md):
//
//   callbacks:
//     - EarlyStopping: {monitor: eval/loss, mode: min, patience: 3, min_delta: 0.0}
//     - KeepBestCheckpoints: {monitor: eval/accuracy, mode: max, k: 2}
//     - LRMonitor: {every_n_steps: 10}
//     - GradNormLogger: {every_n_steps: 10}
//
// Each factory checks its arguments: an unknown key is an error naming its key path and the
// valid keys; a bad value names its key path. They can also be made in code and given to
// Trainer::add_callback.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "modelzoo/callback.h"
#include "modelzoo/config_view.h"

namespace modelzoo {

// Whether a monitored value improves downwards (loss) or upwards (accuracy).
enum class MonitorMode { Min, Max };

// Stops fit() when the validation value `monitor` (a key of
// Trainer::last_validation_metrics(): eval/loss, eval/<metric>) has not improved by more than
// `min_delta` for `patience` validations in a row. The stop ends training after that
// validation, saves a checkpoint (checkpoint.save_at_end) and prints "stopping early at step
// N: ...". A validation without `monitor` is an error listing the values it has.
class EarlyStopping : public Callback {
 public:
  struct Options {
    std::string monitor = "eval/loss";
    MonitorMode mode = MonitorMode::Min;
    int64_t patience = 3;     // validations without improvement before stopping (>= 1)
    double min_delta = 0;     // an improvement must exceed this (>= 0), in the monitor's units
    std::string monitor_key;  // where the monitor was configured, for errors ("" from code)
  };
  explicit EarlyStopping(Options o) : o_(std::move(o)) {}
  std::string name() const override { return "EarlyStopping"; }
  void on_fit_start(Trainer&) override;
  void on_fit_end(Trainer&) override { in_fit_ = false; }
  void on_fit_exception(Trainer&, const std::exception&) override { in_fit_ = false; }
  void on_validate_end(Trainer&) override;
  // Validations since the last improvement, and the best value so far.
  int64_t wait() const { return wait_; }
  double best() const { return best_; }

 private:
  Options o_;
  bool in_fit_ = false;
  int64_t wait_ = 0;
  double best_ = std::numeric_limits<double>::quiet_NaN();
};

// Keeps the `k` best checkpoints by a validation value. At each validation during fit() the
// checkpoint of that step is ranked (the callback saves it when the run has not, and the value
// makes the top k); checkpoints that fall out of the top k are deleted when this callback
// wrote them. It never deletes a checkpoint the run saved itself (checkpoint.steps, the end of
// training), nor the newest checkpoint in model_dir (the one a resumed run starts from). The
// top k are pinned (checkpoint.keep_last does not delete them) and listed, best first, in
// model_dir/best_checkpoints.json ({"monitor", "mode", "best": [{"step", "path", "value"}]}),
// which a resumed run reads to continue the ranking.
class KeepBestCheckpoints : public Callback {
 public:
  struct Options {
    std::string monitor = "eval/loss";
    MonitorMode mode = MonitorMode::Min;
    int64_t k = 1;            // >= 1
    std::string monitor_key;  // where the monitor was configured, for errors ("" from code)
  };
  explicit KeepBestCheckpoints(Options o) : o_(std::move(o)) {}
  std::string name() const override { return "KeepBestCheckpoints"; }
  void on_train_start(Trainer&) override;
  void on_fit_end(Trainer&) override;
  void on_fit_exception(Trainer&, const std::exception&) override { active_ = false; }
  void on_validate_end(Trainer&) override;

  struct Entry {
    int64_t step;
    std::string path;
    double value;
    bool created;  // written by this callback (so it may delete it)
  };
  const std::vector<Entry>& best() const { return best_; }

 private:
  void write_index(Trainer&) const;
  void delete_dropped(Trainer&);
  Options o_;
  bool active_ = false;
  std::vector<Entry> best_;
  std::vector<std::string> dropped_;  // created by us, out of the top k, not yet deletable
};

// Logs the learning rate of every parameter group every `every_n_steps` optimizer steps, as
// "lr/group_<i>" (the rate the step used), to the run's loggers.
class LRMonitor : public Callback {
 public:
  explicit LRMonitor(int64_t every_n_steps) : every_(every_n_steps) {}
  std::string name() const override { return "LRMonitor"; }
  void on_before_forward(Trainer&, const cstorch::Batch&) override;
  void on_train_batch_end(Trainer&, const cstorch::Tensor& loss, int64_t step) override;

 private:
  int64_t every_;
  size_t groups_ = 0;
};

// Logs the global L2 norm of the gradients (all parameters together, before clipping, with
// any loss scale divided out) as "grad_norm" every `every_n_steps` optimizer steps. The norm
// is computed inside the traced step (on_before_optimizer_step) and read in a step closure.
class GradNormLogger : public Callback {
 public:
  explicit GradNormLogger(int64_t every_n_steps) : every_(every_n_steps) {}
  std::string name() const override { return "GradNormLogger"; }
  void on_before_optimizer_step(Trainer&) override;
  void on_train_batch_end(Trainer&, const cstorch::Tensor& loss, int64_t step) override;

 private:
  int64_t every_;
};

}  // namespace modelzoo
