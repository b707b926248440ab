// Shapes and devices.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cstorch {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s);
// The product of dims [from, to) of `s` (dims past its rank count as 1): the element count of a
// run of dims, e.g. the rows before a reduced dim.
int64_t numel(const Shape& s, int64_t from, int64_t to);
std::string shape_str(const Shape& s);  // "[2, 3]"
// Normalises a possibly negative dim against rank `ndim`; error names `op` on out-of-range.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);

// Where a tensor's memory lives and its kernels run. CSX is this project's simulated cluster:
// its tensors live on the CPU device. Plugin is the slot of a backend registered at run time
// (ir::register_device_backend; the tests register a checking device there), named by it.
enum class DeviceType : uint8_t { CPU, GPU, CSX, Plugin };
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
};
// "CPU", "GPU", "CSX", or the registered plugin backend's name ("PLUGIN" when none is).
const char* device_type_name(DeviceType t);
// "CPU", "GPU:1", "check:0": the type name, and the index where it is not 0 or the type is not
// the CPU.
std::string device_str(Device d);
// Parses "cpu", "gpu", "gpu:1", or a registered plugin's name (any case); error names `s`.
Device parse_device(const std::string& s);

}  // namespace cstorch
