#include "cstorch/version.h"

#include "cstorch_git_commit.h"  // generated at build time (cmake/git_commit.cmake)

namespace cstorch {

const char* version() {
  return CSTORCH_VERSION_STRING;
}
const char* git_commit() {
  return CSTORCH_GIT_COMMIT;
}

}  // namespace cstorch
