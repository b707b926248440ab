// How traced steps run under the current backend's options: executed, or stopped after
// compiling (compile_only) or after tracing (validate_only) with a report written instead.
#pragma once
#include <string>

namespace cstorch::runtime {

enum class RunMode { Execute, CompileOnly, ValidateOnly };
// The mode of the current backend (Execute when none exists); fills `artifact_dir` if given.
RunMode current_run_mode(std::string* artifact_dir = nullptr);

}  // namespace cstorch::runtime
