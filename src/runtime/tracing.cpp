// cstorch::is_tracing (runtime.h).
#include "core/internal.h"
#include "cstorch/runtime.h"

namespace cstorch {
bool is_tracing() {
  return detail::in_trace();
}
}  // namespace cstorch
