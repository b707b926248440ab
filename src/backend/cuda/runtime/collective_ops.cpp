// The CUDA kernels of the collective ops (data-parallel replicas on GPUs): the bucket is packed
// on the device, copied to the node's host staging buffer and reduced there by the replica
// group's communicator (MPI over the host: no NCCL is packaged by Debian; the communicator
// interface is where another transport would go); the unpack waits for the request, uploads its
// part and divides for the mean on the device. As the CPU's kernels (backend/cpu/collective.cpp):
// the same weighted values, the weight summed as the bucket's last element, the same division.
#include <cstring>

#include "backend/cuda/kernels/collective_launch.h"
#include "backend/cuda/runtime/kernel_util.h"
#include "distributed/group.h"

namespace cstorch::cuda {

using ir::KernelContext;
using ir::Node;

void cuda_AllReduceStart(const KernelContext& ctx, const Node& n, const void* const* in,
                         void* out) {
  const auto& b = enter(ctx, n);
  CS_CHECK(ctx.request != nullptr, "all_reduce_start: no request handle in the kernel context");
  CS_CHECK(ctx.host_staging != nullptr,
           "all_reduce_start on device GPU:{}: no host staging buffer for the bucket", b.index());
  const auto& a = n.attr<ir::AllReduceAttrs>();
  float* o = static_cast<float*>(out);
  const float w = static_cast<float>(a.weight);
  int64_t off = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const int64_t k = n.inputs[i]->numel();
    if (k > 0) {
      if (w == 1.0f)
        b.copy_on_device(o + off, in[i], static_cast<size_t>(k) * sizeof(float));
      else
        k::scale(f(in[i]), o + off, w, k, b.stream());
      b.check_launch(n.name());
    }
    off += k;
  }
  k::fill(k::Ty::f32, w, o + off, 1, b.stream());  // summed with the values: the total weight
  b.check_launch(n.name());
  // Waits for the packing; the communicator reduces the host copy on its own thread.
  b.copy_to_host(ctx.host_staging, o, static_cast<size_t>(off + 1) * sizeof(float));
  *ctx.request = distributed::detail::active_group().start_allreduce(
      static_cast<float*>(ctx.host_staging), static_cast<size_t>(off + 1));
}

void cuda_AllReduceUnpack(const KernelContext& ctx, const Node& n, const void* const* in,
                          void* out) {
  const auto& b = enter(ctx, n);
  CS_CHECK(ctx.request != nullptr, "all_reduce_unpack: no request handle in the kernel context");
  CS_CHECK(ctx.host_staging != nullptr,
           "all_reduce_unpack on device GPU:{}: no host staging buffer for the bucket", b.index());
  const auto& a = n.attr<ir::UnpackAttrs>();
  distributed::detail::active_group().wait(*ctx.request);
  const auto* reduced = static_cast<const float*>(ctx.host_staging);
  const int64_t values = n.inputs[0]->numel() - 1, k = n.numel();
  if (k == 0) return;
  float* o = static_cast<float*>(out);
  b.copy_from_host(o, reduced + a.offset, static_cast<size_t>(k) * sizeof(float));
  if (a.mean) {
    float total = 0;
    std::memcpy(&total, reduced + values, sizeof total);
    k::divide(o, total, k, b.stream());
    b.check_launch(n.name());
  }
}

}  // namespace cstorch::cuda
