// Device names, buffers on devices, and copies between devices. Everything here goes through
// the device backends' interface (ir/device.h); nothing assumes a buffer is host memory.
#include <atomic>
#include <cstring>
#include <vector>

#include "cstorch/config.h"
#include "cstorch/core/error.h"
#include "ir/device.h"

namespace cstorch {

const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::CPU:
      return "CPU";
    case DeviceType::GPU:
      return "GPU";
    case DeviceType::CSX:
      return "CSX";
    case DeviceType::Plugin:
      return ir::plugin_name();
  }
  return "?";
}

std::string device_str(Device d) {
  if (d.type == DeviceType::CPU && d.index == 0) return "CPU";
  return fmt::format("{}:{}", device_type_name(d.type), d.index);
}

Device parse_device(const std::string& s) {
  std::string name = s;
  int index = 0;
  if (auto colon = s.find(':'); colon != std::string::npos) {
    name = s.substr(0, colon);
    const std::string idx = s.substr(colon + 1);
    CS_CHECK(!idx.empty() && idx.size() < 6 && idx.find_first_not_of("0123456789") == idx.npos,
             "device '{}': the index after ':' must be a non-negative integer", s);
    index = std::stoi(idx);
  }
  const std::string u = ascii_lower(name);
  if (u == "cpu") return Device{DeviceType::CPU, index};
  if (u == "gpu" || u == "cuda") return Device{DeviceType::GPU, index};
  if (u == "csx") return Device{DeviceType::CSX, index};
  if (ir::plugin_named(u)) return Device{DeviceType::Plugin, index};
  fail("device '{}': unknown device (expected CPU, GPU{})", s,
       ir::find_device_backend(Device{DeviceType::Plugin, 0})
           ? fmt::format(" or {}", device_type_name(DeviceType::Plugin))
           : "");
}

namespace ir {

// Versions are unique over all buffers, so a recorded version also names the buffer: memory
// freed and allocated again at the same address does not look unchanged.
static std::atomic<uint64_t> g_buffer_versions{0};

void Buffer::mark_written() {
  version = g_buffer_versions.fetch_add(1, std::memory_order_relaxed) + 1;
}

std::shared_ptr<Buffer> Buffer::alloc(size_t nbytes, Device device) {
  const DeviceBackend& b = device_backend(device);
  auto buf = std::make_shared<Buffer>();
  buf->device = device;
  buf->data = b.allocate(nbytes);
  buf->nbytes = nbytes;
  buf->owned = true;
  buf->mark_written();
  return buf;
}

std::shared_ptr<Buffer> Buffer::wrap(void* data, size_t nbytes, Device device) {
  auto b = std::make_shared<Buffer>();
  b->data = data;
  b->nbytes = nbytes;
  b->owned = false;
  b->device = device;
  b->mark_written();
  return b;
}

Buffer::~Buffer() {
  if (!owned || !data) return;
  if (const DeviceBackend* b = find_device_backend(device)) b->deallocate(data, nbytes);
}

std::shared_ptr<Buffer> host_view(const std::shared_ptr<Buffer>& b) {
  if (!b || device_backend(b->device).host_accessible()) return b;
  auto h = Buffer::alloc(b->nbytes);
  device_backend(b->device).copy_to_host(h->data, b->data, b->nbytes);
  return h;
}

void copy_between(Device dst_dev, void* dst, Device src_dev, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  const DeviceBackend& d = device_backend(dst_dev);
  const DeviceBackend& s = device_backend(src_dev);
  if (&d == &s) {
    d.copy_on_device(dst, src, nbytes);
  } else if (d.host_accessible()) {
    s.copy_to_host(dst, src, nbytes);
  } else if (s.host_accessible()) {
    d.copy_from_host(dst, src, nbytes);
  } else {
    std::vector<unsigned char> host(nbytes);  // neither side reaches the other: through the host
    s.copy_to_host(host.data(), src, nbytes);
    d.copy_from_host(dst, host.data(), nbytes);
  }
}

namespace {
// ToDevice's kernel: the one kernel that reads one device and writes another.
void transfer_kernel(const KernelContext&, const Node& n, const void* const* in, void* out) {
  copy_between(n.device, out, n.inputs[0]->device, in[0], n.nbytes());
}
}  // namespace

Kernel kernel_for(const Node& n) {
  if (n.op == OpCode::ToDevice) return &transfer_kernel;
  const DeviceBackend& b = device_backend(n.device);
  Kernel k = b.kernel(n.op);
  CS_CHECK(k != nullptr, "op '{}' has no kernel for device {} in this build", n.name(),
           device_str(n.device));
  CS_CHECK(b.supports(n.op, n.dtype), "op '{}' has no kernel for dtype {} on device {}", n.name(),
           dtype_name(n.dtype), device_str(n.device));
  if (std::string why = b.cannot_run(n); !why.empty())
    fail("op '{}' cannot run on device {}: {} (output {} {})", n.name(), device_str(n.device), why,
         dtype_name(n.dtype), shape_str(n.shape));
  return k;
}

}  // namespace ir
}  // namespace cstorch
