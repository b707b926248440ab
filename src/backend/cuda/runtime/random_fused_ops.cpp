// The CUDA kernels of the random draws (rand_uniform, rand_normal, bernoulli) and of the Fused
// op: each reads its node on the host, queues its kernel (kernels/random.cu, kernels/fused.cu)
// on the backend's stream and checks the launch. The generator state stays on the device: the
// draw kernels read it there, so a traced step that advances it never waits for the host.
#include "backend/cuda/fused_plan.h"
#include "backend/cuda/kernels/random_fused_launch.h"
#include "backend/cuda/runtime/kernel_util.h"

namespace cstorch::cuda {

using ir::KernelContext;
using ir::Node;

namespace {
const int64_t* state_of(const void* const* in) {
  return static_cast<const int64_t*>(in[0]);
}
}  // namespace

void cuda_RandUniform(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const auto& a = n.attr<ir::RandomAttrs>();
  // The CPU's float parameters: low and high - low, each rounded once from double.
  k::rand_uniform(state_of(in), static_cast<float>(a.a), static_cast<float>(a.b - a.a),
                  static_cast<float*>(out), n.numel(), b.stream());
  b.check_launch(n.name());
}

void cuda_RandNormal(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const auto& a = n.attr<ir::RandomAttrs>();
  k::rand_normal(state_of(in), static_cast<float>(a.a), static_cast<float>(a.b),
                 static_cast<float*>(out), n.numel(), b.stream());
  b.check_launch(n.name());
}

void cuda_Bernoulli(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  k::bernoulli(state_of(in), k::bernoulli_threshold(n.attr<ir::RandomAttrs>().a),
               ty(n.dtype, n.name()), out, n.numel(), b.stream());
  b.check_launch(n.name());
}

void cuda_Fused(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  // The interpreter trusts its program: a node it cannot run is an error, never a wrong value.
  if (std::string why = fused_unsupported(n); !why.empty())
    fail("op '{}' cannot run on device GPU:{}: {}", n.name(), b.index(), why);
  if (n.numel() == 0) return;
  k::FusedProgram p = fused_program(n);
  for (int i = 0; i < p.ninputs; ++i) p.in[i] = in[i];
  k::fused(p, out, n.numel(), b.stream());
  b.check_launch(n.name());
}

}  // namespace cstorch::cuda
