// The CPU backend object: host memory, the cpu_<Name> kernel table, the CPU's thread settings
// and its answers to the compiler's capability questions.
#pragma once
#include "ir/device.h"

namespace cstorch::cpu {

const ir::DeviceBackend& backend();

// Scratch bytes a kernel of this folder needs for `n` (attention tiles, packed GEMM panels,
// widened 16-bit GEMM operands), for a team of at most `threads` threads.
size_t workspace_bytes(const ir::Node& n, int threads);
// The team size workspaces are planned for: the larger of the configured thread count and the
// machine's processors, so that raising the thread count later never outgrows a plan.
int workspace_threads();

}  // namespace cstorch::cpu
