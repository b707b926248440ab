// The device backends of this process: the ones built into this binary (the CPU, and CUDA when
// configured with CSTORCH_CUDA) and the ones registered at run time (a plugin, such as the tests'
// checking device). The core reaches backends only through ir::device_backend(); this is the one
// file that includes a backend's header.
#include <mutex>

#include "backend/cpu/device.h"
#include "backend/cuda/device.h"
#include "cstorch/config.h"
#include "cstorch/core/error.h"
#include "ir/device.h"

namespace cstorch::ir {

namespace {
std::mutex g_mu;
std::shared_ptr<const DeviceBackend> g_registered[4];  // by DeviceType
// The plugin's name, kept for device_type_name's const char* (registration happens at start-up,
// before devices are named).
std::string* g_plugin_name = new std::string("PLUGIN");

std::shared_ptr<const DeviceBackend> registered(DeviceType t) {
  std::lock_guard<std::mutex> l(g_mu);
  return g_registered[static_cast<int>(t)];
}
}  // namespace

const DeviceBackend* find_device_backend(Device d) {
  if (d.type == DeviceType::CPU || d.type == DeviceType::CSX) return &cpu::backend();
  // Registered backends live until the process ends (or are replaced by a test that owns
  // every buffer of the old one), so the raw pointer stays valid for the caller. A registered
  // GPU backend takes precedence over the built-in CUDA one (tests stand in for it there).
  if (const DeviceBackend* b = registered(d.type).get()) return b;
  if (d.type == DeviceType::GPU && cuda::built()) return cuda::find_backend(d.index);
  return nullptr;
}

int device_count(DeviceType t) {
  if (t == DeviceType::CPU || t == DeviceType::CSX || registered(t)) return 1;
  return t == DeviceType::GPU && cuda::built() ? cuda::device_count() : 0;
}

const DeviceBackend& device_backend(Device d) {
  if (const DeviceBackend* b = find_device_backend(d)) return *b;
  // The built-in CUDA backend's own error: no usable device, or an index out of range.
  if (d.type == DeviceType::GPU && cuda::built()) return cuda::backend(d.index);
  if (d.type == DeviceType::GPU)
    fail(
        "device {}: this binary was built without the CUDA backend; configure with "
        "-DCSTORCH_CUDA=ON on a machine with the CUDA toolkit (nvcc) to build it, or use the CPU",
        device_str(d));
  fail("device {}: no backend is registered for it", device_str(d));
}

void register_device_backend(DeviceType t, std::shared_ptr<const DeviceBackend> b) {
  CS_CHECK(t != DeviceType::CPU && t != DeviceType::CSX,
           "register_device_backend: the {} backend is built in and cannot be replaced",
           device_type_name(t));
  std::lock_guard<std::mutex> l(g_mu);
  if (t == DeviceType::Plugin) *g_plugin_name = b ? b->name() : "PLUGIN";
  g_registered[static_cast<int>(t)] = std::move(b);
}

const char* plugin_name() {
  return g_plugin_name->c_str();
}

bool plugin_named(const std::string& name) {
  auto b = registered(DeviceType::Plugin);
  return b && ascii_lower(b->name()) == ascii_lower(name);
}

}  // namespace cstorch::ir
