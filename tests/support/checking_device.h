// The checking device: a device backend that only the tests register (as a plugin device named
// "check"). Its memory is host memory that host code must not touch: the whole pool is kept
// inaccessible (PROT_NONE) except while one of its own kernels or transfer functions runs, so a
// stray host read or write of device memory faults at once, and the fault handler names it. Its
// kernels are the CPU kernels called through the device ABI, so results on it must be bitwise
// those on the CPU. A backend that passes the suite on it keeps every host touch explicit.
#pragma once
#include <cstdint>
#include <vector>

#include "cstorch/core/shape.h"

namespace cstorch::testing {

// Registers the checking device (idempotent). Returns its Device (Plugin, index 0).
Device register_checking_device();

struct CheckingDeviceStats {
  int64_t kernels = 0;       // kernel calls on the device
  int64_t to_host = 0;       // copies device -> host
  int64_t from_host = 0;     // copies host -> device
  int64_t bytes_in_use = 0;  // allocated and not freed
  int64_t clock_marks = 0;   // KernelClock::mark calls (the profile's clock)
};
CheckingDeviceStats checking_device_stats();
// Kernel calls on the device so far, per op (index: the ir::OpCode): which ops really ran there,
// compiler-made ones (fused, gemm) included.
std::vector<int64_t> checking_device_kernel_calls();

}  // namespace cstorch::testing
