// What every CUDA kernel of the table (runtime/*.cpp) does before it queues work, and the small
// conversions they share. CUDA builds only.
#pragma once
#include <string>

#include "backend/cuda/capabilities.h"
#include "backend/cuda/kernels/launch.h"
#include "backend/cuda/runtime/backend.h"
#include "cstorch/core/error.h"

namespace cstorch::cuda {

// The device current on this thread and the node checked: compile time already refused what
// cannot run; this keeps an eager call just as safe.
inline const CudaBackend& enter(const ir::KernelContext& ctx, const ir::Node& n) {
  const CudaBackend& b = cuda_backend(ctx);
  b.make_current();
  if (std::string why = unsupported(n); !why.empty())
    fail("op '{}' cannot run on device GPU:{}: {}", n.name(), b.index(), why);
  return b;
}

// The kernels' element type of a dtype; an error naming the op for dtypes no kernel reads.
inline k::Ty ty(DType t, const char* op) {
  switch (t) {
    case DType::f32:
      return k::Ty::f32;
    case DType::i32:
      return k::Ty::i32;
    case DType::i64:
      return k::Ty::i64;
    case DType::boolean:
      return k::Ty::b8;
    case DType::bf16:
      return k::Ty::bf16;
    case DType::f16:
      return k::Ty::f16;
  }
  fail("{}: dtype {} has no CUDA kernel", op, dtype_name(t));
}

inline const float* f(const void* p) {
  return static_cast<const float*>(p);
}

}  // namespace cstorch::cuda
