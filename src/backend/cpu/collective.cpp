// CPU kernels of the collective ops: pack a bucket and hand it to the replica group's
// communicator (which reduces it on its own thread), then wait and unpack.
#include <cstring>

#include "backend/cpu/kernels.h"
#include "distributed/group.h"

namespace cstorch::cpu {

void cpu_AllReduceStart(const ir::Node& n, const void* const* in, void* out) {
  const auto& a = n.attr<ir::AllReduceAttrs>();
  float* o = static_cast<float*>(out);
  const float w = static_cast<float>(a.weight);
  size_t off = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const auto* x = static_cast<const float*>(in[i]);
    const size_t k = static_cast<size_t>(n.inputs[i]->numel());
    if (w == 1.0f) {
      std::memcpy(o + off, x, k * sizeof(float));
    } else {
      for (size_t j = 0; j < k; ++j) o[off + j] = x[j] * w;
    }
    off += k;
  }
  o[off] = w;  // summed with the values: the total weight of the replicas
  const uint64_t ticket = distributed::detail::active_group().start_allreduce(o, off + 1);
  std::memcpy(o + off + 1, &ticket, sizeof ticket);
}

void cpu_AllReduceUnpack(const ir::Node& n, const void* const* in, void* out) {
  const auto& a = n.attr<ir::UnpackAttrs>();
  const auto* b = static_cast<const float*>(in[0]);
  const size_t values = static_cast<size_t>(n.inputs[0]->numel()) - 3;
  uint64_t ticket = 0;
  std::memcpy(&ticket, b + values + 1, sizeof ticket);
  distributed::detail::active_group().wait(ticket);
  float* o = static_cast<float*>(out);
  const size_t k = static_cast<size_t>(n.numel());
  const float* src = b + a.offset;
  if (a.mean) {
    const float total = b[values];
    for (size_t j = 0; j < k; ++j) o[j] = src[j] / total;
  } else {
    std::memcpy(o, src, k * sizeof(float));
  }
}

}  // namespace cstorch::cpu
