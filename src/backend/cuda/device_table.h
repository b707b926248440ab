// Which CUDA devices this process may use, and their backend objects: plain C++ (built and
// unit-tested in every configuration). The CUDA build gives it a probe that asks the runtime for
// the device count and a factory that makes a device's backend (device.cu); tests give fakes.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ir/device.h"

namespace cstorch::cuda {

class DeviceTable {
 public:
  // `probe` returns the number of usable devices, or -1 and a reason (the driver is missing, no
  // device) in *why; it runs once, on the first request. `make` creates the backend of one index
  // (it may throw cstorch::Error); each index is created at most once and kept for the process.
  using Probe = std::function<int(std::string* why)>;
  using Factory = std::function<std::shared_ptr<const ir::DeviceBackend>(int index)>;
  DeviceTable(Probe probe, Factory make);

  // The backend of GPU:index. Errors: no usable device (with the probe's reason), an index out of
  // range (naming the devices there are).
  const ir::DeviceBackend& get(int index);
  // The number of usable devices (0 when the probe failed).
  int count();

 private:
  void probe_locked();
  Probe probe_;
  Factory make_;
  std::mutex mu_;
  bool probed_ = false;
  int count_ = 0;
  std::string why_;
  std::vector<std::shared_ptr<const ir::DeviceBackend>> backends_;
};

}  // namespace cstorch::cuda
