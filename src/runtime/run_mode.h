// How traced steps run under the current backend's options: executed, or stopped after
// compiling (compile_only) or after tracing (validate_only) with a report written instead.
#pragma once
#include <string>

#include "cstorch/core/shape.h"

namespace cstorch::runtime {

enum class RunMode { Execute, CompileOnly, ValidateOnly };
// The mode of the current backend (Execute when none exists). Checked at every traced call.
RunMode current_run_mode();
// The current backend's artifact directory (where compile_only / validate_only reports go).
std::string current_artifact_dir();
// configure()'s model_dir as an absolute path (made so when configure() ran), or empty when
// configure() was not called: checkpoints saved by a relative path go there.
std::string configured_model_dir();
// `path` under configured_model_dir() when configure() was called and `path` is relative, else
// `path` unchanged.
std::string resolve_model_path(const std::string& path);
// The CSX backend's compile_dir (empty for other backends or when unset): every compiled
// program's report is written there.
std::string current_compile_dir();
// The device traced steps run on: the current backend's (CSX: the CPU), the CPU without one;
// inside a StepDeviceScope, that scope's device (on this thread).
Device step_device();
// Forgets the process's backend and configure()'s options, as a new process has neither. Only
// for the unit tests, which run many tests in one process; a program keeps its backend.
void reset_backend_for_tests();
// Overrides step_device() on this thread for its lifetime (the tests compare one step on two
// devices in one process, where the backend is process-wide).
class StepDeviceScope {
 public:
  explicit StepDeviceScope(Device d);
  ~StepDeviceScope();
  StepDeviceScope(const StepDeviceScope&) = delete;
  StepDeviceScope& operator=(const StepDeviceScope&) = delete;

 private:
  bool had_;
  Device prev_;
};

}  // namespace cstorch::runtime
