// The CUDA devices of this process (see device_table.h): plain C++, built in every configuration.
#include "backend/cuda/device_table.h"

#include "cstorch/core/error.h"

namespace cstorch::cuda {

DeviceTable::DeviceTable(Probe probe, Factory make)
    : probe_(std::move(probe)), make_(std::move(make)) {}

void DeviceTable::probe_locked() {
  if (probed_) return;
  std::string why;
  const int n = probe_(&why);
  probed_ = true;
  count_ = n > 0 ? n : 0;
  why_ = n > 0 ? "" : (why.empty() ? "no CUDA device found" : why);
  backends_.assign(static_cast<size_t>(count_), nullptr);
}

int DeviceTable::count() {
  std::lock_guard<std::mutex> l(mu_);
  probe_locked();
  return count_;
}

const ir::DeviceBackend& DeviceTable::get(int index) {
  std::lock_guard<std::mutex> l(mu_);
  probe_locked();
  if (count_ == 0)
    fail("device GPU:{}: this binary has the CUDA backend, but no CUDA device can be used: {}",
         index, why_);
  CS_CHECK(index >= 0 && index < count_,
           "device GPU:{}: out of range; this machine has {} CUDA device{} (GPU:0{})", index,
           count_, count_ == 1 ? "" : "s",
           count_ == 1 ? "" : fmt::format(" to GPU:{}", count_ - 1));
  auto& b = backends_[static_cast<size_t>(index)];
  if (!b) b = make_(index);
  CS_CHECK(b != nullptr, "device GPU:{}: the CUDA backend could not be created", index);
  return *b;
}

}  // namespace cstorch::cuda
