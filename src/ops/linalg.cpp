// Linear algebra ops: matmul (batched, broadcasting, transpose flags; torch's 1-d rules in the
// public function) and linear. Kernels live in backend/cpu/linalg.cpp.
#include "amp/autocast_state.h"
#include "core/internal.h"
#include "ops/vjp.h"

namespace cstorch {
namespace ops {
namespace {

void check_float_pair(const char* op, const char* what_a, const ir::Node& a, const char* what_b,
                      const ir::Node& b) {
  CS_CHECK(is_floating(a.dtype) && is_floating(b.dtype),
           "{}: expected floating-point tensors, got {} {} of shape {} and {} {} of shape {}", op,
           what_a, dtype_name(a.dtype), shape_str(a.shape), what_b, dtype_name(b.dtype),
           shape_str(b.shape));
  CS_CHECK(a.dtype == b.dtype,
           "{}: {} and {} must have the same dtype, got {} and {} (convert one with .to())", op,
           what_a, what_b, dtype_name(a.dtype), dtype_name(b.dtype));
}

// C = op(A) @ op(B) as one Matmul node: gradient rules use the flags instead of transposing.
Tensor mm(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  return detail::dispatch(ir::OpCode::Matmul, ir::MatmulAttrs{ta, tb}, {a, b});
}

Tensor sum_to_if(const Tensor& t, const Shape& s) {
  return t.shape() == s ? t : sum_to(t, s);
}

}  // namespace

void infer_Matmul(ir::Node& n) {
  CS_CHECK(n.inputs.size() == 2, "matmul: expected 2 inputs, got {}", n.inputs.size());
  const auto& at = n.attr<ir::MatmulAttrs>();
  const auto& A = *n.inputs[0];
  const auto& B = *n.inputs[1];
  const Shape &sa = A.shape, &sb = B.shape;
  CS_CHECK(sa.size() >= 2 && sb.size() >= 2,
           "matmul: the batched kernel needs inputs of rank >= 2, got shapes {} and {}",
           shape_str(sa), shape_str(sb));
  check_float_pair("matmul", "a", A, "b", B);
  const size_t ra = sa.size(), rb = sb.size();
  int64_t m = at.trans_a ? sa[ra - 1] : sa[ra - 2], k = at.trans_a ? sa[ra - 2] : sa[ra - 1];
  int64_t kb = at.trans_b ? sb[rb - 1] : sb[rb - 2], nn = at.trans_b ? sb[rb - 2] : sb[rb - 1];
  if (k != kb) {
    fail("matmul: shapes {}{} and {}{} cannot be multiplied ({} != {})", shape_str(sa),
         at.trans_a ? " (transposed)" : "", shape_str(sb), at.trans_b ? " (transposed)" : "", k,
         kb);
  }
  // Batch dims broadcast (aligned from the right, excluding the matrix dims).
  const size_t nb = std::max(ra, rb) - 2;
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    int64_t da = i + ra - 2 >= nb ? sa[i + ra - 2 - nb] : 1;
    int64_t db = i + rb - 2 >= nb ? sb[i + rb - 2 - nb] : 1;
    CS_CHECK(da == db || da == 1 || db == 1,
             "matmul: the batch dims of shapes {} and {} cannot be broadcast ({} vs {})",
             shape_str(sa), shape_str(sb), da, db);
    batch[i] = da == 1 ? db : da;
  }
  batch.push_back(m);
  batch.push_back(nn);
  n.shape = std::move(batch);
  CS_CHECK(!at.f32_out || A.dtype == DType::bf16,
           "matmul: an f32 result of a bf16 product needs bf16 operands, got {}",
           dtype_name(A.dtype));
  n.dtype = at.f32_out ? DType::f32 : A.dtype;
}

void infer_Linear(ir::Node& n) {
  CS_CHECK(n.inputs.size() == 2 || n.inputs.size() == 3,
           "linear: expected inputs (x, weight[, bias]), got {} inputs", n.inputs.size());
  const auto& x = *n.inputs[0];
  const auto& w = *n.inputs[1];
  CS_CHECK(x.shape.size() >= 1, "linear: input must be at least 1-d, got shape {}",
           shape_str(x.shape));
  CS_CHECK(w.shape.size() == 2, "linear: weight must be 2-d [out_features, in_features], got {}",
           shape_str(w.shape));
  check_float_pair("linear", "input", x, "weight", w);
  CS_CHECK(x.shape.back() == w.shape[1],
           "linear: input shape {} and weight shape {} are incompatible (input features {} != "
           "weight in_features {})",
           shape_str(x.shape), shape_str(w.shape), x.shape.back(), w.shape[1]);
  if (n.inputs.size() == 3) {
    const auto& b = *n.inputs[2];
    CS_CHECK(b.shape == Shape{w.shape[0]}, "linear: bias shape {} must be [{}] (out_features)",
             shape_str(b.shape), w.shape[0]);
    CS_CHECK(b.dtype == x.dtype, "linear: bias dtype {} differs from input dtype {}",
             dtype_name(b.dtype), dtype_name(x.dtype));
  }
  n.shape = x.shape;
  n.shape.back() = w.shape[0];
  n.dtype = x.dtype;
}

// With A' = op(A), B' = op(B): dA' = g @ B'^T and dB' = A'^T @ g, each written as one Matmul
// with flags (transposing the product when the input itself was read transposed).
std::vector<Tensor> vjp_Matmul(const VjpArgs& a) {
  const auto& at = a.node.attr<ir::MatmulAttrs>();
  const Tensor &A = a.inputs[0], &B = a.inputs[1], &g = a.grad;
  std::vector<Tensor> r(2);
  if (a.needs[0]) {
    Tensor dA = at.trans_a ? mm(B, g, at.trans_b, true) : mm(g, B, false, !at.trans_b);
    r[0] = sum_to_if(dA, A.shape());
  }
  if (a.needs[1]) {
    if (B.dim() == 2 && A.dim() > 2 && !at.trans_a) {
      // A shared 2-d B (x @ W with x [..., m, k]): fold the batch into the rows, one GEMM
      // instead of a batched product and a sum over the batch.
      int64_t rows = 1;
      for (int64_t d = 0; d + 1 < A.dim(); ++d) rows *= A.size(d);
      Tensor A2 = reshape(A, {rows, A.size(-1)});
      Tensor g2 = reshape(g, {rows, g.size(-1)});
      r[1] = at.trans_b ? mm(g2, A2, true, false) : mm(A2, g2, true, false);
    } else {
      Tensor dB = at.trans_b ? mm(g, A, true, at.trans_a) : mm(A, g, !at.trans_a, false);
      r[1] = sum_to_if(dB, B.shape());
    }
  }
  return r;
}

// dx = g @ W, dW = g^T @ x and db = sum of g over rows, with leading dims flattened into rows.
// Gemm: made by the compiler after autodiff (fuse_gemm_epilogue), so it has no gradient rule.
// f32 only: the pass creates it for f32 products.
void infer_Gemm(ir::Node& n) {
  const auto& at = n.attr<ir::GemmAttrs>();
  const size_t want =
      2 + (at.bias ? 1 : 0) + (at.addend ? 2 : 0) + (at.gated() ? 1 : 0) + (at.update ? 2 : 0);
  CS_CHECK(n.inputs.size() == want, "gemm: expected {} inputs for its flags, got {}", want,
           n.inputs.size());
  CS_CHECK(!at.gelu_grad || !(at.addend || at.relu || at.relu_grad || at.update),
           "gemm: gelu_grad takes no addend, relu, relu_grad or update");
  for (size_t i = 0; i < n.inputs.size(); ++i)
    CS_CHECK(n.inputs[i]->dtype == DType::f32, "gemm: input {} is {}; only f32 is supported", i,
             dtype_name(n.inputs[i]->dtype));
  const auto& A = n.inputs[0]->shape;
  const auto& B = n.inputs[1]->shape;
  CS_CHECK(B.size() == 2 && A.size() >= 2 && (!at.trans_a || A.size() == 2),
           "gemm: expected a 2-d B and a 2-d (or, untransposed, batched) A, got {} and {}",
           shape_str(A), shape_str(B));
  const int64_t k = at.trans_a ? A[0] : A.back(), kb = at.trans_b ? B[1] : B[0];
  const int64_t nn = at.trans_b ? B[0] : B[1];
  CS_CHECK(k == kb, "gemm: inner dims differ ({} vs {}) for A {} and B {}", k, kb, shape_str(A),
           shape_str(B));
  Shape out = at.trans_a ? Shape{A[1], nn} : A;
  out.back() = nn;
  size_t next = 2;
  if (at.bias) {
    CS_CHECK(n.inputs[next]->shape == Shape{nn}, "gemm: bias shape {} must be [{}]",
             shape_str(n.inputs[next]->shape), nn);
    ++next;
  }
  if (at.addend) {
    CS_CHECK(n.inputs[next]->shape == out, "gemm: addend shape {} must be the output's {}",
             shape_str(n.inputs[next]->shape), shape_str(out));
    CS_CHECK(n.inputs[next + 1]->numel() == 1, "gemm: addend scale must have one element, got {}",
             shape_str(n.inputs[next + 1]->shape));
  }
  if (at.gated()) {
    const auto& y = *n.inputs[at.update_index() - 1];
    CS_CHECK(y.shape == out, "gemm: {} shape {} must be the output's {}",
             at.relu_grad ? "relu output" : "gelu input", shape_str(y.shape), shape_str(out));
  }
  if (at.update) {
    const auto& p = *n.inputs[at.update_index()];
    CS_CHECK(p.shape == out, "gemm: updated tensor shape {} must be the output's {}",
             shape_str(p.shape), shape_str(out));
    CS_CHECK(n.inputs[at.update_index() + 1]->numel() == 1,
             "gemm: update rate must have one element, got {}",
             shape_str(n.inputs[at.update_index() + 1]->shape));
  }
  n.shape = std::move(out);
  n.dtype = DType::f32;
}

CS_NO_VJP(Gemm)

void infer_After(ir::Node& n) {
  CS_CHECK(n.inputs.size() == 2, "after: expected (value, predecessor), got {} inputs",
           n.inputs.size());
  n.shape = n.inputs[0]->shape;
  n.dtype = n.inputs[0]->dtype;
}

CS_NO_VJP(After)

std::vector<Tensor> vjp_Linear(const VjpArgs& a) {
  const Tensor &x = a.inputs[0], &w = a.inputs[1];
  const int64_t out = w.size(0), in = w.size(1);
  int64_t rows = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) rows *= x.size(d);
  Tensor g2 = a.grad.dim() == 2 ? a.grad : reshape(a.grad, {rows, out});
  std::vector<Tensor> r(a.inputs.size());
  if (a.needs[0]) {
    Tensor dx = mm(g2, w, false, false);
    r[0] = x.dim() == 2 ? dx : reshape(dx, x.shape());
  }
  if (a.needs[1]) {
    Tensor x2 = x.dim() == 2 ? x : reshape(x, {rows, in});
    r[1] = mm(g2, x2, true, false);
  }
  if (a.inputs.size() > 2 && a.needs[2]) r[2] = sum(g2, {0});
  return r;
}

}  // namespace ops

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  CS_CHECK(a_in.defined() && b_in.defined(), "matmul: an input tensor is undefined");
  Tensor a = amp::detail::to_low(a_in), b = amp::detail::to_low(b_in);  // autocast
  const Shape &sa = a.shape(), &sb = b.shape();
  CS_CHECK(a.dim() >= 1 && b.dim() >= 1,
           "matmul: both arguments must be at least 1-d, got shapes {} and {}", shape_str(sa),
           shape_str(sb));
  int64_t ka = sa.back(), kb = b.dim() == 1 ? sb[0] : sb[sb.size() - 2];
  CS_CHECK(ka == kb, "matmul: shapes {} and {} cannot be multiplied ({} != {})", shape_str(sa),
           shape_str(sb), ka, kb);
  if (a.dim() >= 2 && b.dim() >= 2)
    return detail::dispatch(ir::OpCode::Matmul, ir::MatmulAttrs{}, {a, b});
  // torch's 1-d rules: a vector on the left is a row [1, k], on the right a column [k, 1];
  // the added dim is dropped from the result.
  Tensor a2 = a.dim() == 1 ? reshape(a, {1, ka}) : a;
  Tensor b2 = b.dim() == 1 ? reshape(b, {kb, 1}) : b;
  Tensor c = detail::dispatch(ir::OpCode::Matmul, ir::MatmulAttrs{}, {a2, b2});
  Shape s = c.shape();
  if (b.dim() == 1) s.pop_back();
  if (a.dim() == 1) s.erase(s.end() - (b.dim() == 1 ? 1 : 2));
  return reshape(c, s);
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in) {
  using amp::detail::to_low;  // autocast: compute in the low dtype, from f32 master weights
  Tensor x = to_low(x_in), weight = to_low(weight_in), bias = to_low(bias_in);
  if (bias.defined()) return detail::dispatch(ir::OpCode::Linear, ir::NoAttrs{}, {x, weight, bias});
  return detail::dispatch(ir::OpCode::Linear, ir::NoAttrs{}, {x, weight});
}

}  // namespace cstorch
