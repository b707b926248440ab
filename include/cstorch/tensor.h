// cstorch::Tensor: a cheap handle to a graph node (op, inputs, shape, dtype, device) with an
// optional buffer. Outside a traced step every op runs at once (eager); inside cstorch::trace
// ops only record nodes and reading a value is an error that points to step closures.
// All ops follow NumPy/PyTorch broadcasting and PyTorch dtype promotion; errors name the op,
// the shapes and the dtypes involved.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cstorch/core/dtype.h"
#include "cstorch/core/error.h"
#include "cstorch/core/shape.h"

namespace cstorch {

namespace ir {
struct Node;
}

struct TensorImpl;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;
  int64_t numel() const;
  DType dtype() const;
  Device device() const;

  // Autograd. requires_grad may only be set on leaves (tensors not computed from others).
  bool requires_grad() const;
  Tensor& set_requires_grad(bool r = true);
  bool is_leaf() const;
  Tensor grad() const;  // undefined when no gradient has been accumulated
  void set_grad(const Tensor& g);
  // Reverse-mode autodiff from this tensor. `grad` defaults to ones for a scalar; a
  // non-scalar without `grad` is an error.
  void backward(const Tensor& grad = Tensor()) const;
  Tensor detach() const;

  // Host reads: wait for pending steps; an error inside a traced step. On a device whose memory
  // the host cannot read, item() and to_vector() copy through the device's transfer function.
  template <class T>
  T item() const;
  template <class T>
  std::vector<T> to_vector() const;
  // Pointer to host data (contiguous, row-major). Waits for pending steps. An error for a
  // tensor on a device whose memory the host cannot read (copy it with .to(Device{}) first).
  const void* data_ptr() const;

  // In-place ops: update this tensor's value (a state write inside a traced step).
  Tensor& copy_(const Tensor& src);
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& sub_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double s);
  Tensor& div_(const Tensor& other);
  Tensor& fill_(double v);
  Tensor& zero_() { return fill_(0.0); }

  // Shape conveniences (see free functions below).
  Tensor reshape(const Shape& s) const;
  Tensor view(const Shape& s) const { return reshape(s); }
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  // Transpose of a matrix; 0-d and 1-d tensors are returned as they are (as torch).
  Tensor t() const;
  Tensor permute(const std::vector<int64_t>& perm) const;
  Tensor unsqueeze(int64_t d) const;
  Tensor squeeze(std::optional<int64_t> d = std::nullopt) const;
  Tensor expand(const Shape& s) const;
  Tensor to(DType t) const;
  // The value on device `d` (this tensor when it is there already). Differentiable: the
  // gradient goes back to this tensor's device. Errors: a device this binary was built without
  // (GPU without the CUDA backend) or that no plugin registered.
  Tensor to(Device d) const;
  Tensor sum(std::vector<int64_t> dims = {}, bool keepdim = false) const;
  Tensor mean(std::vector<int64_t> dims = {}, bool keepdim = false) const;

  std::string to_string() const;  // values (waits) or a description inside a trace
  const std::string& name() const;
  Tensor& set_name(std::string n);

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  std::shared_ptr<ir::Node> node() const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// ---------------------------------------------------------------------------------------------
// Creation. `dtype` defaults to f32, `device` to the CPU; the *_like functions keep the
// tensor's shape, dtype and device.
Tensor zeros(const Shape& s, DType dtype = DType::f32, Device device = {});
Tensor ones(const Shape& s, DType dtype = DType::f32, Device device = {});
Tensor full(const Shape& s, double value, DType dtype = DType::f32, Device device = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, double value);
// [start, end) by step, made on `device` (the CPU by default, as PyTorch's arange).
Tensor arange(double end, DType dtype = DType::i64, Device device = {});
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::i64,
              Device device = {});
Tensor scalar_tensor(double v, DType dtype = DType::f32);  // 0-d
// Copies host data; data.size() must equal numel(shape).
Tensor from_vector(const std::vector<float>& data, const Shape& shape);
Tensor from_vector(const std::vector<int64_t>& data, const Shape& shape);
Tensor from_vector(const std::vector<int32_t>& data, const Shape& shape);
Tensor from_vector(const std::vector<uint8_t>& data, const Shape& shape, DType dtype);
// Copies numel(shape) * itemsize(dtype) bytes from `data`.
Tensor from_blob(const void* data, const Shape& shape, DType dtype);

// Random numbers from the global counter-based (Philox 4x32-10) generator. Values depend only
// on the seed and the number of draws before, never on the thread count. The generator state
// is a tensor, so a replayed traced step draws fresh numbers. `device`: where the draw is made
// (the same numbers on every device).
void manual_seed(uint64_t seed);
Tensor rand(const Shape& s, DType dtype = DType::f32, Device device = {});   // U[0, 1)
Tensor randn(const Shape& s, DType dtype = DType::f32, Device device = {});  // N(0, 1)
Tensor uniform(const Shape& s, double low, double high, DType dtype = DType::f32,
               Device device = {});
Tensor normal(const Shape& s, double mean, double std, DType dtype = DType::f32,
              Device device = {});
Tensor bernoulli(const Shape& s, double p, DType dtype = DType::f32,
                 Device device = {});  // 1 with probability p
// The generator's state (i64 [2]: seed, offset); save and restore it for exact resume.
Tensor rng_state();
void set_rng_state(const Tensor& state);

// ---------------------------------------------------------------------------------------------
// Elementwise.
Tensor neg(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor sign(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor reciprocal(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a, bool tanh_approximation = false);
Tensor silu(const Tensor& a);
Tensor erf(const Tensor& a);
Tensor sin(const Tensor& a);
Tensor cos(const Tensor& a);
Tensor expm1(const Tensor& a);  // exp(a) - 1, accurate near 0
Tensor floor(const Tensor& a);  // no gradient; integer tensors are returned as they are
Tensor isfinite(const Tensor& a);
Tensor logical_not(const Tensor& a);
Tensor cast(const Tensor& a, DType dtype);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor pow(double base, const Tensor& exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, double b);
Tensor where(const Tensor& cond, double a, const Tensor& b);
Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi);
// a + value * b * c in one pass (torch.addcmul), float dtypes, broadcasting. Optimizers use
// it for their updates: one kernel and one rounding step fewer than mul then add.
Tensor addcmul(const Tensor& a, const Tensor& b, const Tensor& c, double value = 1.0);

// Scalars follow PyTorch: a scalar takes the tensor's dtype (a float scalar with an integer
// tensor gives f32).
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);
Tensor operator==(const Tensor& a, const Tensor& b);
Tensor operator!=(const Tensor& a, const Tensor& b);
Tensor operator<(const Tensor& a, const Tensor& b);
Tensor operator<=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, const Tensor& b);
Tensor operator>=(const Tensor& a, const Tensor& b);
Tensor operator>(const Tensor& a, double s);
Tensor operator<(const Tensor& a, double s);
Tensor operator>=(const Tensor& a, double s);
Tensor operator<=(const Tensor& a, double s);
Tensor operator==(const Tensor& a, double s);

// ---------------------------------------------------------------------------------------------
// Reductions over `dims` (negative allowed; empty = all dims).
Tensor sum(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amax(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor max(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);  // = amax
Tensor min(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);  // = amin
// Index (i64) of the first maximum along one dim; no dim = over the flattened tensor.
Tensor argmax(const Tensor& a, std::optional<int64_t> dim = std::nullopt, bool keepdim = false);
Tensor var(const Tensor& a, std::vector<int64_t> dims = {}, double correction = 1,
           bool keepdim = false);
Tensor logsumexp(const Tensor& a, std::vector<int64_t> dims, bool keepdim = false);
Tensor norm(const Tensor& a, double p = 2, std::vector<int64_t> dims = {}, bool keepdim = false);

// ---------------------------------------------------------------------------------------------
// Linear algebra and nn functions (the functional namespace re-exports these).
Tensor matmul(const Tensor& a, const Tensor& b);  // batched, broadcasting, 1-d rules as torch
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);

enum class Reduction { None, Mean, Sum };
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, int64_t ignore_index = -100,
                Reduction reduction = Reduction::Mean);
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::Mean);
Tensor mse_loss(const Tensor& a, const Tensor& b, Reduction reduction = Reduction::Mean);
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor embedding(const Tensor& indices, const Tensor& weight);
// Zeroes elements with probability p and scales the rest by 1/(1-p) when `training`.
Tensor dropout(const Tensor& a, double p, bool training = true);

// ---------------------------------------------------------------------------------------------
// Shape and indexing.
Tensor reshape(const Tensor& a, const Shape& s);  // one dim may be -1
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, const std::vector<int64_t>& perm);
Tensor expand(const Tensor& a, const Shape& s);  // -1 keeps a dim
Tensor broadcast_to(const Tensor& a, const Shape& s);
Tensor squeeze(const Tensor& a, std::optional<int64_t> dim = std::nullopt);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor flatten(const Tensor& a, int64_t start_dim = 0, int64_t end_dim = -1);
// Python-style a[start:end:step] along dim (negative and out-of-range bounds clamp as Python).
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim = 0);
Tensor cat(const std::vector<Tensor>& ts, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& ts, int64_t dim = 0);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor masked_fill(const Tensor& a, const Tensor& mask, double value);
Tensor triu(const Tensor& a, int64_t diagonal = 0);
Tensor tril(const Tensor& a, int64_t diagonal = 0);
// Sums `a` down to `shape` (the reverse of broadcasting); used by gradient rules.
Tensor sum_to(const Tensor& a, const Shape& shape);

// ---------------------------------------------------------------------------------------------
// Grad mode.
bool is_grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace cstorch
