// CPU kernels of the collective ops: pack a bucket and hand it to the replica group's
// communicator (which reduces it on its own thread), then wait and unpack. The request's handle
// is host-side (ctx.request). Where the bucket is memory the host cannot read (a device's),
// it is reduced through ctx.host_staging, copied out after packing and back before unpacking.
#include <cstring>

#include "backend/cpu/kernels.h"
#include "cstorch/core/error.h"
#include "distributed/group.h"

namespace cstorch::cpu {

void cpu_AllReduceStart(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                        void* out) {
  CS_CHECK(ctx.request != nullptr, "all_reduce_start: no request handle in the kernel context");
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
  float* comm = o;
  if (ctx.host_staging) {
    ctx.backend->copy_to_host(ctx.host_staging, o, (off + 1) * sizeof(float));
    comm = static_cast<float*>(ctx.host_staging);
  }
  *ctx.request = distributed::detail::active_group().start_allreduce(comm, off + 1);
}

void cpu_AllReduceUnpack(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                         void* out) {
  CS_CHECK(ctx.request != nullptr, "all_reduce_unpack: no request handle in the kernel context");
  const auto& a = n.attr<ir::UnpackAttrs>();
  const size_t values = static_cast<size_t>(n.inputs[0]->numel()) - 1;
  distributed::detail::active_group().wait(*ctx.request);
  const float* b = static_cast<const float*>(in[0]);
  if (ctx.host_staging) {
    // The reduced bucket is in host memory: bring it back (each unpack copies its own part and
    // the weight; the bucket itself is this device's memory, read-only here).
    b = static_cast<const float*>(ctx.host_staging);
  }
  float* o = static_cast<float*>(out);
  const size_t k = static_cast<size_t>(n.numel());
  const float* src = b + a.offset;
  if (ctx.host_staging) {
    // On such a device the kernel may not compute on host memory: upload, then divide there.
    ctx.backend->copy_from_host(o, src, k * sizeof(float));
    if (a.mean) {
      float total = 0;
      std::memcpy(&total, b + values, sizeof total);
      for (size_t j = 0; j < k; ++j) o[j] = o[j] / total;
    }
    return;
  }
  if (a.mean) {
    const float total = b[values];
    for (size_t j = 0; j < k; ++j) o[j] = src[j] / total;
  } else {
    std::memcpy(o, src, k * sizeof(float));
  }
}

}  // namespace cstorch::cpu
