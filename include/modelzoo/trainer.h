// modelzoo::Trainer: the YAML-driven training loop (keys: docs/trainer.md).
//
//   trainer:
//     init: {device | backend, model_dir, seed, model, optimizer, schedulers, precision, loop,
//            checkpoint, logging, callbacks, loggers}
//     fit: {train_dataloader, val_dataloader, ckpt_path}
//     validate: {val_dataloader, ckpt_path}
//     validate_all: {val_dataloaders, ckpt_paths}
//
// A file may hold one `trainer:` map or a list of `{trainer: ...}` phases, run in order.
// Every invalid input is a cstorch::Error naming its key path.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cstorch/amp.h"
#include "cstorch/backend.h"
#include "cstorch/optim/lr_scheduler.h"
#include "cstorch/optim/optimizer.h"
#include "cstorch/state.h"
#include "modelzoo/callback.h"
#include "modelzoo/loggers.h"
#include "modelzoo/model.h"

namespace cstorch::metrics {
class Metric;
}

namespace modelzoo {

// trainer.init.loop
struct LoopConfig {
  std::optional<int64_t> num_steps, max_steps, num_epochs, steps_per_epoch;
  int64_t eval_frequency = 0;         // validate every N training steps (0: only when asked)
  std::optional<int64_t> eval_steps;  // batches per validation (default: the whole loader)
  int64_t grad_accum_steps = 1;       // micro-batches per optimizer step
};

// trainer.init.checkpoint
struct CheckpointConfig {
  int64_t steps = 0;  // save every N steps and at the end (0: only at the end)
  bool autoload_last_checkpoint = true;
  bool save_initial_checkpoint = false;
  int64_t keep_last = 0;  // keep the newest N checkpoints (0: keep all)
  bool save_at_end = true;
};

// trainer.init.logging
struct LoggingConfig {
  int64_t log_steps = 1;  // log loss and learning rate every N steps
};

class PrecisionCallback;

class Trainer {
 public:
  // From the `trainer.init` map; `view.path()` prefixes error messages.
  explicit Trainer(const ConfigView& init);
  // The checks of an init section that need nothing built or read: its keys and its loop,
  // checkpoint and logging sections (the errors a Trainer built from it would raise). run_config
  // runs them for every phase before the first one starts.
  static void check_init_config(const ConfigView& init);
  // The code form with a backend object (cstorch::backend(...)): `init` then names neither
  // `device` nor `backend` (both given is an error, as in the YAML form). The backend's
  // cluster_config is read when the Trainer is made, so changing it between two Trainers
  // (backend->options().cluster_config.num_csx = 2) takes effect for the second.
  Trainer(const ConfigView& init, std::shared_ptr<cstorch::Backend> backend);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains on `train` (validating on `val` every eval_frequency steps when given). Resumes
  // from `ckpt_path`, else from the latest checkpoint in model_dir (autoload).
  void fit(DataLoaderPtr train, DataLoaderPtr val = nullptr,
           std::optional<std::string> ckpt_path = std::nullopt);
  // One pass over `val` (eval_steps batches), after loading `ckpt_path` if given. Returns the
  // mean loss and logs it with every metric the model updated.
  double validate(DataLoaderPtr val, std::optional<std::string> ckpt_path = std::nullopt);
  // validate() for each checkpoint (default: every checkpoint in model_dir, oldest first).
  std::vector<double> validate_all(DataLoaderPtr val, std::vector<std::string> ckpt_paths = {});

  // Components.
  Model& model() { return *model_; }
  ModelPtr model_ptr() { return model_; }
  cstorch::optim::Optimizer* optimizer() { return optimizer_.get(); }
  const std::vector<std::shared_ptr<cstorch::optim::lr_scheduler::LRScheduler>>& schedulers() {
    return schedulers_;
  }
  cstorch::amp::GradScaler* grad_scaler();
  const std::shared_ptr<cstorch::Backend>& backend() const { return backend_; }
  const std::string& model_dir() const { return model_dir_; }
  const LoopConfig& loop() const { return loop_; }
  const CheckpointConfig& checkpoint_config() const { return ckpt_; }
  int64_t global_step() const { return global_step_; }
  // Optimizer steps the current (or last) fit() runs.
  int64_t run_steps() const { return run_steps_; }
  // Multi-replica data parallel (cstorch/distributed.h): the replicas this trainer trains on
  // (the CSX backend's cluster_config.num_csx; 1 otherwise), whether this process is one of
  // them (processes of a larger launch sit the trainer out: fit and validate return at once),
  // and the shards of the optimizer state (ZeRO-1: min(max_wgt_servers or the replicas, the
  // replicas, the parameters); each replica keeps and updates only its shard's parameters,
  // whose new values then reach every replica through an all-reduce in the step).
  int num_replicas() const { return replicas_; }
  bool is_replica() const { return participating_; }
  int num_optimizer_shards() const { return num_shards_; }
  void add_callback(CallbackPtr cb);
  const std::vector<CallbackPtr>& callbacks() const { return callbacks_; }

  // Values from the traced training step. Called from a hook that runs inside the traced
  // step (on_before_forward ... on_after_scheduler_step), add_step_output makes `value` an
  // output of the step under `name`; from then on step_output(name) is the latest optimizer
  // step's value (not yet computed when the batch hooks run: read it in a cstorch::step_closure).
  // Errors: called outside the traced step, a name added twice in one step.
  void add_step_output(const std::string& name, const cstorch::Tensor& value);
  bool has_step_output(const std::string& name) const;
  // Errors: no step output `name` (the error lists the known names).
  const cstorch::Tensor& step_output(const std::string& name) const;

  // Sends scalars for global step `step` to the run's loggers (metrics files, TensorBoard).
  // Only the main process logs; elsewhere this does nothing. Host values: call it outside the
  // traced step (e.g. from a step closure).
  void log_metrics(int64_t step, const Scalars& metrics);
  // The latest validation's results: "eval/loss" (the mean loss) and "eval/<name>" for every
  // metric the model updated. Empty before the first validation.
  const Scalars& last_validation_metrics() const { return last_val_; }
  // The names a validation reports (before any has run): "eval/loss" and "eval/<name>" of each
  // metric the model updates. Callbacks that watch a result check its name against these.
  std::vector<std::string> validation_result_names() const;
  // Whether the fit in progress validates (fit() was given a validation dataloader); set
  // before on_fit_start.
  bool fit_validates() const { return fit_validates_; }
  // The latest logged training loss (NaN before the first logged step).
  double last_train_loss() const;

  // Asks fit() to stop: the loop ends after the step (or validation) in progress, saves a
  // checkpoint (when checkpoint.save_at_end, the default) and prints "stopping early at step
  // N: <reason>". Callable from any client-side hook (not from a step closure).
  void request_stop(const std::string& reason);
  bool stop_requested() const { return stop_requested_; }
  // A pinned checkpoint is never deleted by checkpoint.keep_last (KeepBestCheckpoints pins the
  // best ones); unpinning makes it count again.
  void pin_checkpoint(const std::string& path, bool pinned);
  // The global step of the latest checkpoint this Trainer wrote (-1: none yet); the same on
  // every replica.
  int64_t last_saved_step() const { return last_saved_step_; }

  // The run record (model_dir/run_records/): what fit() and validate() record besides the
  // init map. `config` replaces the recorded config (run_config hands over the whole phase, as
  // received after command-line overrides; default {init: <the init map>}).
  void set_run_config(const Config& config) { run_config_ = config; }

  // The full training state under the checkpoint keys model, optimizer, schedulers,
  // grad_scaler, dataloader and global_step. With several replicas it
  // is collective (every replica calls it): the sharded optimizer state and every replica's
  // data position (`dataloader: {replicas: [...]}`) are gathered on the main process; the
  // other processes get a state without them.
  cstorch::State state_dict();
  void load_state_dict(const cstorch::State& state);
  // Writes model_dir/checkpoint_{global_step}.mdl now (waits for pending steps).
  std::string save_checkpoint();
  void load_checkpoint(const std::string& path);
  // Checkpoint files in model_dir, oldest step first.
  std::vector<std::pair<int64_t, std::string>> checkpoints() const;

  // Calls `hook` on every callback in order.
  template <class F>
  void each(F&& hook) {
    for (auto& cb : callbacks_) hook(*cb);
  }

 private:
  cstorch::State collect_state();
  void setup_replicas();
  cstorch::State optimizer_state();
  void load_optimizer_state(const cstorch::State& full);
  void load_optimizer_groups(const cstorch::State& full);
  void sync_sharded_params();
  void combine_validation(double& sum, double& weight);
  // Model::check_batch_values on a batch of `dl`; its error gains the step (with val_batch >= 0:
  // the validation of `step` and its batch, from 1) and the data.
  void check_batch(const cstorch::Batch& batch, const cstorch::utils::data::DataLoader& dl,
                   int64_t step, int64_t val_batch) const;
  std::string validation_result_name(const cstorch::metrics::Metric& m) const;
  void write_run_metadata();
  struct RunRecord;
  void begin_run(const char* mode, const std::string& details);
  void end_run(const char* status);
  void print_header(const char* mode, cstorch::utils::data::DataLoader* train,
                    cstorch::utils::data::DataLoader* val, int64_t total_steps);
  void print_summary(const char* mode, const RunRecord& r, double wall_s, const char* status);
  std::unique_ptr<RunRecord> record_;
  Config run_config_;
  Scalars last_val_;
  bool stop_requested_ = false;
  bool fit_validates_ = false;
  std::string stop_reason_;
  int64_t last_saved_step_ = -1;
  int64_t validated_step_ = -1;
  std::vector<std::string> pinned_;
  std::vector<std::pair<std::string, cstorch::Tensor>>* collecting_ = nullptr;
  std::vector<std::string> step_output_names_;
  std::vector<cstorch::Tensor> step_outputs_;
  int replicas_ = 1;
  bool participating_ = true;
  int num_shards_ = 1;
  std::vector<int> param_owner_;       // shard of every model parameter (sharded optimizer)
  std::vector<int64_t> shard_params_;  // this replica's parameters (indices), when sharded
  std::string write_checkpoint(int64_t step, cstorch::State state);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<cstorch::Backend> backend_;
  cstorch::ClusterConfig cluster_;  // the backend's as the Trainer was made
  ModelPtr model_;
  std::unique_ptr<cstorch::optim::Optimizer> optimizer_;
  std::vector<std::shared_ptr<cstorch::optim::lr_scheduler::LRScheduler>> schedulers_;
  std::vector<std::string> scheduler_paths_;  // each one's YAML key path, for its errors
  std::shared_ptr<PrecisionCallback> precision_;
  std::string model_dir_;
  std::string cs_ip_;  // trainer.init.cs_ip: recorded in run_metadata.json only
  LoopConfig loop_;
  CheckpointConfig ckpt_;
  LoggingConfig logging_;
  std::vector<CallbackPtr> callbacks_;
  int64_t global_step_ = 0;
  int64_t run_steps_ = 0;
  uint64_t seed_ = 0;
  cstorch::utils::data::DataLoader* train_loader_ = nullptr;  // during fit()
  std::optional<cstorch::State> pending_loader_state_;        // from a checkpoint, for fit()
  bool warned_loader_state_ = false;
};

// Loggers by name (`loggers: [{TensorBoard: {log_dir}}, {CSV: {file}}, {JSONLines: {file}}]`);
// every factory also receives `model_dir` (defaults: model_dir/tensorboard,
// model_dir/metrics.csv, model_dir/metrics.jsonl).
using LoggerPtr = std::shared_ptr<Logger>;
Registry<LoggerPtr>& loggers();

// Which phase methods run_config calls.
enum class Mode { Fit, Validate, ValidateAll };

// Overrides from the command line, applied to every phase's init.
struct RunOverrides {
  std::optional<std::string> model_dir;
  std::optional<std::string> checkpoint_path;
  bool compile_only = false;   // compile the step, write the report, do not train
  bool validate_only = false;  // trace and check the step only
  // Called with each phase's Trainer once it is built (the runner adapter attaches its hooks).
  std::function<void(Trainer&)> on_trainer;
};

// The `backend` map of a trainer.init map, made from its `device` (default CPU) when the init
// names none, so that command-line options can set backend fields.
Config& backend_entry(Config& init);

// Sets a phase's init map as `overrides` say: model_dir, and compile_only / validate_only as
// backend options (a `device` becomes a `backend`). run_config does this for every phase.
void apply_run_overrides(Config& init, const RunOverrides& overrides);

// The command line recorded in run records (cszoo hands over its argv; programs that embed
// the Trainer may too). Default: empty (the record then says null).
void set_run_command_line(std::vector<std::string> argv);
const std::vector<std::string>& run_command_line();

// Runs every phase of a config (the root map holding `trainer`); errors name key paths.
void run_config(const Config& root, Mode mode, const RunOverrides& overrides = {});

}  // namespace modelzoo
