// Shapes and devices.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cstorch {

using Shape = std::vector<int64_t>;

int64_t numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3]"
// Normalises a possibly negative dim against rank `ndim`; error names `op` on out-of-range.
int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op);

enum class DeviceType : uint8_t { CPU, GPU, CSX };
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
};
const char* device_type_name(DeviceType t);  // "CPU", "GPU", "CSX"

}  // namespace cstorch
