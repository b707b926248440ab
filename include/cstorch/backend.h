// Backends and compile(). One backend type per process (CPU, GPU or CSX); the same backend
// object may be fetched again and reused. compile() prepares a model for tracing; compilation
// itself happens on the first traced call, when shapes are known.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cstorch/nn/module.h"

namespace cstorch {

// Cluster settings of the CSX backend; validated, recorded in run metadata.
struct ClusterConfig {
  int num_csx = 1;
  int max_wgt_servers = 24;
  int max_act_per_csx = 1;
  int num_workers_per_csx = 1;
  std::vector<std::string> mount_dirs;
  std::vector<std::string> python_paths;
  int transfer_processes = 5;
  std::vector<std::string> job_labels;
  std::string mgmt_address;
  // Seconds a collective may wait for the other replicas before the whole launch is stopped
  // with a message (a replica that hangs or was stopped, e.g. by SIGSTOP). 0: the environment
  // variable CSTORCH_COLLECTIVE_TIMEOUT_S, else 300 s. Must be finite and >= 0.
  double collective_timeout_s = 0;
};

struct BackendOptions {
  std::string artifact_dir = "./cerebras_logs";
  std::string compile_dir;     // CSX: where compile artefacts go
  bool compile_only = false;   // compile, write artefacts, do not run
  bool validate_only = false;  // trace and check only
  ClusterConfig cluster_config;
};

class Backend {
 public:
  Backend(DeviceType type, BackendOptions opts);
  DeviceType type() const { return type_; }
  // The device steps run on: the CPU for CPU and CSX; for a GPU, GPU:(distributed::local_rank()
  // mod the GPUs this process can use), so that replicas on one host use different GPUs.
  Device device() const { return device_; }
  const BackendOptions& options() const { return opts_; }
  BackendOptions& options() { return opts_; }
  std::string type_name() const { return device_type_name(type_); }

 private:
  DeviceType type_;
  BackendOptions opts_;
  Device device_;
};

// Creates (or returns) the process's backend. `type` is "CPU", "GPU" or "CSX", any case.
// A second backend of another type fails with exactly:
//   Cannot instantiate multiple backends. A backend with type CPU has already been instantiated.
// Calling it again with the same type returns the existing backend (new options replace the
// old ones only for cluster_config; other differing options are an error naming them).
std::shared_ptr<Backend> backend(const std::string& type, BackendOptions opts = {});
// The current backend; error if none was created.
std::shared_ptr<Backend> backend();

// The older one-call setup (`cstorch.configure(...)` in Python), with the defaults below. It
// creates the CSX backend (this project's cluster: `num_csx` replicas) with these
// options. Calling it a second time in a process is an error, and so is calling it after a
// backend of another type exists.
//
// checkpoint_steps (k >= 0): the default checkpoint_steps of every DataExecutor and of the loop
// of a range-for over a DataLoader. It decides at which steps weights may be fetched: a
// checkpoint_closure, or cstorch::save() inside a step closure, works only at the loop's
// checkpoint steps (a DataExecutor: k-1, 2k-1, ...; a range-for over a DataLoader: 0, k, 2k,
// ...; both: the last step; k = 0: the last step only) and is refused elsewhere with an error
// that says so (see cstorch/utils/data.h, cstorch/checkpoint.h).
//
// model_dir: where the run's artefacts go. Checkpoints saved by a relative path are written
// there, and a load by a relative path looks there first (cstorch/checkpoint.h); the backend's
// artifact_dir (the compile_only / validate_only reports) is <model_dir>/cerebras_logs.
//
// compile_dir: where each compiled program's report is kept. The default
// (/opt/cerebras/cached_compile, or the site's: $CSTORCH_DEFAULT_COMPILE_DIR) is used where this
// process can write it or create it; elsewhere (a user without rights in /opt) configure() falls
// back to <model_dir>/cached_compile with one warning on stderr naming both paths. Any other
// compile_dir is used as given.
inline constexpr const char* kDefaultCompileDir = "/opt/cerebras/cached_compile";
struct ConfigureOptions {
  std::string model_dir = "./";
  std::string compile_dir = kDefaultCompileDir;
  bool compile_only = false;
  bool validate_only = false;
  int64_t checkpoint_steps = 0;
  int num_csx = 1;
  int max_wgt_servers = 24;
  std::vector<std::string> mount_dirs;
  std::vector<std::string> python_paths;
  int transfer_processes = 5;
  int num_workers_per_csx = 1;
  std::vector<std::string> job_labels;
  int max_act_per_csx = 1;
  std::string mgmt_address;
};
std::shared_ptr<Backend> configure(const ConfigureOptions& opts);
// The options configure() was called with, or null when it was not.
const ConfigureOptions* configured();

// A model prepared for the backend: call it like the module.
class CompiledModel {
 public:
  CompiledModel(std::shared_ptr<nn::Module> m, std::shared_ptr<Backend> b)
      : m_(std::move(m)), b_(std::move(b)) {}
  Tensor operator()(const Tensor& x) const { return m_->forward(x); }
  nn::Module* operator->() const { return m_.get(); }
  const std::shared_ptr<nn::Module>& module() const { return m_; }
  const std::shared_ptr<Backend>& backend() const { return b_; }

 private:
  std::shared_ptr<nn::Module> m_;
  std::shared_ptr<Backend> b_;
};

// Moves parameters to the backend's device and returns a callable wrapper. `b` must be the
// current backend (or null for the current one).
CompiledModel compile(std::shared_ptr<nn::Module> model, std::shared_ptr<Backend> b = nullptr);
template <class Holder>
CompiledModel compile(const Holder& model, std::shared_ptr<Backend> b = nullptr) {
  return compile(model.module(), std::move(b));
}

}  // namespace cstorch
