#include "cstorch/version.h"

namespace cstorch {

const char* version() {
  return CSTORCH_VERSION_STRING;
}
const char* git_commit() {
  return CSTORCH_GIT_COMMIT;
}

}  // namespace cstorch
