// nn functions: softmax, log_softmax and nll_loss as ops (kernels in backend/cpu/nn.cpp), and
// the composites built on the public ops: cross_entropy, mse_loss, layer_norm, embedding,
// dropout.
#include "amp/autocast_state.h"
#include "core/internal.h"
#include "core/warn_once.h"
#include "ir/device.h"
#include "ops/vjp.h"

namespace cstorch {
namespace ops {
namespace {

static_assert(static_cast<int>(cstorch::Reduction::None) == static_cast<int>(ir::Reduction::None) &&
              static_cast<int>(cstorch::Reduction::Mean) == static_cast<int>(ir::Reduction::Mean) &&
              static_cast<int>(cstorch::Reduction::Sum) == static_cast<int>(ir::Reduction::Sum));

void infer_softmax_like(ir::Node& n, const char* op) {
  CS_CHECK(n.inputs.size() == 1, "{}: expected 1 input, got {}", op, n.inputs.size());
  const auto& x = *n.inputs[0];
  const int64_t dim = n.attr<ir::DimAttrs>().dim;
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  CS_CHECK(dim >= 0 && dim < std::max<int64_t>(rank, 1),
           "{}: dim {} is out of range for input shape {}", op, dim, shape_str(x.shape));
  CS_CHECK(is_floating(x.dtype), "{}: expected a floating-point input, got {} of shape {}", op,
           dtype_name(x.dtype), shape_str(x.shape));
  n.shape = x.shape;
  n.dtype = x.dtype;
}

}  // namespace

// Shared by nll_loss, cross_entropy and the NllLoss shape rule; `op` names the caller.
static void check_loss_inputs(const char* op, const Shape& in, DType in_t, const Shape& tg,
                              DType tg_t) {
  CS_CHECK(is_integral(tg_t), "{}: target must be an integer class index tensor (i32/i64), got {}",
           op, dtype_name(tg_t));
  CS_CHECK(is_floating(in_t), "{}: input must be a floating-point tensor, got {} of shape {}", op,
           dtype_name(in_t), shape_str(in));
  CS_CHECK(!in.empty(), "{}: input must have shape [C], [N, C] or [N, C, d1, ...], got []", op);
  if (in.size() == 1) {
    CS_CHECK(tg.empty(), "{}: target has shape {} but a 1-d input of shape {} needs a 0-d target",
             op, shape_str(tg), shape_str(in));
    return;
  }
  CS_CHECK(!tg.empty() && tg[0] == in[0], "{}: target has shape {} but input has batch size {}", op,
           shape_str(tg), in[0]);
  Shape want{in[0]};
  want.insert(want.end(), in.begin() + 2, in.end());
  CS_CHECK(tg == want, "{}: target shape {} does not match input shape {} (expected {})", op,
           shape_str(tg), shape_str(in), shape_str(want));
}

void infer_Softmax(ir::Node& n) {
  infer_softmax_like(n, "softmax");
}
void infer_LogSoftmax(ir::Node& n) {
  infer_softmax_like(n, "log_softmax");
}

void infer_NllLoss(ir::Node& n) {
  CS_CHECK(n.inputs.size() == 2, "nll_loss: expected inputs (log_probs, target), got {} inputs",
           n.inputs.size());
  const auto& lp = *n.inputs[0];
  const auto& tg = *n.inputs[1];
  check_loss_inputs("nll_loss", lp.shape, lp.dtype, tg.shape, tg.dtype);
  n.shape = n.attr<ir::LossAttrs>().reduction == ir::Reduction::None ? tg.shape : Shape{};
  n.dtype = lp.dtype;
}

void infer_NllLossGrad(ir::Node& n) {
  CS_CHECK(n.inputs.size() == 2, "nll_loss_grad: expected inputs (grad, target), got {} inputs",
           n.inputs.size());
  const auto& at = n.attr<ir::LossAttrs>();
  const auto& g = *n.inputs[0];
  const auto& tg = *n.inputs[1];
  CS_CHECK(is_floating(g.dtype), "nll_loss_grad: grad must be floating-point, got {}",
           dtype_name(g.dtype));
  CS_CHECK(is_integral(tg.dtype), "nll_loss_grad: target must be i32/i64, got {}",
           dtype_name(tg.dtype));
  CS_CHECK(at.num_classes >= 0, "nll_loss_grad: num_classes must be >= 0, got {}", at.num_classes);
  const Shape want = at.reduction == ir::Reduction::None ? tg.shape : Shape{};
  CS_CHECK(g.shape == want, "nll_loss_grad: grad has shape {} but expected {}", shape_str(g.shape),
           shape_str(want));
  if (tg.shape.empty()) {
    n.shape = {at.num_classes};
  } else {
    n.shape = {tg.shape[0], at.num_classes};
    n.shape.insert(n.shape.end(), tg.shape.begin() + 1, tg.shape.end());
  }
  n.dtype = g.dtype;
}

// y * (g - sum(g * y)) along the softmax dim.
std::vector<Tensor> vjp_Softmax(const VjpArgs& a) {
  const int64_t dim = a.node.attr<ir::DimAttrs>().dim;
  const Tensor& y = a.out;
  return {mul(y, sub(a.grad, sum(mul(a.grad, y), {dim}, true)))};
}

// g - softmax * sum(g), with softmax = exp(log_softmax output), as one op: a pass per row
// instead of a reduction plus an elementwise pass over the (often vocabulary-sized) rows.
std::vector<Tensor> vjp_LogSoftmax(const VjpArgs& a) {
  return {detail::dispatch(ir::OpCode::LogSoftmaxGrad, a.node.attrs, {a.grad, a.out})};
}

void infer_LogSoftmaxGrad(ir::Node& n) {
  CS_CHECK(n.inputs.size() == 2, "log_softmax_grad: expected inputs (grad, output), got {}",
           n.inputs.size());
  const auto& g = *n.inputs[0];
  const auto& y = *n.inputs[1];
  CS_CHECK(g.shape == y.shape && g.dtype == y.dtype,
           "log_softmax_grad: grad {}{} and output {}{} must have one shape and dtype",
           dtype_name(g.dtype), shape_str(g.shape), dtype_name(y.dtype), shape_str(y.shape));
  ir::Node probe = n;
  probe.inputs = {n.inputs[1]};
  infer_softmax_like(probe, "log_softmax_grad");
  n.shape = probe.shape;
  n.dtype = probe.dtype;
}

// dx = g - p * S with p = exp(y), S = sum(g) over the dim. For a cotangent v:
// grad_g = v - sum(v * p), grad_y = -v * p * S.
std::vector<Tensor> vjp_LogSoftmaxGrad(const VjpArgs& a) {
  const int64_t dim = a.node.attr<ir::DimAttrs>().dim;
  const Tensor& g = a.inputs[0];
  const Tensor p = exp(a.inputs[1]);
  std::vector<Tensor> r(2);
  if (a.needs[0]) r[0] = sub(a.grad, sum(mul(a.grad, p), {dim}, true));
  if (a.needs[1]) r[1] = neg(mul(mul(a.grad, p), sum(g, {dim}, true)));
  return r;
}

void infer_CrossEntropyGrad(ir::Node& n) {
  CS_CHECK(n.inputs.size() == 3,
           "cross_entropy_grad: expected inputs (log_probs, grad, target), got {} inputs",
           n.inputs.size());
  const auto& at = n.attr<ir::LossAttrs>();
  const auto& lp = *n.inputs[0];
  const auto& g = *n.inputs[1];
  const auto& tg = *n.inputs[2];
  CS_CHECK(lp.shape.size() == 1 || lp.shape.size() == 2,
           "cross_entropy_grad: log_probs must have shape [C] or [N, C], got {}",
           shape_str(lp.shape));
  check_loss_inputs("cross_entropy_grad", lp.shape, lp.dtype, tg.shape, tg.dtype);
  CS_CHECK(at.num_classes == lp.shape.back(),
           "cross_entropy_grad: num_classes {} does not match log_probs of shape {}",
           at.num_classes, shape_str(lp.shape));
  const Shape want = at.reduction == ir::Reduction::None ? tg.shape : Shape{};
  CS_CHECK(g.shape == want && g.dtype == lp.dtype,
           "cross_entropy_grad: grad is {}{} but expected {}{}", dtype_name(g.dtype),
           shape_str(g.shape), dtype_name(lp.dtype), shape_str(want));
  CS_CHECK(!at.bf16_out || lp.dtype == DType::f32,
           "cross_entropy_grad: a bf16 gradient is stored from f32 log_probs, got {}",
           dtype_name(lp.dtype));
  n.shape = lp.shape;
  n.dtype = at.bf16_out ? DType::bf16 : lp.dtype;
}
CS_NO_VJP(CrossEntropyGrad)

std::vector<Tensor> vjp_NllLoss(const VjpArgs& a) {
  ir::LossAttrs at = a.node.attr<ir::LossAttrs>();
  const Tensor& lp = a.inputs[0];
  at.num_classes = lp.dim() == 1 ? lp.size(0) : lp.size(1);
  std::vector<Tensor> r(2);
  if (a.needs[0]) r[0] = detail::dispatch(ir::OpCode::NllLossGrad, at, {a.grad, a.inputs[1]});
  return r;
}

// NllLossGrad is linear in its grad input: its transpose is nll_loss itself with the same
// reduction (picks -G at each valid target, scaled the same way).
std::vector<Tensor> vjp_NllLossGrad(const VjpArgs& a) {
  std::vector<Tensor> r(2);
  if (a.needs[0])
    r[0] =
        detail::dispatch(ir::OpCode::NllLoss, a.node.attr<ir::LossAttrs>(), {a.grad, a.inputs[1]});
  return r;
}

}  // namespace ops

using ir::OpCode;

Tensor softmax(const Tensor& a_in, int64_t dim) {
  Tensor a = amp::detail::to_f32(a_in);
  int64_t d = normalize_dim(dim, std::max<int64_t>(a.dim(), 1), "softmax");
  return detail::dispatch(OpCode::Softmax, ir::DimAttrs{d}, {a});
}

Tensor log_softmax(const Tensor& a_in, int64_t dim) {
  Tensor a = amp::detail::to_f32(a_in);
  int64_t d = normalize_dim(dim, std::max<int64_t>(a.dim(), 1), "log_softmax");
  return detail::dispatch(OpCode::LogSoftmax, ir::DimAttrs{d}, {a});
}

static ir::LossAttrs loss_attrs(const Tensor& input, int64_t ignore_index, Reduction r) {
  int64_t classes = input.dim() == 1 ? input.size(0) : input.size(1);
  return ir::LossAttrs{ignore_index, static_cast<ir::Reduction>(r), classes};
}

Tensor nll_loss(const Tensor& log_probs_in, const Tensor& target, int64_t ignore_index,
                Reduction reduction) {
  CS_CHECK(log_probs_in.defined() && target.defined(), "nll_loss: an input tensor is undefined");
  Tensor log_probs = amp::detail::to_f32(log_probs_in);
  ops::check_loss_inputs("nll_loss", log_probs.shape(), log_probs.dtype(), target.shape(),
                         target.dtype());
  return detail::dispatch(OpCode::NllLoss, loss_attrs(log_probs, ignore_index, reduction),
                          {log_probs, target});
}

// torch's label smoothing: (1 - eps) * nll + eps / C * smooth, with smooth the negative sum of
// log-probabilities over the classes, zero at ignored targets, reduced like the loss (the mean
// divides by the number of non-ignored targets).
Tensor cross_entropy(const Tensor& logits_in, const Tensor& target, int64_t ignore_index,
                     double label_smoothing, Reduction reduction) {
  CS_CHECK(logits_in.defined() && target.defined(), "cross_entropy: an input tensor is undefined");
  Tensor logits = amp::detail::to_f32(logits_in);
  ops::check_loss_inputs("cross_entropy", logits.shape(), logits.dtype(), target.shape(),
                         target.dtype());
  CS_CHECK(label_smoothing >= 0 && label_smoothing <= 1,
           "cross_entropy: label_smoothing must be in [0, 1], got {}", label_smoothing);
  const int64_t cdim = logits.dim() == 1 ? 0 : 1;
  Tensor lp = log_softmax(logits, cdim);
  Tensor loss =
      detail::dispatch(OpCode::NllLoss, loss_attrs(lp, ignore_index, reduction), {lp, target});
  if (label_smoothing == 0) return loss;
  const int64_t classes = logits.size(cdim);
  Tensor valid = logical_not(target == static_cast<double>(ignore_index));
  Tensor smooth = where(valid, neg(sum(lp, {cdim})), 0.0);
  Tensor reduced = smooth;
  if (reduction == Reduction::Sum) {
    reduced = sum(smooth);
  } else if (reduction == Reduction::Mean) {
    reduced = div(sum(smooth), cast(sum(valid), smooth.dtype()));
  }
  return add(loss * (1.0 - label_smoothing),
             reduced * (label_smoothing / static_cast<double>(classes)));
}

Tensor mse_loss(const Tensor& a_in, const Tensor& b_in, Reduction reduction) {
  CS_CHECK(a_in.defined() && b_in.defined(), "mse_loss: an input tensor is undefined");
  Tensor a = amp::detail::to_f32(a_in), b = amp::detail::to_f32(b_in);
  CS_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()),
           "mse_loss: expected floating-point tensors, got {} of shape {} and {} of shape {}",
           dtype_name(a.dtype()), shape_str(a.shape()), dtype_name(b.dtype()),
           shape_str(b.shape()));
  Tensor d = sub(a, b);
  // A target that broadcasts the input to another shape ([B, 1] against [B] gives [B, B]) makes
  // the loss compare every prediction with every target: PyTorch warns, and the result is
  // almost surely not what was meant.
  CS_CHECK(d.shape() == a.shape(),
           "mse_loss: the input {} and the target {} broadcast to {}: the loss would compare each "
           "input with several targets; give the target the input's shape (e.g. reshape or "
           "unsqueeze it)",
           shape_str(a.shape()), shape_str(b.shape()), shape_str(d.shape()));
  // A target of another shape that broadcasts into the input's ([B, 1] against [B, 4]) is
  // allowed, as in PyTorch, which warns: said once a process for each pair of shapes (an eager
  // loop calls this every step).
  if (b.shape() != a.shape())
    cstorch::detail::warn_once(
        fmt::format("mse_loss {} {}", shape_str(a.shape()), shape_str(b.shape())),
        fmt::format("mse_loss: the target {} is broadcast to the input's shape {}: "
                    "each target value is compared with several inputs; if that is "
                    "not meant, give the target the input's shape",
                    shape_str(b.shape()), shape_str(a.shape())));
  Tensor sq = mul(d, d);
  if (reduction == Reduction::Mean) return mean(sq);
  if (reduction == Reduction::Sum) return sum(sq);
  return sq;
}

// Whether layer_norm runs as one LayerNorm op: f32 input, weight and bias on one device whose
// backend has the three LayerNorm kernels. Elsewhere (another dtype, a backend
// without them) it is built from mean, var and elementwise ops, with the same result up to
// rounding.
static bool layer_norm_op_runs(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (x.dtype() != DType::f32) return false;
  for (const Tensor* t : {&weight, &bias})
    if (t->defined() && (t->dtype() != DType::f32 || t->device() != x.device())) return false;
  const ir::DeviceBackend& b = ir::device_backend(x.device());
  return b.supports(ir::OpCode::LayerNorm, DType::f32) &&
         b.supports(ir::OpCode::LayerNormGrad, DType::f32) &&
         b.supports(ir::OpCode::LayerNormParamGrad, DType::f32);
}

namespace ops {

// Rows and row length of a LayerNorm, LayerNormGrad or LayerNormParamGrad node's x, checking
// its inputs against the attributes: (x, weight?, bias?), (dy, x, weight?) and (dy, x).
static std::pair<int64_t, int64_t> layer_norm_rows(const ir::Node& n) {
  const auto& at = n.attr<ir::LayerNormAttrs>();
  const char* op = n.name();
  const bool fwd = n.op == ir::OpCode::LayerNorm;
  const size_t xi = fwd ? 0 : 1, wi = xi + 1;  // x, then the weight and bias
  const size_t want =
      n.op == ir::OpCode::LayerNormParamGrad ? 2 : wi + at.has_weight + (fwd && at.has_bias);
  CS_CHECK(n.inputs.size() == want, "{}: expected {} inputs, got {}", op, want, n.inputs.size());
  const auto& x = *n.inputs[xi];
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  CS_CHECK(at.dims >= 1 && at.dims <= rank, "{}: dims {} is out of range for input shape {}", op,
           at.dims, shape_str(x.shape));
  CS_CHECK(x.dtype == DType::f32, "{}: expected an f32 input, got {} of shape {}", op,
           dtype_name(x.dtype), shape_str(x.shape));
  if (!fwd) {
    const auto& dy = *n.inputs[0];
    CS_CHECK(dy.shape == x.shape && dy.dtype == DType::f32,
             "{}: the output's gradient must be f32 {}, got {} {}", op, shape_str(x.shape),
             dtype_name(dy.dtype), shape_str(dy.shape));
  }
  const Shape trailing(x.shape.end() - at.dims, x.shape.end());
  for (size_t i = wi; i < n.inputs.size(); ++i) {
    const auto& t = *n.inputs[i];
    CS_CHECK(t.shape == trailing && t.dtype == DType::f32,
             "{}: {} must be f32 {} (the trailing dims of input shape {}), got {} {}", op,
             i == wi && at.has_weight ? "weight" : "bias", shape_str(trailing), shape_str(x.shape),
             dtype_name(t.dtype), shape_str(t.shape));
  }
  int64_t D = 1;
  for (int64_t d : trailing) D *= d;
  return {D == 0 ? 0 : x.numel() / D, D};
}

void infer_LayerNorm(ir::Node& n) {
  layer_norm_rows(n);
  n.shape = n.inputs[0]->shape;
  n.dtype = DType::f32;
}

void infer_LayerNormGrad(ir::Node& n) {
  layer_norm_rows(n);
  n.shape = n.inputs[1]->shape;
  n.dtype = DType::f32;
}

void infer_LayerNormParamGrad(ir::Node& n) {
  const auto& at = n.attr<ir::LayerNormAttrs>();
  CS_CHECK(at.has_weight || at.has_bias,
           "layer_norm_param_grad: a layer norm without weight or bias has no parameter gradient");
  const int64_t D = layer_norm_rows(n).second;
  n.shape = {int64_t{at.has_weight} + int64_t{at.has_bias}, D};
  n.dtype = DType::f32;
}

// dx from LayerNormGrad; the weight's and bias's gradients from one LayerNormParamGrad node,
// each wanted one sliced out of its rows.
std::vector<Tensor> vjp_LayerNorm(const VjpArgs& a) {
  const auto& at = a.node.attr<ir::LayerNormAttrs>();
  const Tensor& dy = a.grad;  // f32: the gradient of LayerNorm's f32 output
  std::vector<Tensor> r(a.inputs.size());
  if (a.needs[0]) {
    std::vector<Tensor> in{dy, a.inputs[0]};
    if (at.has_weight) in.push_back(a.inputs[1]);
    r[0] = detail::dispatch(ir::OpCode::LayerNormGrad, at, in);
  }
  bool params = false;
  for (size_t i = 1; i < a.inputs.size(); ++i) params = params || a.needs[i];
  if (params) {
    const Tensor rows = detail::dispatch(ir::OpCode::LayerNormParamGrad, at, {dy, a.inputs[0]});
    for (size_t i = 1; i < a.inputs.size(); ++i) {
      const auto k = static_cast<int64_t>(i - 1);
      if (a.needs[i]) r[i] = reshape(slice(rows, 0, k, k + 1), a.inputs[i].shape());
    }
  }
  return r;
}
CS_NO_VJP(LayerNormGrad)
CS_NO_VJP(LayerNormParamGrad)

}  // namespace ops

Tensor layer_norm(const Tensor& x_in, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  CS_CHECK(x_in.defined(), "layer_norm: the input tensor is undefined");
  Tensor x = amp::detail::to_f32(x_in);
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  const Shape& s = x.shape();
  bool match = k >= 1 && k <= x.dim();
  for (int64_t i = 0; match && i < k; ++i) match = s[x.dim() - k + i] == normalized_shape[i];
  CS_CHECK(match,
           "layer_norm: normalized_shape {} does not match the trailing dims of input "
           "shape {}",
           shape_str(normalized_shape), shape_str(s));
  CS_CHECK(is_floating(x.dtype()), "layer_norm: expected a floating-point input, got {}",
           dtype_name(x.dtype()));
  for (const auto* t : {&weight, &bias}) {
    CS_CHECK(!t->defined() || t->shape() == normalized_shape,
             "layer_norm: {} has shape {} but normalized_shape is {}",
             t == &weight ? "weight" : "bias", shape_str(t->shape()), shape_str(normalized_shape));
  }
  if (layer_norm_op_runs(x, weight, bias)) {
    const ir::LayerNormAttrs at{k, eps, weight.defined(), bias.defined()};
    std::vector<Tensor> in{x};
    for (const Tensor* t : {&weight, &bias})
      if (t->defined()) in.push_back(*t);
    return detail::dispatch(ir::OpCode::LayerNorm, at, in);
  }
  std::vector<int64_t> dims;
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) dims.push_back(i);
  Tensor m = mean(x, dims, true);
  Tensor v = var(x, dims, 0, true);  // biased, as torch's layer_norm
  Tensor y = mul(sub(x, m), rsqrt(v + eps));
  if (weight.defined()) y = mul(y, weight);
  if (bias.defined()) y = add(y, bias);
  return y;
}

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  CS_CHECK(indices.defined() && weight.defined(), "embedding: an input tensor is undefined");
  CS_CHECK(is_integral(indices.dtype()), "embedding: indices must be i32/i64, got {} of shape {}",
           dtype_name(indices.dtype()), shape_str(indices.shape()));
  CS_CHECK(weight.dim() == 2,
           "embedding: weight must be 2-d [num_embeddings, embedding_dim], got shape {}",
           shape_str(weight.shape()));
  if (indices.dim() == 1) return index_select(weight, 0, indices);
  Tensor rows = index_select(weight, 0, reshape(indices, {indices.numel()}));
  Shape s = indices.shape();
  s.push_back(weight.size(1));
  return reshape(rows, s);
}

Tensor dropout(const Tensor& a, double p, bool training) {
  CS_CHECK(p >= 0 && p <= 1, "dropout: p must be in [0, 1], got {}", p);
  if (!training || p == 0) return a;
  CS_CHECK(is_floating(a.dtype()), "dropout: expected a floating-point input, got {}",
           dtype_name(a.dtype()));
  // Every element dropped, as PyTorch's p = 1: the input times 0 (no 1 / (1 - p) scale).
  if (p == 1) return a * 0.0;
  // The mask is scaled before multiplying so the backward pass is one multiply by it.
  Tensor mask = bernoulli(a.shape(), 1.0 - p, a.dtype(), a.device());
  return mul(a, mask * (1.0 / (1.0 - p)));
}

}  // namespace cstorch
