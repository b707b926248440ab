// The CUDA kernels of the attention ops (cuda_Attention, cuda_AttentionGrad; listed in
// cuda_ops.def): read the node (layout, broadcast strides of the bias and mask, dropout) on the
// host and queue the kernels of ../kernels/attention.cu. The backward's scratch (the row
// statistics) is the node's planned workspace (attention_workspace_bytes); nothing allocates.
#include "backend/cuda/attention_plan.h"
#include "backend/cuda/kernels/attention_launch.h"
#include "backend/cuda/runtime/kernel_util.h"

namespace cstorch::cuda {

namespace {

// Element strides of a [.., .., .., ..] input broadcast to [B, H, Tq, Tk]: 0 where a dim is 1
// (or absent), as the CPU kernel's bcast_of.
void bcast_strides(const Shape& shape, int64_t* s) {
  int64_t d[4] = {1, 1, 1, 1};
  const size_t rank = shape.size();
  for (size_t j = 0; j < rank; ++j) d[4 - rank + j] = shape[j];
  int64_t acc = 1;
  for (int j = 3; j >= 0; --j) {
    s[j] = d[j] == 1 ? 0 : acc;
    acc *= d[j];
  }
}

k::Attention operands(const ir::Node& n, const void* const* in) {
  const auto& at = n.attr<ir::AttentionAttrs>();
  const Shape& qs = n.inputs[0]->shape;
  const Shape& ks = n.inputs[1]->shape;
  const Shape& vs = n.inputs[2]->shape;
  const int t = at.bthd ? 1 : 2, h = at.bthd ? 2 : 1;
  k::Attention a;
  a.B = qs[0];
  a.H = qs[h];
  a.Tq = qs[t];
  a.Tk = ks[t];
  a.D = qs[3];
  a.Dv = vs[3];
  a.bthd = at.bthd;
  a.scale = static_cast<float>(at.scale);
  a.causal = at.causal;
  a.causal_offset = at.causal_offset;
  a.q = f(in[0]);
  a.k = f(in[1]);
  a.v = f(in[2]);
  size_t i = 3;
  if (at.has_bias) {
    a.bias = f(in[i]);
    bcast_strides(n.inputs[i]->shape, a.bias_strides);
    ++i;
  }
  if (at.has_mask) {
    a.mask = static_cast<const uint8_t*>(in[i]);
    bcast_strides(n.inputs[i]->shape, a.mask_strides);
    ++i;
  }
  if (at.dropout_p > 0) {
    // The same float thresholds as the CPU kernel, so the keep decisions agree bit for bit.
    a.rng_state = static_cast<const int64_t*>(in[i]);
    a.keep_p = static_cast<float>(1.0 - at.dropout_p);
    a.inv_keep = static_cast<float>(1.0 / (1.0 - at.dropout_p));
  }
  return a;
}

}  // namespace

void cuda_Attention(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                    void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  k::attention_forward(operands(n, in), static_cast<float*>(out), b.stream());
  b.check_launch(n.name());
}

void cuda_AttentionGrad(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                        void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const k::Attention a = operands(n, in);
  const size_t need = attention_workspace_bytes(n);
  CS_CHECK(ctx.workspace_bytes >= need && (need == 0 || ctx.workspace),
           "{}: the CUDA kernel needs a workspace of {} bytes, got {}", n.name(), need,
           ctx.workspace_bytes);
  const size_t k = n.inputs.size();
  float* dq = static_cast<float*>(out);
  float* dk = dq + n.inputs[0]->numel();
  float* dv = dk + n.inputs[1]->numel();
  float* dbias = n.attr<ir::AttentionAttrs>().bias_grad ? dv + n.inputs[2]->numel() : nullptr;
  k::attention_backward(a, f(in[k - 2]), f(in[k - 1]), dq, dk, dv, dbias,
                        static_cast<float*>(ctx.workspace), b.stream());
  b.check_launch(n.name());
}

}  // namespace cstorch::cuda
