// Kernels of the recomputation ops and of After. All are aliases (eager mode and the memory planner
// share the input's storage), so these copies only serve a program whose planner cannot alias.
#include <cstring>

#include "backend/cpu/kernels.h"

namespace cstorch::cpu {

void cpu_RecomputeBarrier(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                          void* out) {
  std::memcpy(out, in[0], n.nbytes());
}
void cpu_Recompute(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                   void* out) {
  std::memcpy(out, in[0], n.nbytes());
}
// After (fuse_gemm_epilogue's ordering alias) is an alias in the same way.
void cpu_After(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  if (out != in[0]) std::memcpy(out, in[0], n.nbytes());
}

}  // namespace cstorch::cpu
