// Reduction ops: sum, mean, amax/amin, argmax, var, logsumexp, norm. Shape rules, gradient
// rules and the public functions; kernels live in backend/cpu/reduction.cpp.
#include <cmath>

#include "amp/autocast_state.h"
#include "core/internal.h"
#include "ops/vjp.h"

namespace cstorch {
namespace ops {
namespace {

// Reduced dims with the "empty = all" convention made explicit.
ir::Dims all_if_empty(const ir::Dims& dims, int64_t rank) {
  if (!dims.empty()) return dims;
  ir::Dims all;
  for (int64_t i = 0; i < rank; ++i) all.push_back(i);
  return all;
}

// Attributes may come from the compiler as well as the public functions: re-validate.
void check_dims(const ir::Dims& dims, const Shape& s, const char* op) {
  const int64_t rank = static_cast<int64_t>(s.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    CS_CHECK(dims[i] >= 0 && dims[i] < rank, "{}: dim {} is out of range for input shape {}", op,
             dims[i], shape_str(s));
    CS_CHECK(i == 0 || dims[i] > dims[i - 1], "{}: dims must be sorted and unique", op);
  }
}

const ir::Node& single_input(const ir::Node& n, const char* op) {
  CS_CHECK(n.inputs.size() == 1, "{}: expected 1 input, got {}", op, n.inputs.size());
  return *n.inputs[0];
}

void check_float(const ir::Node& x, const char* op) {
  CS_CHECK(is_floating(x.dtype),
           "{}: expected a floating-point input, got {} tensor of shape {} (convert it first, "
           "e.g. .to(DType::f32))",
           op, dtype_name(x.dtype), shape_str(x.shape));
}

void infer_reduction(ir::Node& n, const ir::Dims& dims, bool keepdim, const char* op) {
  const auto& x = single_input(n, op);
  check_dims(dims, x.shape, op);
  n.shape = detail::reduced_shape(x.shape, all_if_empty(dims, x.shape.size()), keepdim);
  n.dtype = x.dtype;
}

void check_nonempty_reduction(const ir::Node& n, const ir::Dims& dims, const char* op) {
  const auto& x = *n.inputs[0];
  for (auto d : all_if_empty(dims, x.shape.size()))
    CS_CHECK(x.shape.empty() || x.shape[d] != 0,
             "{}: cannot reduce over dim {} of size 0 (input shape {}); the result would have "
             "no identity",
             op, d, shape_str(x.shape));
}

// ---- gradient helpers ----------------------------------------------------------------------

struct ReduceInfo {
  ir::Dims dims;  // explicit
  bool keepdim;
  Shape in_shape, kshape;  // input shape and the keepdim output shape
  int64_t count;           // elements reduced per output
};

ReduceInfo reduce_info(const Tensor& x, const ir::Dims& dims, bool keepdim) {
  ReduceInfo r{all_if_empty(dims, x.dim()), keepdim, x.shape(), {}, 1};
  r.kshape = detail::reduced_shape(r.in_shape, r.dims, true);
  for (auto d : r.dims) r.count *= r.in_shape[d];
  return r;
}

// A reduced tensor in the keepdim shape, so it broadcasts against the input.
Tensor keep(const Tensor& t, const ReduceInfo& r) {
  return t.shape() == r.kshape ? t : reshape(t, r.kshape);
}

Tensor expand_back(const Tensor& t, const ReduceInfo& r) {
  Tensor k = keep(t, r);
  return k.shape() == r.in_shape ? k : expand(k, r.in_shape);
}

}  // namespace

void infer_Sum(ir::Node& n) {
  const auto& a = n.attr<ir::AxesAttrs>();
  infer_reduction(n, a.dims, a.keepdim, "sum");
  if (!is_floating(n.dtype)) n.dtype = DType::i64;  // torch: integer and bool sums are int64
}
void infer_Mean(ir::Node& n) {
  const auto& a = n.attr<ir::AxesAttrs>();
  infer_reduction(n, a.dims, a.keepdim, "mean");
  check_float(*n.inputs[0], "mean");
}
void infer_Max(ir::Node& n) {
  const auto& a = n.attr<ir::AxesAttrs>();
  infer_reduction(n, a.dims, a.keepdim, "amax");
  check_nonempty_reduction(n, a.dims, "amax");
}
void infer_Min(ir::Node& n) {
  const auto& a = n.attr<ir::AxesAttrs>();
  infer_reduction(n, a.dims, a.keepdim, "amin");
  check_nonempty_reduction(n, a.dims, "amin");
}
void infer_Argmax(ir::Node& n) {
  const auto& a = n.attr<ir::AxesAttrs>();
  const auto& x = single_input(n, "argmax");
  CS_CHECK(a.dims.size() <= 1, "argmax: reduces over at most one dim, got {}", a.dims.size());
  check_dims(a.dims, x.shape, "argmax");
  const bool empty = a.dims.empty() ? x.numel() == 0 : x.shape[a.dims[0]] == 0;
  CS_CHECK(!empty, "argmax: cannot take the argmax of an empty {} (input shape {})",
           a.dims.empty() ? "tensor" : fmt::format("dim {}", a.dims[0]), shape_str(x.shape));
  if (a.dims.empty()) {  // over the flattened tensor; keepdim keeps every dim as size 1
    n.shape = a.keepdim ? Shape(x.shape.size(), 1) : Shape{};
  } else {
    n.shape = detail::reduced_shape(x.shape, a.dims, a.keepdim);
  }
  n.dtype = DType::i64;
}
void infer_Var(ir::Node& n) {
  const auto& a = n.attr<ir::VarAttrs>();
  infer_reduction(n, a.dims, a.keepdim, "var");
  check_float(*n.inputs[0], "var");
}
void infer_LogSumExp(ir::Node& n) {
  const auto& a = n.attr<ir::AxesAttrs>();
  infer_reduction(n, a.dims, a.keepdim, "logsumexp");
  check_float(*n.inputs[0], "logsumexp");
}
void infer_Norm(ir::Node& n) {
  const auto& a = n.attr<ir::NormAttrs>();
  infer_reduction(n, a.dims, a.keepdim, "norm");
  check_float(*n.inputs[0], "norm");
  CS_CHECK(a.p > 0 && std::isfinite(a.p), "norm: p must be positive and finite, got {}", a.p);
}

std::vector<Tensor> vjp_Sum(const VjpArgs& a) {
  const auto& at = a.node.attr<ir::AxesAttrs>();
  auto r = reduce_info(a.inputs[0], at.dims, at.keepdim);
  return {expand_back(a.grad, r)};
}

std::vector<Tensor> vjp_Mean(const VjpArgs& a) {
  const auto& at = a.node.attr<ir::AxesAttrs>();
  auto r = reduce_info(a.inputs[0], at.dims, at.keepdim);
  return {expand_back(a.grad / static_cast<double>(r.count), r)};
}

// The gradient is shared evenly among all elements equal to the extremum (amax/amin).
static std::vector<Tensor> vjp_extremum(const VjpArgs& a) {
  const auto& at = a.node.attr<ir::AxesAttrs>();
  const Tensor& x = a.inputs[0];
  auto r = reduce_info(x, at.dims, at.keepdim);
  Tensor mask = cast(eq(x, keep(a.out, r)), x.dtype());
  Tensor count = sum(mask, r.dims, true);
  return {mul(mask, div(keep(a.grad, r), count))};
}
std::vector<Tensor> vjp_Max(const VjpArgs& a) {
  return vjp_extremum(a);
}
std::vector<Tensor> vjp_Min(const VjpArgs& a) {
  return vjp_extremum(a);
}

CS_NO_VJP(Argmax)

std::vector<Tensor> vjp_Var(const VjpArgs& a) {
  const auto& at = a.node.attr<ir::VarAttrs>();
  const Tensor& x = a.inputs[0];
  auto r = reduce_info(x, at.dims, at.keepdim);
  Tensor m = mean(x, r.dims, true);
  Tensor gk = keep(a.grad, r) * (2.0 / (static_cast<double>(r.count) - at.correction));
  return {mul(sub(x, m), gk)};
}

std::vector<Tensor> vjp_LogSumExp(const VjpArgs& a) {
  const auto& at = a.node.attr<ir::AxesAttrs>();
  const Tensor& x = a.inputs[0];
  auto r = reduce_info(x, at.dims, at.keepdim);
  return {mul(keep(a.grad, r), exp(sub(x, keep(a.out, r))))};
}

// torch's norm_backward, case by case; where the norm is 0 the gradient is 0.
std::vector<Tensor> vjp_Norm(const VjpArgs& a) {
  const auto& at = a.node.attr<ir::NormAttrs>();
  const Tensor& x = a.inputs[0];
  const double p = at.p;
  auto r = reduce_info(x, at.dims, at.keepdim);
  Tensor g = keep(a.grad, r), nrm = keep(a.out, r);
  if (p == 1) return {mul(sign(x), g)};
  if (p == 2) return {mul(g, where(nrm == 0.0, 0.0, div(x, nrm)))};
  if (p < 1) {
    Tensor scaled = mul(sign(x), where(x == 0.0, 0.0, pow(abs(x), p - 1)));
    return {mul(scaled, mul(g, pow(nrm, 1 - p)))};
  }
  Tensor scaled = p < 2 ? mul(sign(x), pow(abs(x), p - 1)) : mul(x, pow(abs(x), p - 2));
  Tensor scale = where(nrm == 0.0, 0.0, div(g, pow(nrm, p - 1)));
  return {mul(scaled, scale)};
}

}  // namespace ops

using ir::OpCode;

Tensor sum(const Tensor& a_in, std::vector<int64_t> dims, bool keepdim) {
  Tensor a = amp::detail::to_f32(a_in);  // autocast: reduce in f32
  return detail::dispatch(
      OpCode::Sum, ir::AxesAttrs{detail::normalize_dims(dims, a.dim(), "sum"), keepdim}, {a});
}
Tensor mean(const Tensor& a_in, std::vector<int64_t> dims, bool keepdim) {
  Tensor a = amp::detail::to_f32(a_in);  // autocast: reduce in f32
  return detail::dispatch(
      OpCode::Mean, ir::AxesAttrs{detail::normalize_dims(dims, a.dim(), "mean"), keepdim}, {a});
}
Tensor amax(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return detail::dispatch(
      OpCode::Max, ir::AxesAttrs{detail::normalize_dims(dims, a.dim(), "amax"), keepdim}, {a});
}
Tensor amin(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return detail::dispatch(
      OpCode::Min, ir::AxesAttrs{detail::normalize_dims(dims, a.dim(), "amin"), keepdim}, {a});
}
Tensor max(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return amax(a, std::move(dims), keepdim);
}
Tensor min(const Tensor& a, std::vector<int64_t> dims, bool keepdim) {
  return amin(a, std::move(dims), keepdim);
}
Tensor argmax(const Tensor& a, std::optional<int64_t> dim, bool keepdim) {
  ir::Dims dims;
  if (dim) dims = detail::normalize_dims({*dim}, a.dim(), "argmax");  // empty for a 0-d input
  return detail::dispatch(OpCode::Argmax, ir::AxesAttrs{dims, keepdim}, {a});
}
Tensor var(const Tensor& a_in, std::vector<int64_t> dims, double correction, bool keepdim) {
  Tensor a = amp::detail::to_f32(a_in);  // autocast: reduce in f32
  return detail::dispatch(
      OpCode::Var, ir::VarAttrs{detail::normalize_dims(dims, a.dim(), "var"), keepdim, correction},
      {a});
}
Tensor logsumexp(const Tensor& a_in, std::vector<int64_t> dims, bool keepdim) {
  Tensor a = amp::detail::to_f32(a_in);  // autocast: reduce in f32
  return detail::dispatch(
      OpCode::LogSumExp, ir::AxesAttrs{detail::normalize_dims(dims, a.dim(), "logsumexp"), keepdim},
      {a});
}
Tensor norm(const Tensor& a_in, double p, std::vector<int64_t> dims, bool keepdim) {
  Tensor a = amp::detail::to_f32(a_in);  // autocast: reduce in f32
  CS_CHECK(p > 0 && std::isfinite(p), "norm: p must be positive and finite, got {}", p);
  return detail::dispatch(
      OpCode::Norm, ir::NormAttrs{detail::normalize_dims(dims, a.dim(), "norm"), keepdim, p}, {a});
}

}  // namespace cstorch
