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

}  // namespace cstorch
