// CPU kernels for creation ops.
#include "backend/cpu/dtype_dispatch.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "cstorch/core/error.h"

namespace cstorch::cpu {

void cpu_Input(const ir::KernelContext& ctx, const ir::Node& n, const void* const*, void*) {
  fail("internal: input placeholder (node %{}) has no kernel", n.id);
}
void cpu_Constant(const ir::KernelContext& ctx, const ir::Node& n, const void* const*, void*) {
  fail("internal: constant (node %{}) has no kernel", n.id);
}

void cpu_Full(const ir::KernelContext& ctx, const ir::Node& n, const void* const*, void* out) {
  double v = n.attr<ir::FullAttrs>().value;
  int64_t count = n.numel();
  dispatch_all(n.dtype, [&]<class T>(T*) {
    T x = from_double<T>(v);
    T* o = static_cast<T*>(out);
    parallel_for(count, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) o[i] = x;
    });
  });
}

void cpu_Arange(const ir::KernelContext& ctx, const ir::Node& n, const void* const*, void* out) {
  const auto& a = n.attr<ir::ArangeAttrs>();
  int64_t count = n.numel();
  dispatch_all(n.dtype, [&]<class T>(T*) {
    T* o = static_cast<T*>(out);
    for (int64_t i = 0; i < count; ++i)
      o[i] = from_double<T>(a.start + a.step * static_cast<double>(i));
  });
}

}  // namespace cstorch::cpu
