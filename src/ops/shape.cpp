// Shape and indexing ops: shape rules and gradients of Reshape, Permute, Expand, Slice, Cat,
// IndexSelect, IndexAdd, Gather, ScatterAdd and Tri, and the public functions built on them.
#include <algorithm>
#include <numeric>

#include "core/internal.h"
#include "ir/device.h"
#include "ops/vjp.h"

namespace cstorch {

namespace {

// Kernels walk tensors with fixed-size index arrays (ir::kMaxDims); a backend may support fewer
// dims (its max_rank capability).
constexpr int64_t kMaxRank = ir::kMaxDims;

int64_t rank_of(const Shape& s) {
  return static_cast<int64_t>(s.size());
}

void check_arity(const ir::Node& n, size_t k, const char* op) {
  CS_CHECK(n.inputs.size() == k, "{}: expects {} inputs, got {}", op, k, n.inputs.size());
}

void check_max_rank(const ir::Node& n, const Shape& s, const char* op) {
  const int64_t max_rank = std::min<int64_t>(kMaxRank, ir::device_backend(n.device).max_rank());
  CS_CHECK(rank_of(s) <= max_rank,
           "{}: tensors of rank {} (shape {}) are not supported on device {}; at most {}", op,
           s.size(), shape_str(s), device_str(n.device), max_rank);
}

void check_index_dtype(DType t, const char* op) {
  CS_CHECK(t == DType::i32 || t == DType::i64, "{}: index must be an i32 or i64 tensor, got {}", op,
           dtype_name(t));
}

Shape with_dim(Shape s, int64_t dim, int64_t size) {
  s[dim] = size;
  return s;
}

bool is_identity_perm(const ir::Dims& p) {
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != static_cast<int64_t>(i)) return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Shape rules and gradient rules.
namespace ops {

void infer_Reshape(ir::Node& n) {
  check_arity(n, 1, "reshape");
  const auto& in = *n.inputs[0];
  const auto& s = n.attr<ir::ShapeAttrs>().shape;
  for (auto d : s) CS_CHECK(d >= 0, "reshape: invalid target shape {}", shape_str(s));
  CS_CHECK(numel(s) == in.numel(),
           "reshape: cannot reshape a tensor of shape {} ({} elements) into {}",
           shape_str(in.shape), in.numel(), shape_str(s));
  n.shape = s;
  n.dtype = in.dtype;
}

void infer_Permute(ir::Node& n) {
  check_arity(n, 1, "permute");
  const auto& in = *n.inputs[0];
  const auto& p = n.attr<ir::PermuteAttrs>().perm;
  int64_t r = rank_of(in.shape);
  bool ok = rank_of(p) == r;
  bool seen[kMaxRank] = {};
  for (size_t i = 0; ok && i < p.size(); ++i) {
    ok = p[i] >= 0 && p[i] < r && p[i] < kMaxRank && !seen[p[i]];
    if (ok) seen[p[i]] = true;
  }
  CS_CHECK(ok, "permute: {} is not a permutation of {} dims (tensor shape {})", shape_str(p), r,
           shape_str(in.shape));
  check_max_rank(n, in.shape, "permute");
  n.shape.resize(r);
  for (int64_t k = 0; k < r; ++k) n.shape[k] = in.shape[p[k]];
  n.dtype = in.dtype;
}

void infer_Expand(ir::Node& n) {
  check_arity(n, 1, "expand");
  const auto& in = *n.inputs[0];
  const auto& t = n.attr<ir::ShapeAttrs>().shape;
  int64_t r = rank_of(in.shape), tr = rank_of(t);
  CS_CHECK(tr >= r, "expand: cannot expand a tensor of shape {} to {}: the target has fewer dims",
           shape_str(in.shape), shape_str(t));
  for (int64_t j = 0; j < tr; ++j) {
    int64_t i = j - (tr - r);
    CS_CHECK(t[j] >= 0 && (i < 0 || in.shape[i] == t[j] || in.shape[i] == 1),
             "expand: cannot expand a tensor of shape {} to {} (dim {})", shape_str(in.shape),
             shape_str(t), j);
  }
  check_max_rank(n, t, "expand");
  n.shape = t;
  n.dtype = in.dtype;
}

void infer_Slice(ir::Node& n) {
  check_arity(n, 1, "slice");
  const auto& in = *n.inputs[0];
  const auto& a = n.attr<ir::SliceAttrs>();
  int64_t r = rank_of(in.shape);
  CS_CHECK(a.dim >= 0 && a.dim < r, "slice: dim {} is out of range for a tensor of shape {}", a.dim,
           shape_str(in.shape));
  int64_t size = in.shape[a.dim];
  CS_CHECK(a.step > 0 && 0 <= a.start && a.start <= a.end && a.end <= size,
           "slice: invalid bounds start={} end={} step={} for dim {} of size {}", a.start, a.end,
           a.step, a.dim, size);
  n.shape = with_dim(in.shape, a.dim, (a.end - a.start + a.step - 1) / a.step);
  n.dtype = in.dtype;
}

void infer_Cat(ir::Node& n) {
  CS_CHECK(!n.inputs.empty(), "cat: expects a non-empty list of tensors");
  const auto& first = *n.inputs[0];
  int64_t r = rank_of(first.shape);
  int64_t dim = n.attr<ir::DimAttrs>().dim;
  CS_CHECK(r >= 1, "cat: zero-dimensional tensor (input 0) cannot be concatenated");
  CS_CHECK(dim >= 0 && dim < r, "cat: dim {} is out of range for tensors of shape {}", dim,
           shape_str(first.shape));
  int64_t total = 0;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const auto& in = *n.inputs[k];
    CS_CHECK(in.dtype == first.dtype,
             "cat: tensors must have the same dtype; got {} (input 0) and {} (input {})",
             dtype_name(first.dtype), dtype_name(in.dtype), k);
    CS_CHECK(rank_of(in.shape) == r,
             "cat: tensors must have the same number of dims; got {} and {}",
             shape_str(first.shape), shape_str(in.shape));
    for (int64_t d = 0; d < r; ++d)
      CS_CHECK(d == dim || in.shape[d] == first.shape[d],
               "cat: tensors must have the same shape except in dim {}; got {} and {}", dim,
               shape_str(first.shape), shape_str(in.shape));
    total += in.shape[dim];
  }
  n.shape = with_dim(first.shape, dim, total);
  n.dtype = first.dtype;
}

// Shared by IndexSelect and IndexAdd: the index is a vector (or a single 0-d index).
static void check_index_vector(const ir::Node& a, const ir::Node& index, int64_t dim,
                               const char* op) {
  check_index_dtype(index.dtype, op);
  CS_CHECK(rank_of(index.shape) <= 1, "{}: index must be 1-d, got shape {}", op,
           shape_str(index.shape));
  int64_t r = std::max<int64_t>(rank_of(a.shape), 1);
  CS_CHECK(dim >= 0 && dim < r, "{}: dim {} is out of range for a tensor of shape {}", op, dim,
           shape_str(a.shape));
  CS_CHECK(!a.shape.empty() || index.numel() == 1,
           "{}: indexing a 0-d tensor needs exactly one index, got {}", op, index.numel());
}

void infer_IndexSelect(ir::Node& n) {
  check_arity(n, 2, "index_select");
  const auto& a = *n.inputs[0];
  const auto& index = *n.inputs[1];
  int64_t dim = n.attr<ir::DimAttrs>().dim;
  check_index_vector(a, index, dim, "index_select");
  n.shape = a.shape.empty() ? Shape{} : with_dim(a.shape, dim, index.numel());
  n.dtype = a.dtype;
}

void infer_IndexAdd(ir::Node& n) {
  check_arity(n, 3, "index_add");
  const auto& a = *n.inputs[0];
  const auto& index = *n.inputs[1];
  const auto& src = *n.inputs[2];
  int64_t dim = n.attr<ir::DimAttrs>().dim;
  check_index_vector(a, index, dim, "index_add");
  CS_CHECK(src.dtype == a.dtype, "index_add: src dtype {} does not match the tensor's dtype {}",
           dtype_name(src.dtype), dtype_name(a.dtype));
  Shape want = a.shape.empty() ? Shape{} : with_dim(a.shape, dim, index.numel());
  CS_CHECK(src.shape == want,
           "index_add: src must have shape {} (the tensor's shape {} with dim {} of size {} = "
           "number of indices), got {}",
           shape_str(want), shape_str(a.shape), dim, index.numel(), shape_str(src.shape));
  n.shape = a.shape;
  n.dtype = a.dtype;
}

void infer_Gather(ir::Node& n) {
  check_arity(n, 2, "gather");
  const auto& a = *n.inputs[0];
  const auto& index = *n.inputs[1];
  int64_t dim = n.attr<ir::DimAttrs>().dim;
  check_index_dtype(index.dtype, "gather");
  int64_t r = rank_of(a.shape);
  CS_CHECK(rank_of(index.shape) == r,
           "gather: index must have the same number of dims as the tensor; got index shape {} "
           "and tensor shape {}",
           shape_str(index.shape), shape_str(a.shape));
  CS_CHECK(dim >= 0 && dim < std::max<int64_t>(r, 1),
           "gather: dim {} is out of range for a tensor of shape {}", dim, shape_str(a.shape));
  for (int64_t d = 0; d < r; ++d)
    CS_CHECK(d == dim || index.shape[d] <= a.shape[d],
             "gather: index shape {} must not exceed the tensor shape {} except in dim {}",
             shape_str(index.shape), shape_str(a.shape), dim);
  check_max_rank(n, a.shape, "gather");
  n.shape = index.shape;
  n.dtype = a.dtype;
}

void infer_ScatterAdd(ir::Node& n) {
  check_arity(n, 3, "scatter_add");
  const auto& a = *n.inputs[0];
  const auto& index = *n.inputs[1];
  const auto& src = *n.inputs[2];
  int64_t dim = n.attr<ir::DimAttrs>().dim;
  check_index_dtype(index.dtype, "scatter_add");
  CS_CHECK(src.dtype == a.dtype, "scatter_add: src dtype {} does not match the tensor's dtype {}",
           dtype_name(src.dtype), dtype_name(a.dtype));
  int64_t r = rank_of(a.shape);
  CS_CHECK(rank_of(index.shape) == r && rank_of(src.shape) == r,
           "scatter_add: tensor, index and src must have the same number of dims; got {}, {} "
           "and {}",
           shape_str(a.shape), shape_str(index.shape), shape_str(src.shape));
  CS_CHECK(dim >= 0 && dim < std::max<int64_t>(r, 1),
           "scatter_add: dim {} is out of range for a tensor of shape {}", dim, shape_str(a.shape));
  for (int64_t d = 0; d < r; ++d) {
    CS_CHECK(index.shape[d] <= src.shape[d],
             "scatter_add: index shape {} must not exceed the src shape {}", shape_str(index.shape),
             shape_str(src.shape));
    CS_CHECK(d == dim || index.shape[d] <= a.shape[d],
             "scatter_add: index shape {} must not exceed the tensor shape {} except in dim {}",
             shape_str(index.shape), shape_str(a.shape), dim);
  }
  check_max_rank(n, a.shape, "scatter_add");
  n.shape = a.shape;
  n.dtype = a.dtype;
}

void infer_Tri(ir::Node& n) {
  const char* op = n.attr<ir::TriAttrs>().upper ? "triu" : "tril";
  check_arity(n, 1, op);
  const auto& in = *n.inputs[0];
  CS_CHECK(rank_of(in.shape) >= 2, "{}: the tensor must have at least 2 dims, got shape {}", op,
           shape_str(in.shape));
  n.shape = in.shape;
  n.dtype = in.dtype;
}

std::vector<Tensor> vjp_Reshape(const VjpArgs& a) {
  return {reshape(a.grad, a.inputs[0].shape())};
}

std::vector<Tensor> vjp_Permute(const VjpArgs& a) {
  const auto& p = a.node.attr<ir::PermuteAttrs>().perm;
  std::vector<int64_t> inv(p.size());
  for (size_t k = 0; k < p.size(); ++k) inv[p[k]] = static_cast<int64_t>(k);
  return {permute(a.grad, inv)};
}

std::vector<Tensor> vjp_Expand(const VjpArgs& a) {
  return {sum_to(a.grad, a.inputs[0].shape())};
}

std::vector<Tensor> vjp_Slice(const VjpArgs& a) {
  const auto& s = a.node.attr<ir::SliceAttrs>();
  const Shape& in = a.inputs[0].shape();
  DType t = a.grad.dtype();
  if (s.step == 1) {
    // Zero padding on both sides of the slice.
    std::vector<Tensor> parts;
    if (s.start > 0) parts.push_back(zeros(with_dim(in, s.dim, s.start), t, a.grad.device()));
    parts.push_back(a.grad);
    int64_t after = in[s.dim] - s.end;
    if (after > 0) parts.push_back(zeros(with_dim(in, s.dim, after), t, a.grad.device()));
    return {cat(parts, s.dim)};
  }
  // Strided: the gradient rows land at start, start + step, ...
  Tensor idx = arange(static_cast<double>(s.start), static_cast<double>(s.end),
                      static_cast<double>(s.step), DType::i64)
                   .to(a.grad.device());
  return {index_add(zeros(in, t, a.grad.device()), s.dim, idx, a.grad)};
}

std::vector<Tensor> vjp_Cat(const VjpArgs& a) {
  int64_t dim = a.node.attr<ir::DimAttrs>().dim;
  std::vector<Tensor> g(a.inputs.size());
  int64_t off = 0;
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    int64_t len = a.inputs[i].shape()[dim];
    if (a.needs[i]) g[i] = slice(a.grad, dim, off, off + len);
    off += len;
  }
  return g;
}

std::vector<Tensor> vjp_IndexSelect(const VjpArgs& a) {
  int64_t dim = a.node.attr<ir::DimAttrs>().dim;
  return {index_add(zeros(a.inputs[0].shape(), a.grad.dtype(), a.grad.device()), dim, a.inputs[1],
                    a.grad),
          Tensor()};
}

std::vector<Tensor> vjp_IndexAdd(const VjpArgs& a) {
  int64_t dim = a.node.attr<ir::DimAttrs>().dim;
  std::vector<Tensor> g(3);
  if (a.needs[0]) g[0] = a.grad;
  if (a.needs[2]) g[2] = index_select(a.grad, dim, a.inputs[1]);
  return g;
}

std::vector<Tensor> vjp_Gather(const VjpArgs& a) {
  int64_t dim = a.node.attr<ir::DimAttrs>().dim;
  return {scatter_add(zeros(a.inputs[0].shape(), a.grad.dtype(), a.grad.device()), dim, a.inputs[1],
                      a.grad),
          Tensor()};
}

std::vector<Tensor> vjp_ScatterAdd(const VjpArgs& a) {
  int64_t dim = a.node.attr<ir::DimAttrs>().dim;
  std::vector<Tensor> g(3);
  if (a.needs[0]) g[0] = a.grad;
  if (a.needs[2]) {
    Tensor gs = gather(a.grad, dim, a.inputs[1]);
    // src entries outside the index's extent were never added: their gradient is zero.
    const Shape& src = a.inputs[2].shape();
    for (int64_t d = 0; d < rank_of(src); ++d) {
      int64_t missing = src[d] - gs.shape()[d];
      if (missing > 0)
        gs = cat({gs, zeros(with_dim(gs.shape(), d, missing), gs.dtype(), gs.device())}, d);
    }
    g[2] = gs;
  }
  return g;
}

std::vector<Tensor> vjp_Tri(const VjpArgs& a) {
  return {detail::dispatch(ir::OpCode::Tri, a.node.attrs, {a.grad})};
}

}  // namespace ops

// ---------------------------------------------------------------------------------------------
// Public functions.

Tensor reshape(const Tensor& a, const Shape& s) {
  const Shape& in = a.shape();
  Shape out = s;
  int64_t infer_at = -1, known = 1;
  for (int64_t i = 0; i < rank_of(s); ++i) {
    if (s[i] == -1) {
      CS_CHECK(infer_at < 0, "reshape: only one dimension can be -1; got {}", shape_str(s));
      infer_at = i;
    } else {
      CS_CHECK(s[i] >= 0, "reshape: invalid size {} in target shape {}", s[i], shape_str(s));
      known *= s[i];
    }
  }
  if (infer_at >= 0) {
    CS_CHECK(known != 0,
             "reshape: cannot reshape a tensor of shape {} ({} elements) into {}: the size of "
             "the -1 dim is ambiguous",
             shape_str(in), numel(in), shape_str(s));
    CS_CHECK(numel(in) % known == 0,
             "reshape: cannot reshape a tensor of shape {} ({} elements) into {}", shape_str(in),
             numel(in), shape_str(s));
    out[infer_at] = numel(in) / known;
  }
  CS_CHECK(numel(out) == numel(in),
           "reshape: cannot reshape a tensor of shape {} ({} elements) into {}", shape_str(in),
           numel(in), shape_str(s));
  if (out == in) return a;
  return detail::dispatch(ir::OpCode::Reshape, ir::ShapeAttrs{out}, {a});
}

Tensor permute(const Tensor& a, const std::vector<int64_t>& perm) {
  int64_t r = a.dim();
  ir::Dims p(perm.size());
  bool ok = rank_of(perm) == r;
  std::vector<bool> seen(static_cast<size_t>(r), false);
  for (size_t i = 0; ok && i < perm.size(); ++i) {
    p[i] = perm[i] < 0 ? perm[i] + r : perm[i];
    ok = p[i] >= 0 && p[i] < r && !seen[p[i]];
    if (ok) seen[p[i]] = true;
  }
  CS_CHECK(ok, "permute: {} is not a permutation of {} dims (tensor shape {})", shape_str(perm), r,
           shape_str(a.shape()));
  if (is_identity_perm(p)) return a;
  return detail::dispatch(ir::OpCode::Permute, ir::PermuteAttrs{p}, {a});
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  int64_t r = a.dim();
  d0 = normalize_dim(d0, std::max<int64_t>(r, 1), "transpose");
  d1 = normalize_dim(d1, std::max<int64_t>(r, 1), "transpose");
  if (d0 == d1) return a;
  std::vector<int64_t> p(static_cast<size_t>(r));
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[d0], p[d1]);
  return permute(a, p);
}

Tensor expand(const Tensor& a, const Shape& s) {
  const Shape& in = a.shape();
  int64_t r = rank_of(in), tr = rank_of(s);
  CS_CHECK(tr >= r,
           "expand: cannot expand a tensor of shape {} to {}: the target has fewer dims ({}) "
           "than the tensor ({})",
           shape_str(in), shape_str(s), tr, r);
  Shape out(s.size());
  for (int64_t j = 0; j < tr; ++j) {
    int64_t i = j - (tr - r);
    if (i < 0) {
      CS_CHECK(s[j] >= 0,
               "expand: cannot expand a tensor of shape {} to {}: size {} is not "
               "allowed in a new leading dim ({})",
               shape_str(in), shape_str(s), s[j], j);
      out[j] = s[j];
    } else if (s[j] == -1) {
      out[j] = in[i];
    } else {
      CS_CHECK(s[j] >= 0 && (in[i] == s[j] || in[i] == 1),
               "expand: cannot expand a tensor of shape {} to {}: dim {} has size {}, which is "
               "neither 1 nor {}",
               shape_str(in), shape_str(s), j, in[i], s[j]);
      out[j] = s[j];
    }
  }
  if (out == in) return a;
  return detail::dispatch(ir::OpCode::Expand, ir::ShapeAttrs{out}, {a});
}

Tensor broadcast_to(const Tensor& a, const Shape& s) {
  return expand(a, s);
}

Tensor squeeze(const Tensor& a, std::optional<int64_t> dim) {
  const Shape& in = a.shape();
  Shape out;
  if (!dim) {
    for (auto d : in)
      if (d != 1) out.push_back(d);
  } else {
    int64_t d = normalize_dim(*dim, std::max<int64_t>(a.dim(), 1), "squeeze");
    if (in.empty() || in[d] != 1) return a;  // PyTorch leaves a non-1 dim unchanged
    out = in;
    out.erase(out.begin() + d);
  }
  return reshape(a, out);
}

Tensor unsqueeze(const Tensor& a, int64_t dim) {
  int64_t d = normalize_dim(dim, a.dim() + 1, "unsqueeze");
  Shape out = a.shape();
  out.insert(out.begin() + d, 1);
  return reshape(a, out);
}

Tensor flatten(const Tensor& a, int64_t start_dim, int64_t end_dim) {
  int64_t r = a.dim();
  int64_t s = normalize_dim(start_dim, std::max<int64_t>(r, 1), "flatten");
  int64_t e = normalize_dim(end_dim, std::max<int64_t>(r, 1), "flatten");
  CS_CHECK(s <= e, "flatten: start_dim {} comes after end_dim {} (tensor shape {})", start_dim,
           end_dim, shape_str(a.shape()));
  if (r == 0) return reshape(a, {1});
  const Shape& in = a.shape();
  Shape out(in.begin(), in.begin() + s);
  int64_t m = 1;
  for (int64_t i = s; i <= e; ++i) m *= in[i];
  out.push_back(m);
  out.insert(out.end(), in.begin() + e + 1, in.end());
  return reshape(a, out);
}

Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  CS_CHECK(a.dim() > 0, "slice: cannot slice a 0-d tensor");
  CS_CHECK(step > 0, "slice: step must be positive, got {}", step);
  int64_t d = normalize_dim(dim, a.dim(), "slice");
  int64_t size = a.shape()[d];
  auto clamp_bound = [size](int64_t b) {
    if (b < 0) b += size;
    return std::clamp<int64_t>(b, 0, size);
  };
  int64_t b = clamp_bound(start), e = std::max(clamp_bound(end), b);
  int64_t len = (e - b + step - 1) / step;
  // Canonical end (just past the last element taken) so equal slices compare equal in CSE.
  e = len == 0 ? b : b + (len - 1) * step + 1;
  if (len == size) return a;
  return detail::dispatch(ir::OpCode::Slice, ir::SliceAttrs{d, b, e, len > 1 ? step : 1}, {a});
}

std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim) {
  CS_CHECK(a.dim() > 0, "split: cannot split a 0-d tensor");
  int64_t d = normalize_dim(dim, a.dim(), "split");
  int64_t size = a.shape()[d];
  CS_CHECK(split_size > 0 || (split_size == 0 && size == 0),
           "split: split_size must be positive, got {} (dim {} has size {})", split_size, d, size);
  std::vector<Tensor> out;
  if (size == 0) return {a};
  for (int64_t b = 0; b < size; b += split_size)
    out.push_back(slice(a, d, b, std::min(size, b + split_size)));
  return out;
}

std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim) {
  CS_CHECK(a.dim() > 0, "split: cannot split a 0-d tensor");
  int64_t d = normalize_dim(dim, a.dim(), "split");
  int64_t total = 0;
  for (auto s : sizes) {
    CS_CHECK(s >= 0, "split: sizes must be non-negative, got {}", shape_str(sizes));
    total += s;
  }
  CS_CHECK(total == a.shape()[d],
           "split: sizes {} sum to {} but dim {} of the tensor (shape {}) has size {}",
           shape_str(sizes), total, d, shape_str(a.shape()), a.shape()[d]);
  std::vector<Tensor> out;
  int64_t b = 0;
  for (auto s : sizes) {
    out.push_back(slice(a, d, b, b + s));
    b += s;
  }
  return out;
}

Tensor cat(const std::vector<Tensor>& ts_in, int64_t dim) {
  CS_CHECK(!ts_in.empty(), "cat: expects a non-empty list of tensors");
  // PyTorch skips 1-d empty tensors (shape [0]) when concatenating higher-rank tensors.
  std::vector<Tensor> ts;
  for (const auto& t : ts_in) {
    CS_CHECK(t.defined(), "cat: an input tensor is undefined");
    if (!(t.dim() == 1 && t.numel() == 0)) ts.push_back(t);
  }
  DType dt = ts_in[0].dtype();
  for (const auto& t : ts_in) dt = promote_types(dt, t.dtype());
  if (ts.empty()) ts.push_back(ts_in[0]);
  for (size_t k = 0; k < ts.size(); ++k)
    CS_CHECK(ts[k].dim() > 0, "cat: zero-dimensional tensor (input {}) cannot be concatenated", k);
  int64_t d = normalize_dim(dim, ts[0].dim(), "cat");
  for (auto& t : ts)
    if (t.dtype() != dt) t = cast(t, dt);
  if (ts.size() == 1) return ts[0];
  return detail::dispatch(ir::OpCode::Cat, ir::DimAttrs{d}, ts);
}

Tensor stack(const std::vector<Tensor>& ts, int64_t dim) {
  CS_CHECK(!ts.empty(), "stack: expects a non-empty list of tensors");
  for (size_t k = 1; k < ts.size(); ++k)
    CS_CHECK(ts[k].shape() == ts[0].shape(),
             "stack: expects each tensor to be equal size, but got {} at entry 0 and {} at "
             "entry {}",
             shape_str(ts[0].shape()), shape_str(ts[k].shape()), k);
  int64_t d = normalize_dim(dim, ts[0].dim() + 1, "stack");
  std::vector<Tensor> us;
  us.reserve(ts.size());
  for (const auto& t : ts) us.push_back(unsqueeze(t, d));
  return cat(us, d);
}

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  int64_t d = normalize_dim(dim, std::max<int64_t>(a.dim(), 1), "index_select");
  return detail::dispatch(ir::OpCode::IndexSelect, ir::DimAttrs{d}, {a, index});
}

Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  int64_t d = normalize_dim(dim, std::max<int64_t>(a.dim(), 1), "index_add");
  return detail::dispatch(ir::OpCode::IndexAdd, ir::DimAttrs{d}, {a, index, src});
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  int64_t d = normalize_dim(dim, std::max<int64_t>(a.dim(), 1), "gather");
  return detail::dispatch(ir::OpCode::Gather, ir::DimAttrs{d}, {a, index});
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  int64_t d = normalize_dim(dim, std::max<int64_t>(a.dim(), 1), "scatter_add");
  return detail::dispatch(ir::OpCode::ScatterAdd, ir::DimAttrs{d}, {a, index, src});
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, double value) {
  CS_CHECK(mask.dtype() == DType::boolean, "masked_fill: mask must be a bool tensor, got {}",
           dtype_name(mask.dtype()));
  detail::broadcast_shapes(a.shape(), mask.shape(), "masked_fill");
  // The value takes the tensor's dtype (PyTorch casts it), so `where` keeps a's dtype.
  return where(mask, scalar_tensor(value, a.dtype()), a);
}

static Tensor tri(const Tensor& a, int64_t diagonal, bool upper) {
  return detail::dispatch(ir::OpCode::Tri, ir::TriAttrs{diagonal, upper}, {a});
}
Tensor triu(const Tensor& a, int64_t diagonal) {
  return tri(a, diagonal, true);
}
Tensor tril(const Tensor& a, int64_t diagonal) {
  return tri(a, diagonal, false);
}

Tensor sum_to(const Tensor& a, const Shape& shape) {
  const Shape& in = a.shape();
  if (in == shape) return a;
  int64_t r = rank_of(in), tr = rank_of(shape), lead = r - tr;
  CS_CHECK(lead >= 0, "sum_to: cannot sum a tensor of shape {} to the larger rank shape {}",
           shape_str(in), shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < lead; ++i) dims.push_back(i);
  for (int64_t j = 0; j < tr; ++j) {
    int64_t i = j + lead;
    if (shape[j] == in[i]) continue;
    CS_CHECK(shape[j] == 1,
             "sum_to: cannot sum a tensor of shape {} to {} (dim {}: {} vs {}); the target must "
             "be a shape the tensor was broadcast from",
             shape_str(in), shape_str(shape), i, in[i], shape[j]);
    dims.push_back(i);
  }
  // dims is never empty here: equal shapes returned above.
  return reshape(sum(a, dims, /*keepdim=*/true), shape);
}

}  // namespace cstorch
