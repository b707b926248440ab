// The active replica group's communicator, for the collective kernels.
#pragma once
#include "distributed/communicator.h"

namespace cstorch::distributed::detail {

// The communicator of the active replica group (the whole launch until a trainer sets one); an
// error on a process that is not a member.
Communicator& active_group();

}  // namespace cstorch::distributed::detail
