#pragma once
// The library's version and the commit it was built from.

#define CSTORCH_VERSION_MAJOR 0
#define CSTORCH_VERSION_MINOR 5
#define CSTORCH_VERSION_PATCH 0

namespace cstorch {

/// The library's version, "MAJOR.MINOR.PATCH" (the CMake project version). Never fails.
const char* version();

/// The git commit (12 hex digits) the library was configured from, or "unknown" when the
/// source tree was not a git checkout. Read when CMake configured the build: a later commit
/// without a re-configure still reports the earlier one.
const char* git_commit();

/// The variant of the CPU kernels this process runs: "avx512", "avx2" or "x86-64" in a portable
/// build (the best the CPU supports, or the one the environment variable CSTORCH_CPU_KERNELS
/// names: those three or "generic", the baseline), "native" in a build tuned for its machine
/// (CSTORCH_NATIVE=ON). Chosen at the first call (or the first kernel run) and kept for the
/// process. Throws cstorch::Error when CSTORCH_CPU_KERNELS names a variant this build lacks or
/// this CPU cannot run.
const char* cpu_kernels();

}  // namespace cstorch
