// Elementwise ops: shape/dtype rules, gradient rules and the public functions (unary math,
// cast, broadcasting binary arithmetic and comparisons, logical ops, where, clamp, operators).
// The public functions apply PyTorch's dtype promotion by inserting casts, so every shape rule
// can require its inputs to share one dtype.
#include <cmath>

#include "core/internal.h"
#include "ir/device.h"
#include "ops/vjp.h"

namespace cstorch {
namespace ops {

namespace {

const ir::Node& input(const ir::Node& n, size_t i) {
  return *n.inputs[i];
}

void check_arity(const ir::Node& n, size_t k) {
  CS_CHECK(n.inputs.size() == k, "{}: expected {} input(s), got {}", n.name(), k, n.inputs.size());
}

void require_float(const ir::Node& n, DType t) {
  CS_CHECK(is_floating(t), "{}: dtype {} is not supported (floating-point dtypes only)", n.name(),
           dtype_name(t));
}
void require_numeric(const ir::Node& n, DType t) {
  CS_CHECK(t != DType::boolean, "{}: dtype bool is not supported", n.name());
}

// Unary: the input's shape and dtype.
void infer_unary(ir::Node& n) {
  check_arity(n, 1);
  n.shape = input(n, 0).shape;
  n.dtype = input(n, 0).dtype;
}
void infer_unary_float(ir::Node& n) {
  infer_unary(n);
  require_float(n, n.dtype);
}
void infer_unary_numeric(ir::Node& n) {
  infer_unary(n);
  require_numeric(n, n.dtype);
}

// The general broadcast kernel path (neither operand matches the output's size nor is a single
// element) walks at most as many dims as the node's backend supports (its max_rank).
void check_broadcast_rank(const ir::Node& n) {
  const size_t max_rank = static_cast<size_t>(ir::device_backend(n.device).max_rank());
  if (n.shape.size() <= max_rank) return;
  int64_t total = numel(n.shape);
  for (const auto& in : n.inputs) {
    int64_t k = in->numel();
    if (k != 1 && k != total)
      fail("{}: broadcasting over more than {} dims is not supported (output shape {})", n.name(),
           max_rank, shape_str(n.shape));
  }
}

// Binary with broadcasting; both inputs must have one dtype (the public ops promote first).
void infer_binary(ir::Node& n) {
  check_arity(n, 2);
  const auto& a = input(n, 0);
  const auto& b = input(n, 1);
  CS_CHECK(a.dtype == b.dtype,
           "{}: input dtypes {} and {} differ (shapes {} and {}); cast them to one dtype first",
           n.name(), dtype_name(a.dtype), dtype_name(b.dtype), shape_str(a.shape),
           shape_str(b.shape));
  n.shape = detail::broadcast_shapes(a.shape, b.shape, n.name());
  n.dtype = a.dtype;
  check_broadcast_rank(n);
}
void infer_binary_float(ir::Node& n) {
  infer_binary(n);
  require_float(n, n.dtype);
}
void infer_compare(ir::Node& n) {
  infer_binary(n);
  n.dtype = DType::boolean;
}

// Reduces a broadcast gradient back to an input's shape.
Tensor reduce_to(const Tensor& g, const Tensor& like) {
  return g.shape() == like.shape() ? g : sum_to(g, like.shape());
}

}  // namespace

// ---- unary ----
void infer_Neg(ir::Node& n) {
  infer_unary(n);
  CS_CHECK(n.dtype != DType::boolean,
           "neg: negation of a bool tensor is not supported; use logical_not() to invert a mask");
}
void infer_Abs(ir::Node& n) {
  infer_unary_numeric(n);
}
void infer_Sign(ir::Node& n) {
  infer_unary(n);
}
void infer_Exp(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Log(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Sqrt(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Rsqrt(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Reciprocal(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Tanh(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Sigmoid(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Relu(ir::Node& n) {
  infer_unary_numeric(n);
}
void infer_Gelu(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Silu(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Erf(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Sin(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Cos(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Expm1(ir::Node& n) {
  infer_unary_float(n);
}
void infer_Floor(ir::Node& n) {
  infer_unary_numeric(n);
}
void infer_IsFinite(ir::Node& n) {
  infer_unary(n);
  n.dtype = DType::boolean;
}
void infer_LogicalNot(ir::Node& n) {
  infer_unary(n);
  n.dtype = DType::boolean;
}
void infer_Cast(ir::Node& n) {
  infer_unary(n);
  n.dtype = n.attr<ir::CastAttrs>().to;
}
void infer_Copy(ir::Node& n) {
  infer_unary(n);
}

// ---- binary ----
void infer_Add(ir::Node& n) {
  infer_binary(n);
}
void infer_Sub(ir::Node& n) {
  infer_binary(n);
  CS_CHECK(n.dtype != DType::boolean,
           "sub: subtraction of bool tensors is not supported; use logical_xor() instead");
}
void infer_Mul(ir::Node& n) {
  infer_binary(n);
}
void infer_Div(ir::Node& n) {
  infer_binary_float(n);
}
void infer_Pow(ir::Node& n) {
  infer_binary(n);
  require_numeric(n, n.dtype);
}
void infer_Maximum(ir::Node& n) {
  infer_binary(n);
}
void infer_Minimum(ir::Node& n) {
  infer_binary(n);
}
void infer_Eq(ir::Node& n) {
  infer_compare(n);
}
void infer_Ne(ir::Node& n) {
  infer_compare(n);
}
void infer_Lt(ir::Node& n) {
  infer_compare(n);
}
void infer_Le(ir::Node& n) {
  infer_compare(n);
}
void infer_Gt(ir::Node& n) {
  infer_compare(n);
}
void infer_Ge(ir::Node& n) {
  infer_compare(n);
}
void infer_LogicalAnd(ir::Node& n) {
  infer_compare(n);
}
void infer_LogicalOr(ir::Node& n) {
  infer_compare(n);
}
void infer_LogicalXor(ir::Node& n) {
  infer_compare(n);
}
// Inputs (grad, relu output) and (grad, x).
void infer_ReluGrad(ir::Node& n) {
  infer_binary_float(n);
}
void infer_GeluGrad(ir::Node& n) {
  infer_binary_float(n);
}

void infer_Where(ir::Node& n) {
  check_arity(n, 3);
  const auto& c = input(n, 0);
  const auto& a = input(n, 1);
  const auto& b = input(n, 2);
  CS_CHECK(c.dtype == DType::boolean, "where: condition must be bool, got {}", dtype_name(c.dtype));
  CS_CHECK(a.dtype == b.dtype,
           "where: value dtypes {} and {} differ (shapes {} and {}); cast them to one dtype first",
           dtype_name(a.dtype), dtype_name(b.dtype), shape_str(a.shape), shape_str(b.shape));
  Shape ab = detail::broadcast_shapes(a.shape, b.shape, "where");
  n.shape = detail::broadcast_shapes(c.shape, ab, "where");
  n.dtype = a.dtype;
  check_broadcast_rank(n);
}

// ---- gradient rules (PyTorch's derivatives.yaml conventions) ----
std::vector<Tensor> vjp_Neg(const VjpArgs& a) {
  return {neg(a.grad)};
}
std::vector<Tensor> vjp_Abs(const VjpArgs& a) {
  return {a.grad * sign(a.inputs[0])};
}
CS_NO_VJP(Sign)
std::vector<Tensor> vjp_Exp(const VjpArgs& a) {
  return {a.grad * a.out};
}
std::vector<Tensor> vjp_Log(const VjpArgs& a) {
  return {a.grad / a.inputs[0]};
}
std::vector<Tensor> vjp_Sqrt(const VjpArgs& a) {
  return {a.grad / (2.0 * a.out)};
}
std::vector<Tensor> vjp_Rsqrt(const VjpArgs& a) {
  return {(-0.5 * a.grad) * pow(a.out, 3.0)};
}
std::vector<Tensor> vjp_Reciprocal(const VjpArgs& a) {
  return {-a.grad * (a.out * a.out)};
}
std::vector<Tensor> vjp_Tanh(const VjpArgs& a) {
  return {a.grad * (1.0 - a.out * a.out)};
}
std::vector<Tensor> vjp_Sigmoid(const VjpArgs& a) {
  return {a.grad * (1.0 - a.out) * a.out};
}
std::vector<Tensor> vjp_Relu(const VjpArgs& a) {
  return {detail::dispatch(ir::OpCode::ReluGrad, ir::NoAttrs{}, {a.grad, a.out})};
}
std::vector<Tensor> vjp_Gelu(const VjpArgs& a) {
  return {detail::dispatch(ir::OpCode::GeluGrad, a.node.attrs, {a.grad, a.inputs[0]})};
}
std::vector<Tensor> vjp_Silu(const VjpArgs& a) {
  const Tensor& x = a.inputs[0];
  Tensor s = sigmoid(x);
  return {a.grad * s * (1.0 + x * (1.0 - s))};
}
std::vector<Tensor> vjp_Erf(const VjpArgs& a) {
  const Tensor& x = a.inputs[0];
  return {(2.0 / std::sqrt(M_PI)) * exp(-(x * x)) * a.grad};
}
std::vector<Tensor> vjp_Sin(const VjpArgs& a) {
  return {a.grad * cos(a.inputs[0])};
}
std::vector<Tensor> vjp_Cos(const VjpArgs& a) {
  return {-a.grad * sin(a.inputs[0])};
}
std::vector<Tensor> vjp_Expm1(const VjpArgs& a) {
  return {a.grad * (a.out + 1.0)};
}
CS_NO_VJP(Floor)
CS_NO_VJP(IsFinite)
CS_NO_VJP(LogicalNot)
std::vector<Tensor> vjp_Cast(const VjpArgs& a) {
  return {cast(a.grad, a.inputs[0].dtype())};
}
std::vector<Tensor> vjp_Copy(const VjpArgs& a) {
  return {a.grad};
}

std::vector<Tensor> vjp_Add(const VjpArgs& a) {
  std::vector<Tensor> r(2);
  if (a.needs[0]) r[0] = reduce_to(a.grad, a.inputs[0]);
  if (a.needs[1]) r[1] = reduce_to(a.grad, a.inputs[1]);
  return r;
}
std::vector<Tensor> vjp_Sub(const VjpArgs& a) {
  std::vector<Tensor> r(2);
  if (a.needs[0]) r[0] = reduce_to(a.grad, a.inputs[0]);
  if (a.needs[1]) r[1] = reduce_to(neg(a.grad), a.inputs[1]);
  return r;
}
void infer_Addcmul(ir::Node& n) {
  check_arity(n, 3);
  const auto &a = input(n, 0), &b = input(n, 1), &c = input(n, 2);
  CS_CHECK(a.dtype == b.dtype && b.dtype == c.dtype,
           "addcmul: input dtypes {}, {} and {} differ; cast them to one dtype first",
           dtype_name(a.dtype), dtype_name(b.dtype), dtype_name(c.dtype));
  n.shape = detail::broadcast_shapes(a.shape, detail::broadcast_shapes(b.shape, c.shape, "addcmul"),
                                     "addcmul");
  n.dtype = a.dtype;
  require_float(n, n.dtype);
  check_broadcast_rank(n);
}
std::vector<Tensor> vjp_Addcmul(const VjpArgs& a) {
  std::vector<Tensor> r(3);
  if (a.needs[0]) r[0] = reduce_to(a.grad, a.inputs[0]);
  if (a.needs[1]) r[1] = reduce_to(a.grad * a.inputs[2], a.inputs[1]);
  if (a.needs[2]) r[2] = reduce_to(a.grad * a.inputs[1], a.inputs[2]);
  return r;
}

std::vector<Tensor> vjp_Mul(const VjpArgs& a) {
  std::vector<Tensor> r(2);
  if (a.needs[0]) r[0] = reduce_to(a.grad * a.inputs[1], a.inputs[0]);
  if (a.needs[1]) r[1] = reduce_to(a.grad * a.inputs[0], a.inputs[1]);
  return r;
}
std::vector<Tensor> vjp_Div(const VjpArgs& a) {
  const Tensor &x = a.inputs[0], &y = a.inputs[1];
  std::vector<Tensor> r(2);
  if (a.needs[0]) r[0] = reduce_to(a.grad / y, x);
  if (a.needs[1]) r[1] = reduce_to(-a.grad * ((x / y) / y), y);
  return r;
}
std::vector<Tensor> vjp_Pow(const VjpArgs& a) {
  const Tensor &x = a.inputs[0], &e = a.inputs[1];
  std::vector<Tensor> r(2);
  if (a.needs[0]) {
    // d/dx = e * x^(e-1), defined as 0 where e == 0 (so 0^0 does not give nan).
    Tensor d = where(e == 0.0, 0.0, e * pow(x, e - 1.0));
    r[0] = reduce_to(a.grad * d, x);
  }
  if (a.needs[1]) {
    // d/de = x^e * log(x), defined as 0 where x == 0 and e >= 0 (the limit).
    Tensor d = where(logical_and(x == 0.0, e >= 0.0), 0.0, a.out * log(x));
    r[1] = reduce_to(a.grad * d, e);
  }
  return r;
}
// Ties split the gradient evenly; a nan compares false everywhere and so gets all of it.
std::vector<Tensor> vjp_Maximum(const VjpArgs& a) {
  const Tensor &x = a.inputs[0], &y = a.inputs[1];
  Tensor g = where(x == y, a.grad * 0.5, a.grad);
  std::vector<Tensor> r(2);
  if (a.needs[0]) r[0] = reduce_to(where(x < y, 0.0, g), x);
  if (a.needs[1]) r[1] = reduce_to(where(x > y, 0.0, g), y);
  return r;
}
std::vector<Tensor> vjp_Minimum(const VjpArgs& a) {
  const Tensor &x = a.inputs[0], &y = a.inputs[1];
  Tensor g = where(x == y, a.grad * 0.5, a.grad);
  std::vector<Tensor> r(2);
  if (a.needs[0]) r[0] = reduce_to(where(x > y, 0.0, g), x);
  if (a.needs[1]) r[1] = reduce_to(where(x < y, 0.0, g), y);
  return r;
}
CS_NO_VJP(Eq)
CS_NO_VJP(Ne)
CS_NO_VJP(Lt)
CS_NO_VJP(Le)
CS_NO_VJP(Gt)
CS_NO_VJP(Ge)
CS_NO_VJP(LogicalAnd)
CS_NO_VJP(LogicalOr)
CS_NO_VJP(LogicalXor)
std::vector<Tensor> vjp_Where(const VjpArgs& a) {
  const Tensor& c = a.inputs[0];
  std::vector<Tensor> r(3);
  if (a.needs[1]) r[1] = reduce_to(where(c, a.grad, 0.0), a.inputs[1]);
  if (a.needs[2]) r[2] = reduce_to(where(c, 0.0, a.grad), a.inputs[2]);
  return r;
}
// relu_grad is linear in its incoming gradient; the relu output only selects.
std::vector<Tensor> vjp_ReluGrad(const VjpArgs& a) {
  std::vector<Tensor> r(2);
  if (a.needs[0])
    r[0] = detail::dispatch(ir::OpCode::ReluGrad, ir::NoAttrs{}, {a.grad, a.inputs[1]});
  return r;
}
std::vector<Tensor> vjp_GeluGrad(const VjpArgs& a) {
  CS_CHECK(!a.needs[1], "gelu: the second derivative with respect to the input is not supported");
  std::vector<Tensor> r(2);
  if (a.needs[0])
    r[0] = detail::dispatch(ir::OpCode::GeluGrad, a.node.attrs, {a.grad, a.inputs[1]});
  return r;
}

}  // namespace ops

// ---------------------------------------------------------------------------------------------
// Public functions.

namespace {

using ir::OpCode;

void check_defined(const Tensor& t, const char* op) {
  CS_CHECK(t.defined(), "{}: an input tensor is undefined", op);
}

int category(DType t) {
  return t == DType::boolean ? 0 : is_integral(t) ? 1 : 2;
}

// PyTorch's result_type for two tensors: a 0-d tensor only decides the dtype when it is of a
// higher category (bool < integer < floating) than the dimensioned one, so `bf16 * f32 0-d`
// stays bf16 and `i32 + i64 0-d` stays i32.
DType result_type(const Tensor& a, const Tensor& b) {
  bool za = a.dim() == 0, zb = b.dim() == 0;
  if (za == zb) return promote_types(a.dtype(), b.dtype());
  DType dim_t = za ? b.dtype() : a.dtype();
  DType zero_t = za ? a.dtype() : b.dtype();
  if (category(zero_t) > category(dim_t)) return promote_types(dim_t, zero_t);
  return dim_t;
}

Tensor unary(OpCode op, const Tensor& a, const char* name) {
  check_defined(a, name);
  return detail::dispatch(op, ir::NoAttrs{}, {a});
}
// Math functions give floats for integer and bool inputs, as in PyTorch.
Tensor unary_float(OpCode op, const Tensor& a, const char* name) {
  check_defined(a, name);
  Tensor x = is_floating(a.dtype()) ? a : cast(a, DType::f32);
  return detail::dispatch(op, ir::NoAttrs{}, {x});
}
Tensor binary(OpCode op, const Tensor& a, const Tensor& b, const char* name) {
  check_defined(a, name);
  check_defined(b, name);
  DType t = result_type(a, b);
  return detail::dispatch(op, ir::NoAttrs{}, {cast(a, t), cast(b, t)});
}
// Comparisons and logical ops never build autograd history.
Tensor binary_nograd(OpCode op, const Tensor& a, const Tensor& b, const char* name) {
  NoGradGuard ng;
  return binary(op, a, b, name);
}

}  // namespace

Tensor neg(const Tensor& a) {
  return unary(OpCode::Neg, a, "neg");
}
Tensor abs(const Tensor& a) {
  return unary(OpCode::Abs, a, "abs");
}
Tensor sign(const Tensor& a) {
  NoGradGuard ng;
  return unary(OpCode::Sign, a, "sign");
}
Tensor exp(const Tensor& a) {
  return unary_float(OpCode::Exp, a, "exp");
}
Tensor log(const Tensor& a) {
  return unary_float(OpCode::Log, a, "log");
}
Tensor sqrt(const Tensor& a) {
  return unary_float(OpCode::Sqrt, a, "sqrt");
}
Tensor rsqrt(const Tensor& a) {
  return unary_float(OpCode::Rsqrt, a, "rsqrt");
}
Tensor reciprocal(const Tensor& a) {
  return unary_float(OpCode::Reciprocal, a, "reciprocal");
}
Tensor tanh(const Tensor& a) {
  return unary_float(OpCode::Tanh, a, "tanh");
}
Tensor sigmoid(const Tensor& a) {
  return unary_float(OpCode::Sigmoid, a, "sigmoid");
}
Tensor relu(const Tensor& a) {
  return unary(OpCode::Relu, a, "relu");
}
Tensor gelu(const Tensor& a, bool tanh_approximation) {
  check_defined(a, "gelu");
  Tensor x = is_floating(a.dtype()) ? a : cast(a, DType::f32);
  return detail::dispatch(OpCode::Gelu, ir::GeluAttrs{tanh_approximation}, {x});
}
Tensor silu(const Tensor& a) {
  return unary_float(OpCode::Silu, a, "silu");
}
Tensor erf(const Tensor& a) {
  return unary_float(OpCode::Erf, a, "erf");
}
Tensor sin(const Tensor& a) {
  return unary_float(OpCode::Sin, a, "sin");
}
Tensor cos(const Tensor& a) {
  return unary_float(OpCode::Cos, a, "cos");
}
Tensor expm1(const Tensor& a) {
  return unary_float(OpCode::Expm1, a, "expm1");
}
Tensor floor(const Tensor& a) {
  NoGradGuard ng;  // piecewise constant: no gradient (torch gives zeros)
  if (!is_floating(a.dtype())) return a;
  return unary(OpCode::Floor, a, "floor");
}
Tensor isfinite(const Tensor& a) {
  NoGradGuard ng;
  return unary(OpCode::IsFinite, a, "isfinite");
}
Tensor logical_not(const Tensor& a) {
  NoGradGuard ng;
  return unary(OpCode::LogicalNot, a, "logical_not");
}
Tensor cast(const Tensor& a, DType dtype) {
  check_defined(a, "cast");
  if (a.dtype() == dtype) return a;
  if (!is_floating(dtype)) {  // integer and bool results carry no gradient (as in PyTorch)
    NoGradGuard ng;
    return detail::dispatch(OpCode::Cast, ir::CastAttrs{dtype}, {a});
  }
  return detail::dispatch(OpCode::Cast, ir::CastAttrs{dtype}, {a});
}

Tensor add(const Tensor& a, const Tensor& b) {
  return binary(OpCode::Add, a, b, "add");
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(OpCode::Sub, a, b, "sub");
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(OpCode::Mul, a, b, "mul");
}
Tensor addcmul(const Tensor& a, const Tensor& b, const Tensor& c, double value) {
  check_defined(a, "addcmul");
  check_defined(b, "addcmul");
  check_defined(c, "addcmul");
  DType t = promote_types(a.dtype(), promote_types(b.dtype(), c.dtype()));
  CS_CHECK(is_floating(t), "addcmul: dtype {} is not supported (floating-point dtypes only)",
           dtype_name(t));
  Tensor cc = value == 1.0 ? c : c * value;
  return detail::dispatch(OpCode::Addcmul, ir::NoAttrs{}, {cast(a, t), cast(b, t), cast(cc, t)});
}

Tensor div(const Tensor& a, const Tensor& b) {
  check_defined(a, "div");
  check_defined(b, "div");
  DType t = result_type(a, b);
  if (!is_floating(t)) t = DType::f32;  // true division, as PyTorch
  return detail::dispatch(OpCode::Div, ir::NoAttrs{}, {cast(a, t), cast(b, t)});
}
Tensor pow(const Tensor& a, const Tensor& b) {
  return binary(OpCode::Pow, a, b, "pow");
}
Tensor pow(const Tensor& a, double exponent) {
  check_defined(a, "pow");
  bool negative_int_power = exponent < 0 && exponent == std::floor(exponent);
  CS_CHECK(is_floating(a.dtype()) || !negative_int_power,
           "pow: integers to negative integer powers are not allowed ({} tensor to the power {})",
           dtype_name(a.dtype()), exponent);
  return pow(a, detail::scalar_like(exponent, a));
}
Tensor pow(double base, const Tensor& exponent) {
  check_defined(exponent, "pow");
  return pow(detail::scalar_like(base, exponent), exponent);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  return binary(OpCode::Maximum, a, b, "maximum");
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  return binary(OpCode::Minimum, a, b, "minimum");
}
Tensor eq(const Tensor& a, const Tensor& b) {
  return binary_nograd(OpCode::Eq, a, b, "eq");
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return binary_nograd(OpCode::Ne, a, b, "ne");
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return binary_nograd(OpCode::Lt, a, b, "lt");
}
Tensor le(const Tensor& a, const Tensor& b) {
  return binary_nograd(OpCode::Le, a, b, "le");
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return binary_nograd(OpCode::Gt, a, b, "gt");
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return binary_nograd(OpCode::Ge, a, b, "ge");
}
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return binary_nograd(OpCode::LogicalAnd, a, b, "logical_and");
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return binary_nograd(OpCode::LogicalOr, a, b, "logical_or");
}
Tensor logical_xor(const Tensor& a, const Tensor& b) {
  return binary_nograd(OpCode::LogicalXor, a, b, "logical_xor");
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined(cond, "where");
  check_defined(a, "where");
  check_defined(b, "where");
  DType t = result_type(a, b);
  return detail::dispatch(OpCode::Where, ir::NoAttrs{}, {cond, cast(a, t), cast(b, t)});
}
Tensor where(const Tensor& cond, const Tensor& a, double b) {
  check_defined(a, "where");
  return where(cond, a, detail::scalar_like(b, a));
}
Tensor where(const Tensor& cond, double a, const Tensor& b) {
  check_defined(b, "where");
  return where(cond, detail::scalar_like(a, b), b);
}

// Two selects rather than maximum/minimum: the gradient passes where lo <= a <= hi (ties
// included, as PyTorch's clamp), nan propagates, and lo > hi gives hi everywhere.
Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi) {
  check_defined(a, "clamp");
  CS_CHECK(lo.has_value() || hi.has_value(), "clamp: at least one of min and max must be given");
  Tensor r = a;
  if (lo) r = where(r < *lo, *lo, r);
  if (hi) r = where(r > *hi, *hi, r);
  return r;
}

Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator-(const Tensor& a) {
  return neg(a);
}
Tensor operator+(const Tensor& a, double s) {
  return add(a, detail::scalar_like(s, a));
}
Tensor operator-(const Tensor& a, double s) {
  return sub(a, detail::scalar_like(s, a));
}
Tensor operator*(const Tensor& a, double s) {
  return mul(a, detail::scalar_like(s, a));
}
Tensor operator/(const Tensor& a, double s) {
  return div(a, detail::scalar_like(s, a));
}
Tensor operator+(double s, const Tensor& a) {
  return add(detail::scalar_like(s, a), a);
}
Tensor operator-(double s, const Tensor& a) {
  return sub(detail::scalar_like(s, a), a);
}
Tensor operator*(double s, const Tensor& a) {
  return mul(detail::scalar_like(s, a), a);
}
Tensor operator/(double s, const Tensor& a) {
  return div(detail::scalar_like(s, a), a);
}
Tensor operator==(const Tensor& a, const Tensor& b) {
  return eq(a, b);
}
Tensor operator!=(const Tensor& a, const Tensor& b) {
  return ne(a, b);
}
Tensor operator<(const Tensor& a, const Tensor& b) {
  return lt(a, b);
}
Tensor operator<=(const Tensor& a, const Tensor& b) {
  return le(a, b);
}
Tensor operator>(const Tensor& a, const Tensor& b) {
  return gt(a, b);
}
Tensor operator>=(const Tensor& a, const Tensor& b) {
  return ge(a, b);
}
Tensor operator>(const Tensor& a, double s) {
  return gt(a, detail::scalar_like(s, a));
}
Tensor operator<(const Tensor& a, double s) {
  return lt(a, detail::scalar_like(s, a));
}
Tensor operator>=(const Tensor& a, double s) {
  return ge(a, detail::scalar_like(s, a));
}
Tensor operator<=(const Tensor& a, double s) {
  return le(a, detail::scalar_like(s, a));
}
Tensor operator==(const Tensor& a, double s) {
  return eq(a, detail::scalar_like(s, a));
}

}  // namespace cstorch
