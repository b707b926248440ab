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

// The Fused kernel's group form (ir::FusedGroupKernel; fused.cpp).
void cpu_fused_group(const ir::KernelContext& ctx, const ir::Node* const* nodes,
                     const void* const* const* in, void* const* out, int count);
// The straight-line loop the Fused kernel runs for node n instead of interpreting its program
// ("moment1", "moment2", "adam_param", "copy_to_bf16"), or null: the interpreter runs it.
const char* cpu_fused_line(const ir::Node& n);

// f32 <-> bf16 over whole arrays as vectorised bit operations, parallel: bitwise bf16_t's
// conversions (round to nearest even, NaNs kept quiet NaNs; elementwise.cpp).
void cast_f32_to_bf16(const float* x, uint16_t* o, int64_t n);
void cast_bf16_to_f32(const uint16_t* x, float* o, int64_t n);

using ir::kMaxDims;

}  // namespace cstorch::cpu
