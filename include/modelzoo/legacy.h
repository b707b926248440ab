// The legacy interfaces (the `run` entry point and its runners, params.yaml), as adapters over
// the Trainer:
//
// - legacy `params.yaml` files (`train_input`, `eval_input`, `model`, `optimizer`,
//   `runconfig`) convert to the Trainer form (convert_legacy_params);
// - the runner API: a runner is built by `BaseRunner::create` (a CPU/GPU runner, a
//   compile-only runner, or a system runner; custom runners register a factory) and exposes
//   the twelve hooks, which an adapter callback calls from the Trainer's loop. End hooks run
//   only after a successful finish.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "modelzoo/trainer.h"

namespace modelzoo {

// True when `root` looks like a legacy params file (has `runconfig` or `train_input`).
bool is_legacy_params(const Config& root);
// The Trainer form of a legacy params file. `mode` is train | eval | train_and_eval |
// eval_all (runconfig.mode when empty). Errors name the legacy key path.
Config convert_legacy_params(const Config& params, const std::string& mode = "");
// The legacy params key a key path of the converted config comes from, for errors about a
// legacy file: "trainer.init.loop.max_steps" -> "runconfig.max_steps", "trainer.init.schedulers"
// -> "optimizer.learning_rate", "trainer.fit.train_dataloader.batch_sise" ->
// "train_input.batch_sise"; "" for a path that no legacy key makes.
std::string legacy_key_of(const std::string& converted_path);

class BaseRunner {
 public:
  explicit BaseRunner(Config params) : params_(std::move(params)) {}
  virtual ~BaseRunner() = default;
  virtual std::string name() const = 0;

  // The runner hooks. Subclasses should call the base version.
  virtual void on_train_start() {}
  virtual void on_train_end() {}
  virtual void on_eval_start() {}
  virtual void on_eval_end() {}
  virtual void on_train_epoch_start() {}
  virtual void on_train_epoch_end() {}
  virtual void on_eval_epoch_start() {}
  virtual void on_eval_epoch_end() {}
  virtual void on_train_batch_start() {}
  virtual void on_train_batch_end() {}
  virtual void on_eval_batch_start() {}
  virtual void on_eval_batch_end() {}

  // Runs `mode` (train, eval, train_and_eval, eval_all) through the Trainer with this runner's
  // hooks attached.
  void run(const std::string& mode, const RunOverrides& overrides = {});
  const Config& params() const { return params_; }

  using Factory = std::function<std::unique_ptr<BaseRunner>(const Config& params)>;
  // Builds the runner for a legacy params map: a registered custom runner named by
  // `runconfig.runner`, else the compile-only runner when compile_only or validate_only is
  // set, the system runner for a CSX target device, and the CPU/GPU runner otherwise.
  static std::unique_ptr<BaseRunner> create(const Config& params,
                                            const RunOverrides& overrides = {});
  // Registers a custom runner under `name` (what `runconfig.runner` selects).
  static void register_runner(const std::string& name, Factory f);

 protected:
  Config params_;
};

// The predefined runners (PyTorchRunner, PyTorchCSCompiler, PyTorchCSRunner in Python).
class CpuGpuRunner : public BaseRunner {
 public:
  using BaseRunner::BaseRunner;
  std::string name() const override { return "PyTorchRunner"; }
};
class CompileOnlyRunner : public BaseRunner {
 public:
  using BaseRunner::BaseRunner;
  std::string name() const override { return "PyTorchCSCompiler"; }
};
class SystemRunner : public BaseRunner {
 public:
  using BaseRunner::BaseRunner;
  std::string name() const override { return "PyTorchCSRunner"; }
};

}  // namespace modelzoo
