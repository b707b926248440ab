// Fused scaled-dot-product attention: the Attention op (forward) and AttentionGrad (backward),
// kernels in backend/cpu/attention.cpp, and the public functional entry points.
//
// The forward op outputs only O. The backward kernel does not read a stored log-sum-exp: it
// recomputes each query block's softmax statistics from Q K^T itself. When the keys fit in one
// tile (Tk <= 512, every model here) that costs nothing, because the backward needs the score
// tile anyway and computes it once; beyond that it costs one extra Q K^T pass (1 of 6 GEMMs).
// This keeps the op single-output (the graph has one value per node) and the saved state of
// the forward pass at O alone.
#include <cmath>

#include "amp/autocast_state.h"
#include "core/internal.h"
#include "cstorch/nn/functional.h"
#include "ops/vjp.h"

namespace cstorch {
namespace ops {
namespace {

struct Dims4 {
  int64_t B, H, Tq, Tk, D, Dv;
};

// Checks q, k, v and the optional inputs of an Attention / AttentionGrad node; returns sizes.
Dims4 check_attention(const ir::Node& n, size_t extra, const char* op) {
  const auto& at = n.attr<ir::AttentionAttrs>();
  const size_t want = 3 + at.has_bias + at.has_mask + (at.dropout_p > 0) + extra;
  CS_CHECK(n.inputs.size() == want, "{}: expected {} inputs, got {}", op, want, n.inputs.size());
  const auto& q = *n.inputs[0];
  const auto& k = *n.inputs[1];
  const auto& v = *n.inputs[2];
  if (at.qkv) {  // one [B, T, 3H, D] tensor holds q, k and v
    CS_CHECK(at.bthd && &q == &k && &q == &v,
             "{}: a packed q, k, v must be one tensor given three times, in the [B, T, H, D] "
             "layout",
             op);
    CS_CHECK(q.dtype == DType::f32 && q.shape.size() == 4 && q.shape[2] % 3 == 0,
             "{}: a packed q, k, v must be a 4-d f32 [B, T, 3H, D] tensor, got {} {}", op,
             dtype_name(q.dtype), shape_str(q.shape));
  }
  for (const auto* t : {&q, &k, &v}) {
    CS_CHECK(t->dtype == DType::f32 && t->shape.size() == 4,
             "{}: q, k and v must be 4-d f32 tensors ({}), got q {} {}, k {} {}, v {} {}", op,
             at.bthd ? "[B, T, H, D]" : "[B, H, T, D]", dtype_name(q.dtype), shape_str(q.shape),
             dtype_name(k.dtype), shape_str(k.shape), dtype_name(v.dtype), shape_str(v.shape));
  }
  const int t = at.bthd ? 1 : 2, h = at.bthd ? 2 : 1;
  const int64_t heads = at.qkv ? q.shape[h] / 3 : q.shape[h];
  Dims4 d{q.shape[0], heads, q.shape[t], k.shape[t], q.shape[3], v.shape[3]};
  CS_CHECK(at.qkv || (k.shape[0] == d.B && v.shape[0] == d.B && k.shape[h] == d.H &&
                      v.shape[h] == d.H && v.shape[t] == d.Tk && k.shape[3] == d.D),
           "{}: shapes do not agree: q {}, k {}, v {} (layout {}: batch and heads must match, k "
           "and v the same length, q and k the same head size)",
           op, shape_str(q.shape), shape_str(k.shape), shape_str(v.shape),
           at.bthd ? "[B, T, H, D]" : "[B, H, T, D]");
  CS_CHECK(at.scale > 0 && std::isfinite(at.scale), "{}: scale must be positive, got {}", op,
           at.scale);
  CS_CHECK(at.dropout_p >= 0 && at.dropout_p < 1, "{}: dropout_p must be in [0, 1), got {}", op,
           at.dropout_p);
  const Shape full{d.B, d.H, d.Tq, d.Tk};
  size_t i = 3;
  auto check_mask = [&](const char* what, bool is_bool) {
    const auto& m = *n.inputs[i++];
    CS_CHECK(is_bool ? m.dtype == DType::boolean : m.dtype == DType::f32,
             "{}: the {} must be {}, got {}", op, what, is_bool ? "bool" : "f32",
             dtype_name(m.dtype));
    bool ok = m.shape.size() <= 4;
    for (size_t j = 0; ok && j < m.shape.size(); ++j) {
      int64_t s = m.shape[m.shape.size() - 1 - j];
      ok = s == 1 || s == full[3 - j];
    }
    CS_CHECK(ok, "{}: the {} has shape {}, which does not broadcast to [B, H, Tq, Tk] = {}", op,
             what, shape_str(m.shape), shape_str(full));
  };
  if (at.has_bias) check_mask("bias", false);
  if (at.has_mask) check_mask("mask", true);
  if (at.dropout_p > 0) {
    const auto& s = *n.inputs[i++];
    CS_CHECK(s.dtype == DType::i64 && s.shape == Shape{2},
             "{}: the generator state must be i64 [2], got {} {}", op, dtype_name(s.dtype),
             shape_str(s.shape));
  }
  return d;
}

Shape out_shape(const ir::AttentionAttrs& at, const Dims4& d) {
  return at.bthd ? Shape{d.B, d.Tq, d.H, d.Dv} : Shape{d.B, d.H, d.Tq, d.Dv};
}

}  // namespace

void infer_Attention(ir::Node& n) {
  Dims4 d = check_attention(n, 0, "scaled_dot_product_attention");
  n.shape = out_shape(n.attr<ir::AttentionAttrs>(), d);
  n.dtype = DType::f32;
}

void infer_AttentionGrad(ir::Node& n) {
  const auto& at = n.attr<ir::AttentionAttrs>();
  Dims4 d = check_attention(n, 2, "attention_grad");
  const Shape o = out_shape(at, d);
  const auto& out = *n.inputs[n.inputs.size() - 2];
  const auto& g = *n.inputs[n.inputs.size() - 1];
  CS_CHECK(out.shape == o && g.shape == o && out.dtype == DType::f32 && g.dtype == DType::f32,
           "attention_grad: the output and its gradient must be f32 {}, got {} {} and {} {}",
           shape_str(o), dtype_name(out.dtype), shape_str(out.shape), dtype_name(g.dtype),
           shape_str(g.shape));
  CS_CHECK(!at.bias_grad || at.has_bias, "attention_grad: bias_grad set without a bias input");
  // dq, dk and dv (one tensor's gradient when they are one packed tensor), then the bias's.
  int64_t total = at.qkv ? n.inputs[0]->numel()
                         : n.inputs[0]->numel() + n.inputs[1]->numel() + n.inputs[2]->numel();
  if (at.bias_grad) total += n.inputs[3]->numel();
  n.shape = {total};
  n.dtype = DType::f32;
}

// One AttentionGrad node computes every wanted gradient; they are sliced out of its output.
std::vector<Tensor> vjp_Attention(const VjpArgs& a) {
  ir::AttentionAttrs at = a.node.attr<ir::AttentionAttrs>();
  at.bias_grad = at.has_bias && a.needs[3];
  std::vector<Tensor> in = a.inputs;
  in.push_back(a.out);
  in.push_back(a.grad);
  Tensor packed = detail::dispatch(ir::OpCode::AttentionGrad, at, in);
  std::vector<Tensor> r(a.inputs.size());
  int64_t off = 0;
  for (size_t i = 0; i < (at.bias_grad ? 4u : 3u); ++i) {
    const int64_t len = a.inputs[i].numel();
    if (a.needs[i]) r[i] = reshape(slice(packed, 0, off, off + len), a.inputs[i].shape());
    off += len;
  }
  return r;
}

CS_NO_VJP(AttentionGrad)

}  // namespace ops

namespace nn::functional {

Tensor scaled_dot_product_attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                                    const AttentionOptions& o) {
  const char* op = "scaled_dot_product_attention";
  CS_CHECK(q_in.defined() && k_in.defined() && v_in.defined(), "{}: q, k or v is undefined", op);
  Tensor q = amp::detail::to_f32(q_in), k = amp::detail::to_f32(k_in),
         v = amp::detail::to_f32(v_in);
  for (const Tensor* t : {&q, &k, &v})
    CS_CHECK(t->dtype() == DType::f32 && t->dim() == 4,
             "{}: q, k and v must be 4-d f32 tensors (16-bit inputs: use autocast), got q {} {}, "
             "k {} {}, v {} {}",
             op, dtype_name(q.dtype()), shape_str(q.shape()), dtype_name(k.dtype()),
             shape_str(k.shape()), dtype_name(v.dtype()), shape_str(v.shape()));
  CS_CHECK(o.dropout_p >= 0 && o.dropout_p < 1, "{}: dropout_p must be in [0, 1), got {}", op,
           o.dropout_p);
  ir::AttentionAttrs at;
  at.bthd = o.heads_last;
  at.scale = o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  CS_CHECK(at.scale > 0 && std::isfinite(at.scale), "{}: scale must be positive, got {}", op,
           at.scale);
  at.dropout_p = o.dropout_p;
  at.causal = o.is_causal;
  at.causal_offset = o.causal_offset;
  std::vector<Tensor> in{q, k, v};
  // A float attn_mask is an additive bias like `bias`; both given: their sum.
  Tensor bias = o.bias.defined() ? amp::detail::to_f32(o.bias) : Tensor();
  Tensor mask;
  if (o.attn_mask.defined()) {
    if (o.attn_mask.dtype() == DType::boolean) {
      mask = o.attn_mask;
    } else {
      Tensor m = amp::detail::to_f32(o.attn_mask);
      CS_CHECK(m.dtype() == DType::f32, "{}: attn_mask must be bool or f32, got {}", op,
               dtype_name(m.dtype()));
      bias = bias.defined() ? add(bias, m) : m;
    }
  }
  if (bias.defined()) {
    CS_CHECK(bias.dtype() == DType::f32, "{}: bias must be f32, got {}", op,
             dtype_name(bias.dtype()));
    at.has_bias = true;
    in.push_back(bias);
  }
  if (mask.defined()) {
    at.has_mask = true;
    in.push_back(mask);
  }
  if (at.dropout_p > 0) {
    // The draw's only role is to take a fresh generator offset (and advance it); the kernel
    // derives its keep decisions from that state, as the Bernoulli op does.
    in.push_back(cstorch::detail::take_rng_state().to(q.device()));
  }
  return detail::dispatch(ir::OpCode::Attention, at, in);
}

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask, double dropout_p, bool is_causal,
                                    std::optional<double> scale) {
  AttentionOptions o;
  o.attn_mask = attn_mask;
  o.dropout_p = dropout_p;
  o.is_causal = is_causal;
  o.scale = scale;
  return scaled_dot_product_attention(q, k, v, o);
}

}  // namespace nn::functional
}  // namespace cstorch
