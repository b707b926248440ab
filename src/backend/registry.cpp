// The kernel tables of the backends built into this binary. The core reaches kernels only
// through kernels_for(); it never includes a backend header.
#include "backend/cpu/kernels.h"
#include "cstorch/core/error.h"

namespace cstorch::ir {

static const KernelTable kCpuTable = {{
#define OP(Name, str, Attr, tr) &cpu::cpu_##Name,
#include "ir/ops.def"
#undef OP
}};

const KernelTable& kernels_for(DeviceType t) {
  if (t == DeviceType::CPU || t == DeviceType::CSX) return kCpuTable;
  fail("device type {} has no kernels in this build (the CUDA backend is not built)",
       device_type_name(t));
}

}  // namespace cstorch::ir
