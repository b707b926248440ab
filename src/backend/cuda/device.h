// The CUDA backend's entry points for the backend registry (src/backend/registry.cpp). In a build
// without CSTORCH_CUDA, built() is false and the other two are never called (stubs.cpp); in a
// CUDA build they are defined in device.cu over the process's DeviceTable.
#pragma once
#include "ir/device.h"

namespace cstorch::cuda {

// Whether this binary has the CUDA backend.
bool built();
// The backend of GPU:index. Errors (cstorch::Error): no usable CUDA device (names the reason the
// runtime gave), an index out of range (names the devices there are).
const ir::DeviceBackend& backend(int index);
// Null instead of an error.
const ir::DeviceBackend* find_backend(int index);
// The number of usable CUDA devices (0 without the backend, a driver or a device).
int device_count();

}  // namespace cstorch::cuda
