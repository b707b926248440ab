// The CUDA backend's registry entry points in a build without it (CSTORCH_CUDA off): the
// registry then reports that the binary was built without CUDA. Compiled only when CSTORCH_CUDA
// is off (CMakeLists.txt); a CUDA build defines these in device.cu.
#include "backend/cuda/device.h"
#include "cstorch/core/error.h"

namespace cstorch::cuda {

bool built() {
  return false;
}
const ir::DeviceBackend& backend(int index) {
  fail("device GPU:{}: this binary was built without the CUDA backend", index);
}
const ir::DeviceBackend* find_backend(int) {
  return nullptr;
}
int device_count() {
  return 0;
}

}  // namespace cstorch::cuda
