// Tensor handle methods: metadata, host reads, in-place updates and shape conveniences.
#include <cstring>
#include <mutex>
#include <sstream>

#include "core/internal.h"
#include "ir/device.h"
#include "runtime/trace_context.h"

namespace cstorch {

using detail::host_data;

namespace detail {
namespace {
std::mutex g_leaves_mu;
std::vector<std::weak_ptr<TensorImpl>> g_leaves;
size_t g_prune_at = 64;
}  // namespace
void register_grad_leaf(const std::shared_ptr<TensorImpl>& impl) {
  std::lock_guard<std::mutex> l(g_leaves_mu);
  if (g_leaves.size() >= g_prune_at) {  // drop dead entries; amortised O(1)
    std::erase_if(g_leaves, [](const auto& w) { return w.expired(); });
    g_prune_at = std::max<size_t>(64, 2 * g_leaves.size());
  }
  g_leaves.push_back(impl);
}
std::vector<std::shared_ptr<TensorImpl>> live_grad_leaves() {
  std::lock_guard<std::mutex> l(g_leaves_mu);
  std::vector<std::shared_ptr<TensorImpl>> r;
  for (auto& w : g_leaves)
    if (auto p = w.lock()) r.push_back(std::move(p));
  return r;
}
}  // namespace detail

std::shared_ptr<ir::Node> Tensor::node() const {
  CS_CHECK(defined(), "tensor is undefined");
  return impl_->node;
}
const Shape& Tensor::shape() const {
  CS_CHECK(defined(), "shape(): tensor is undefined");
  return impl_->node->shape;
}
int64_t Tensor::size(int64_t d) const {
  return shape()[normalize_dim(d, dim(), "size")];
}
int64_t Tensor::numel() const {
  return cstorch::numel(shape());
}
DType Tensor::dtype() const {
  CS_CHECK(defined(), "dtype(): tensor is undefined");
  return impl_->node->dtype;
}
Device Tensor::device() const {
  CS_CHECK(defined(), "device(): tensor is undefined");
  return impl_->node->device;
}

bool Tensor::requires_grad() const {
  return defined() && (impl_->requires_grad || impl_->node->requires_grad);
}
Tensor& Tensor::set_requires_grad(bool r) {
  CS_CHECK(defined(), "set_requires_grad: tensor is undefined");
  if (r) {
    CS_CHECK(impl_->node->inputs.empty() || !impl_->node->requires_grad,
             "set_requires_grad: only leaf tensors can be made to require grad; this one is "
             "computed by '{}' (use detach() first)",
             impl_->node->name());
    CS_CHECK(is_floating(dtype()),
             "set_requires_grad: only floating-point tensors can require "
             "grad, got {}",
             dtype_name(dtype()));
  }
  impl_->requires_grad = r;
  if (r) detail::register_grad_leaf(impl_);
  if (impl_->node->inputs.empty()) {
    impl_->node->requires_grad = r;
    if (r)
      impl_->node->leaf = impl_;
    else
      impl_->node->leaf.reset();
  }
  return *this;
}
bool Tensor::is_leaf() const {
  return defined() && (impl_->requires_grad || !impl_->node->requires_grad);
}
Tensor Tensor::grad() const {
  CS_CHECK(defined(), "grad(): tensor is undefined");
  return impl_->grad ? Tensor(impl_->grad) : Tensor();
}
void Tensor::set_grad(const Tensor& g) {
  CS_CHECK(defined(), "set_grad(): tensor is undefined");
  if (!g.defined()) {
    impl_->grad.reset();
    return;
  }
  CS_CHECK(g.shape() == shape(), "set_grad: gradient shape {} does not match tensor shape {}",
           shape_str(g.shape()), shape_str(shape()));
  impl_->grad = g.impl_ptr();
}
Tensor Tensor::detach() const {
  CS_CHECK(defined(), "detach(): tensor is undefined");
  auto n = impl_->node;
  if (!n->requires_grad) return make_tensor(n);
  // A new node sharing the value (eager) or forwarding it (traced) with no history.
  NoGradGuard ng;
  if (detail::in_trace()) return detail::dispatch(ir::OpCode::Copy, ir::NoAttrs{}, {*this});
  return make_tensor(detail::make_constant_node(n->buffer, n->shape, n->dtype));
}

namespace detail {
void move_to_device(const Tensor& t, Device d) {
  if (d.type == DeviceType::CSX) d = Device{};
  auto* impl = t.impl();
  auto move_one = [&](const std::shared_ptr<TensorImpl>& x) {
    if (!x || x->node->device == d) return;
    const ir::Node& src = value_node(Tensor(x), "to(device)");
    auto buf = ir::Buffer::alloc(src.nbytes(), d);
    ir::copy_between(d, buf->data, src.buffer->device, src.buffer->data, src.nbytes());
    auto n = make_constant_node(std::move(buf), src.shape, src.dtype);
    if (x->requires_grad) {
      n->requires_grad = true;
      n->leaf = x;
    }
    x->node = std::move(n);
  };
  move_one(t.impl_ptr());
  move_one(impl->grad);
}
}  // namespace detail

const void* Tensor::data_ptr() const {
  return host_data(*this, "data_ptr()");
}

template <class T>
static T read_as(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<T>(static_cast<const float*>(p)[i]);
    case DType::bf16:
      return static_cast<T>(static_cast<float>(static_cast<const bf16_t*>(p)[i]));
    case DType::f16:
      return static_cast<T>(static_cast<float>(static_cast<const f16_t*>(p)[i]));
    case DType::i32:
      return static_cast<T>(static_cast<const int32_t*>(p)[i]);
    case DType::i64:
      return static_cast<T>(static_cast<const int64_t*>(p)[i]);
    case DType::boolean:
      return static_cast<T>(static_cast<const uint8_t*>(p)[i] != 0);
  }
  return T{};
}

template <class T>
T Tensor::item() const {
  CS_CHECK(defined() && numel() == 1,
           "item(): tensor has {} elements (shape {}); item() needs exactly one",
           defined() ? numel() : 0, defined() ? shape_str(shape()) : "undefined");
  auto bytes = detail::host_bytes(*this, "item()");
  return read_as<T>(bytes.data(), dtype(), 0);
}
template <class T>
std::vector<T> Tensor::to_vector() const {
  auto bytes = detail::host_bytes(*this, "to_vector()");
  const void* p = bytes.data();
  std::vector<T> out(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) out[i] = read_as<T>(p, dtype(), i);
  return out;
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template int32_t Tensor::item<int32_t>() const;
template bool Tensor::item<bool>() const;
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

Tensor& Tensor::copy_(const Tensor& src) {
  // A source someone else holds (another model's parameter, a loaded state dict's tensor) is
  // copied first: eagerly, the assignment below may take the value's storage rather than copy
  // it (which is what it does with a temporary, an optimizer's update), and a shared storage
  // tied the two tensors once a traced step updated either in place (a model loaded from
  // another's state_dict trained with it). Inside a trace the value is a graph value: no copy.
  const bool held_elsewhere = src.defined() && src.impl_.use_count() > 1;
  Tensor v = held_elsewhere && !detail::in_trace() && src.impl_.get() != impl_.get()
                 ? detail::dispatch(ir::OpCode::Copy, ir::NoAttrs{}, {src})
                 : src;
  if (src.shape() != shape()) v = cstorch::expand(v, shape());
  detail::assign_inplace(*this, v, "copy_");
  return *this;
}
Tensor& Tensor::add_(const Tensor& o, double alpha) {
  detail::assign_inplace(
      *this, alpha == 1.0 ? add(*this, o) : add(*this, mul(o, detail::scalar_like(alpha, o))),
      "add_");
  return *this;
}
Tensor& Tensor::sub_(const Tensor& o, double alpha) {
  detail::assign_inplace(
      *this, alpha == 1.0 ? sub(*this, o) : sub(*this, mul(o, detail::scalar_like(alpha, o))),
      "sub_");
  return *this;
}
Tensor& Tensor::mul_(const Tensor& o) {
  detail::assign_inplace(*this, mul(*this, o), "mul_");
  return *this;
}
Tensor& Tensor::mul_(double s) {
  detail::assign_inplace(*this, mul(*this, detail::scalar_like(s, *this)), "mul_");
  return *this;
}
Tensor& Tensor::div_(const Tensor& o) {
  detail::assign_inplace(*this, div(*this, o), "div_");
  return *this;
}
Tensor& Tensor::fill_(double v) {
  NoGradGuard ng;
  detail::assign_inplace(*this, full(shape(), v, dtype(), device()), "fill_");
  return *this;
}

Tensor Tensor::reshape(const Shape& s) const {
  return cstorch::reshape(*this, s);
}
Tensor Tensor::flatten(int64_t a, int64_t b) const {
  return cstorch::flatten(*this, a, b);
}
Tensor Tensor::transpose(int64_t a, int64_t b) const {
  return cstorch::transpose(*this, a, b);
}
Tensor Tensor::t() const {
  CS_CHECK(dim() <= 2, "t(): expects a tensor with at most 2 dims, got shape {}",
           shape_str(shape()));
  return dim() < 2 ? *this : transpose(0, 1);
}
Tensor Tensor::permute(const std::vector<int64_t>& p) const {
  return cstorch::permute(*this, p);
}
Tensor Tensor::unsqueeze(int64_t d) const {
  return cstorch::unsqueeze(*this, d);
}
Tensor Tensor::squeeze(std::optional<int64_t> d) const {
  return cstorch::squeeze(*this, d);
}
Tensor Tensor::expand(const Shape& s) const {
  return cstorch::expand(*this, s);
}
Tensor Tensor::to(DType t) const {
  return t == dtype() ? *this : cast(*this, t);
}
Tensor Tensor::to(Device d) const {
  CS_CHECK(defined(), "to(): tensor is undefined");
  if (d.type == DeviceType::CSX) d = Device{};  // CSX tensors live on the CPU
  if (d == device()) return *this;
  ir::device_backend(d);  // a clear error for a device this build or process lacks
  return detail::dispatch(ir::OpCode::ToDevice, ir::DeviceAttrs{d}, {*this},
                          detail::OutSpec{shape(), dtype(), d});
}
Tensor Tensor::sum(std::vector<int64_t> d, bool k) const {
  return cstorch::sum(*this, d, k);
}
Tensor Tensor::mean(std::vector<int64_t> d, bool k) const {
  return cstorch::mean(*this, d, k);
}

const std::string& Tensor::name() const {
  CS_CHECK(defined(), "name(): tensor is undefined");
  return impl_->name;
}
Tensor& Tensor::set_name(std::string n) {
  CS_CHECK(defined(), "set_name(): tensor is undefined");
  impl_->name = std::move(n);
  return *this;
}

std::string Tensor::to_string() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream os;
  os << "Tensor(shape=" << shape_str(shape()) << ", dtype=" << dtype_name(dtype());
  if (impl_->node->trace_id != 0) {
    os << ", traced op '" << impl_->node->name() << "')";
    return os.str();
  }
  // Integers exactly (token ids, indices: %g showed 123456789 as 1.23457e+08); floats with
  // six significant digits.
  const bool integer = dtype() == DType::i32 || dtype() == DType::i64;
  const int64_t n = std::min<int64_t>(numel(), 16);
  std::string vals;
  if (integer) {
    auto v = to_vector<int64_t>();
    for (int64_t i = 0; i < n; ++i)
      vals += (i ? ", " : "") + std::to_string(v[static_cast<size_t>(i)]);
  } else {
    auto v = to_vector<double>();
    for (int64_t i = 0; i < n; ++i)
      vals += fmt::format("{}{:g}", i ? ", " : "", v[static_cast<size_t>(i)]);
  }
  os << ", values=[" << vals;
  if (numel() > 16) os << ", ...";
  os << "])";
  return os.str();
}

}  // namespace cstorch
