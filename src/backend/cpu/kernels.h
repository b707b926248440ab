// CPU kernel declarations: one `cpu_<Name>` per op of ops.def, defined in the family files of
// this folder. Kernels never allocate on the heap (a traced step runs allocation-free), work
// on contiguous row-major buffers, and parallelise large loops on the shared thread pool.
#pragma once
#include "ir/device.h"

namespace cstorch::cpu {

#define OP(Name, str, Attr, traits)                                                      \
  __attribute__((weak)) void cpu_##Name(const ir::KernelContext& ctx, const ir::Node& n, \
                                        const void* const* in, void* out);
#include "ir/ops.def"
#undef OP

using ir::kMaxDims;

}  // namespace cstorch::cpu
