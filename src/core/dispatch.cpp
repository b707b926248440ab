// The one dispatch path for every op: build the node, infer its shape and dtype, then run the
// CPU kernel at once (eager) or record the node (inside a trace).
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/internal.h"
#include "ir/device.h"
#include "runtime/sync.h"
#include "runtime/trace_context.h"

namespace cstorch {

namespace {
std::atomic<uint32_t> g_next_node_id{1};
thread_local bool t_grad_enabled = true;
thread_local detail::GradInputRecorder* t_recorder = nullptr;
}  // namespace

bool is_grad_enabled() {
  return t_grad_enabled;
}
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) {
  t_grad_enabled = false;
}
NoGradGuard::~NoGradGuard() {
  t_grad_enabled = prev_;
}
namespace detail {
GradModeGuard::GradModeGuard(bool enabled) : prev_(t_grad_enabled) {
  t_grad_enabled = enabled;
}
GradModeGuard::~GradModeGuard() {
  t_grad_enabled = prev_;
}
RecordGradInputs::RecordGradInputs(GradInputRecorder* r) : prev_(t_recorder) {
  t_recorder = r;
}
RecordGradInputs::~RecordGradInputs() {
  t_recorder = prev_;
}
uint32_t next_node_id() {
  return g_next_node_id.load(std::memory_order_relaxed);
}
}  // namespace detail

namespace ir {

NodePtr Node::make(OpCode op, Attrs attrs, std::vector<NodePtr> inputs) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->attrs = std::move(attrs);
  n->inputs = std::move(inputs);
  n->id = g_next_node_id.fetch_add(1, std::memory_order_relaxed);
  return n;
}

}  // namespace ir

namespace {
// A result shape whose size in bytes does not fit in 2^62 (dims of 2^40 x 2^30 from expand,
// zeros({2^61, 8})) is refused here, where the op is known: its element count would overflow
// int64 and wrap to a small or zero size (an empty result, or kernels writing out of bounds).
void check_size(const char* op, const ir::Node& n) {
  constexpr int64_t kMaxBytes = int64_t{1} << 62;
  const int64_t limit = kMaxBytes / static_cast<int64_t>(std::max<size_t>(1, itemsize(n.dtype)));
  int64_t count = 1;
  for (auto d : n.shape) {
    CS_CHECK(d >= 0, "{}: negative dimension in shape {}", op, shape_str(n.shape));
    if (d == 0) return;
  }
  for (auto d : n.shape) {
    CS_CHECK(count <= limit / d,
             "{}: the result's shape {} has more elements than memory can hold (2^62 bytes "
             "of {} at most)",
             op, shape_str(n.shape), dtype_name(n.dtype));
    count *= d;
  }
}
}  // namespace

Tensor make_tensor(ir::NodePtr node) {
  auto impl = std::make_shared<TensorImpl>();
  impl->node = std::move(node);
  return Tensor(std::move(impl));
}

namespace detail {

bool in_trace() {
  return runtime::TraceContext::current() != nullptr;
}

ir::NodePtr make_constant_node(std::shared_ptr<ir::Buffer> buffer, const Shape& s, DType t) {
  auto n = ir::Node::make(ir::OpCode::Constant, ir::NoAttrs{}, {});
  n->shape = s;
  n->dtype = t;
  n->device = buffer ? buffer->device : Device{};
  n->buffer = std::move(buffer);
  return n;
}

// Waits until the executor has produced (or finished writing) this node's value. Only values
// a compiled step writes need it, so data tensors are read without stalling the pipeline.
static void wait_ready(const ir::Node& n) {
  if (n.buffer && n.buffer->event) runtime::wait(*n.buffer->event);
}

// The node of a tensor whose value may be read now: errors for traced values, waits for
// pending steps.
const ir::Node& value_node(const Tensor& t, const char* what) {
  CS_CHECK(t.defined(), "{}: the tensor is undefined", what);
  const auto& n = t.impl()->node;
  if (n->trace_id != 0) {
    if (in_trace())
      fail(
          "{}: cannot read the value of a tensor inside a traced step (op '{}', node %{}); "
          "pass the tensor to a cstorch::step_closure to read it after the step has run",
          what, n->name(), n->id);
    fail(
        "{}: this tensor (op '{}', node %{}) was computed inside a traced step and is not one of "
        "its outputs; return it from the step function or read it in a step closure",
        what, n->name(), n->id);
  }
  wait_ready(*n);
  CS_CHECK(n->buffer != nullptr, "{}: tensor (op '{}') has no value", what, n->name());
  return *n;
}

const void* host_data(const Tensor& t, const char* what) {
  const ir::Node& n = value_node(t, what);
  CS_CHECK(ir::device_backend(n.buffer->device).host_accessible(),
           "{}: the tensor is on device {}, whose memory the host cannot read; copy it with "
           ".to(cstorch::Device{{}}) first",
           what, device_str(n.buffer->device));
  return n.buffer->data;
}

HostBytes host_bytes(const Tensor& t, const char* what) {
  const ir::Node& n = value_node(t, what);
  HostBytes h;
  h.keep_ = n.buffer;
  const auto& b = ir::device_backend(n.buffer->device);
  if (b.host_accessible()) {
    h.data_ = n.buffer->data;
  } else {
    h.copy_.resize(n.nbytes());
    b.copy_to_host(h.copy_.data(), n.buffer->data, n.nbytes());
    h.data_ = h.copy_.data();
  }
  h.size_ = n.nbytes();
  return h;
}

void write_host_bytes(const Tensor& t, const void* src, size_t nbytes, const char* what) {
  CS_CHECK(!in_trace(), "{}: cannot write a tensor's memory inside a traced step", what);
  const ir::Node& n = value_node(t, what);
  CS_CHECK(nbytes == n.nbytes(), "{}: {} bytes given for a tensor of {} bytes", what, nbytes,
           n.nbytes());
  ir::device_backend(n.buffer->device).copy_from_host(n.buffer->data, src, nbytes);
  n.buffer->mark_written();
}

// Eager collectives: the host-side request of each all_reduce_start (and its host staging
// buffer on a device the host cannot read), found again by its unpacks through their input.
// Entries go when the start node does.
struct EagerRequest {
  std::weak_ptr<const ir::Node> start;
  std::unique_ptr<uint64_t> request = std::make_unique<uint64_t>(0);
  std::shared_ptr<ir::Buffer> staging;
};
static void bind_eager_request(const ir::Node& n, ir::KernelContext& ctx) {
  static std::mutex mu;
  static std::unordered_map<const ir::Node*, EagerRequest> table;
  std::lock_guard<std::mutex> l(mu);
  std::erase_if(table, [](const auto& kv) { return kv.second.start.expired(); });
  const ir::Node* start = n.op == ir::OpCode::AllReduceStart ? &n : n.inputs[0].get();
  auto it = table.find(start);
  if (it == table.end()) {
    CS_CHECK(n.op == ir::OpCode::AllReduceStart, "all_reduce_unpack: its start has not run");
    // `n` is owned by a shared_ptr (Node::make), so the entry can tell when it is gone.
    EagerRequest r;
    r.start = n.weak_from_this();
    if (!ctx.backend->host_accessible()) r.staging = ir::Buffer::alloc(n.nbytes());
    it = table.emplace(start, std::move(r)).first;
  }
  ctx.request = it->second.request.get();
  if (it->second.staging) ctx.host_staging = it->second.staging->data;
}

static void run_eager(ir::Node& n) {
  const auto& info = ir::op_info(n.op);
  if (info.traits & ir::kAlias) {  // zero-copy view of the input's storage
    n.buffer = n.inputs[0]->buffer;
    return;
  }
  const void* ins[64];
  std::vector<const void*> many;
  const void** in = ins;
  if (n.inputs.size() > 64) {
    many.resize(n.inputs.size());
    in = many.data();
  }
  for (size_t i = 0; i < n.inputs.size(); ++i) in[i] = n.inputs[i]->buffer->data;
  const ir::Kernel kernel = ir::kernel_for(n);
  const auto& backend = ir::device_backend(n.device);
  ir::KernelContext ctx;
  ctx.backend = &backend;
  ctx.stream = backend.stream();
  std::shared_ptr<ir::Buffer> workspace;
  if (n.op == ir::OpCode::AllReduceStart || n.op == ir::OpCode::AllReduceUnpack)
    bind_eager_request(n, ctx);
  if (n.op != ir::OpCode::ToDevice) {
    if (size_t ws = backend.workspace_bytes(n)) {
      workspace = ir::Buffer::alloc(ws, n.device);  // eager ops may allocate; programs plan it
      ctx.workspace = workspace->data;
      ctx.workspace_bytes = ws;
    }
  }
  n.buffer = ir::Buffer::alloc(n.nbytes(), n.device);
  kernel(ctx, n, in, n.buffer->data);
}

// The device an op runs on: the one its output is asked for (creation ops, draws, transfers),
// else the inputs' device. Inputs elsewhere are moved there when they are CPU scalars (0-d, as
// PyTorch allows: hyper-parameters and step counts live on the CPU); otherwise it is an error
// naming the op and both devices.
static Device place_inputs(ir::OpCode op, std::vector<ir::NodePtr>& in,
                           const std::optional<OutSpec>& out) {
  const char* name = ir::op_info(op).name;
  Device dev{};
  if (out) {
    dev = out->device;
  } else {
    for (auto& n : in)
      if (n->device.type != DeviceType::CPU) {
        dev = n->device;
        break;
      }
  }
  if (op == ir::OpCode::ToDevice) return dev;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i]->device == dev) continue;
    if (in[i]->device == Device{} && in[i]->shape.empty()) {
      in[i] = dispatch(ir::OpCode::ToDevice, ir::DeviceAttrs{dev}, {make_tensor(in[i])},
                       OutSpec{in[i]->shape, in[i]->dtype, dev})
                  .node();
      continue;
    }
    size_t other = 0;
    while (other < in.size() && in[other]->device != dev) ++other;
    if (other < in.size())
      fail(
          "{}: input {} is on device {} but input {} is on device {}; move the tensors to one "
          "device with .to(device)",
          name, i, device_str(in[i]->device), other, device_str(dev));
    fail("{}: input {} is on device {} but the op runs on {}; move it with .to(device)", name, i,
         device_str(in[i]->device), device_str(dev));
  }
  return dev;
}

Tensor dispatch(ir::OpCode op, ir::Attrs attrs, const std::vector<Tensor>& inputs,
                const std::optional<OutSpec>& out) {
  auto* ctx = runtime::TraceContext::current();
  const auto& info = ir::op_info(op);
  std::vector<ir::NodePtr> in_nodes;
  in_nodes.reserve(inputs.size());
  bool any_grad = false;
  for (const auto& t : inputs) {
    CS_CHECK(t.defined(), "{}: an input tensor is undefined", info.name);
    auto* impl = t.impl();
    if (impl->requires_grad && !impl->node->requires_grad && impl->node->leaf.expired() &&
        impl->node->inputs.empty()) {
      // a leaf parameter whose node was replaced by an update under no_grad: still a leaf
      impl->node->leaf = t.impl_ptr();
      impl->node->requires_grad = true;
    }
    ir::NodePtr n = ctx ? ctx->resolve(t.impl_ptr()) : impl->node;
    if (!ctx) {
      if (n->trace_id != 0) host_data(t, info.name);  // raises the "computed in a trace" error
      wait_ready(*n);
    }
    any_grad = any_grad || n->requires_grad;
    if (t_recorder && n->requires_grad && t_recorder->seen.insert(n.get()).second)
      t_recorder->nodes.push_back(n);
    in_nodes.push_back(std::move(n));
  }
  const Device dev = place_inputs(op, in_nodes, out);
  auto node = ir::Node::make(op, std::move(attrs), std::move(in_nodes));
  node->device = dev;
  CS_CHECK(info.infer != nullptr, "op '{}' has no shape rule in this build", info.name);
  if (out) {
    for (auto d : out->shape)
      CS_CHECK(d >= 0, "{}: negative dimension in shape {}", info.name, shape_str(out->shape));
    node->shape = out->shape;
    node->dtype = out->dtype;
  }
  info.infer(*node);
  check_size(info.name, *node);
  node->requires_grad = any_grad && is_grad_enabled() && !(info.traits & ir::kNoGrad);
  if (ctx) {
    ctx->record(node);
  } else {
    run_eager(*node);
    if (!node->requires_grad) node->inputs.clear();  // eager values need no history
  }
  return make_tensor(std::move(node));
}

void assign_inplace(const Tensor& self, const Tensor& value_in, const char* op) {
  CS_CHECK(self.defined() && value_in.defined(), "{}: undefined tensor", op);
  // A step closure queued before this eager write reads the tensor as it was when it was
  // called (runtime/sync.h).
  if (!in_trace()) runtime::await_queued_closures();
  CS_CHECK(self.shape() == value_in.shape(),
           "{}: in-place result has shape {} but the tensor has shape {} (in-place ops cannot "
           "broadcast the destination)",
           op, shape_str(value_in.shape()), shape_str(self.shape()));
  Tensor value = value_in.dtype() == self.dtype() ? value_in : cast(value_in, self.dtype());
  if (value.device() != self.device()) value = value.to(self.device());
  auto* impl = self.impl();
  if (impl->requires_grad && impl->node->inputs.empty() && is_grad_enabled())
    fail(
        "{}: a leaf tensor that requires grad is used in an in-place operation; wrap the update "
        "in cstorch::NoGradGuard (optimizers do)",
        op);
  const auto& vn = value.node();
  if (!in_trace() && !is_grad_enabled() && impl->requires_grad && vn->buffer) {
    // A tensor that requires grad (a parameter) given a value under NoGradGuard takes a node of
    // its own on that value's storage, as detach() makes, and stays its own leaf. Sharing the
    // value's node made its gradient flow into whatever else holds that node: another
    // parameter (even one whose node an optimizer step had just replaced, so that the node did
    // not yet look like a leaf's), or a result's history.
    impl->node = make_constant_node(vn->buffer, vn->shape, vn->dtype);
    return;
  }
  if (in_trace() || vn->requires_grad || impl->node->requires_grad ||
      impl->node->buffer == nullptr || impl->node->buffer.get() == vn->buffer.get()) {
    impl->node = vn;  // rebinding: a state write inside a trace, history when eager
    return;
  }
  // Eager: write into the existing buffer so every holder of this storage sees the update.
  wait_ready(*impl->node);  // a queued step may still read or write it
  const ir::Node& src = value_node(value, op);
  ir::copy_between(impl->node->buffer->device, impl->node->buffer->data, src.buffer->device,
                   src.buffer->data, impl->node->nbytes());
  impl->node->buffer->mark_written();
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      fail("{}: shapes {} and {} are not broadcastable (dim {}: {} vs {})", op, shape_str(a),
           shape_str(b), i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

ir::Dims normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op) {
  ir::Dims out;
  if (dims.empty()) {
    for (int64_t i = 0; i < ndim; ++i) out.push_back(i);
    return out;
  }
  for (auto d : dims) out.push_back(normalize_dim(d, std::max<int64_t>(ndim, 1), op));
  std::sort(out.begin(), out.end());
  for (size_t i = 1; i < out.size(); ++i)
    CS_CHECK(out[i] != out[i - 1], "{}: dim {} appears more than once", op, out[i]);
  if (ndim == 0) out.clear();
  return out;
}

Shape reduced_shape(const Shape& s, const ir::Dims& dims, bool keepdim) {
  Shape out;
  size_t j = 0;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    bool red = j < dims.size() && dims[j] == i;
    if (red) {
      ++j;
      if (keepdim) out.push_back(1);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

Tensor scalar_like(double v, const Tensor& like) {
  DType t = like.dtype();
  bool whole = v == static_cast<double>(static_cast<int64_t>(v));
  if (!is_floating(t)) {
    if (!whole)
      t = DType::f32;  // int tensor with a float scalar -> f32
    else if (t == DType::boolean)
      t = DType::i64;  // bool tensor with an int scalar -> i64
  }
  return scalar_tensor(v, t);
}

}  // namespace detail

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

int64_t numel(const Shape& s, int64_t from, int64_t to) {
  int64_t p = 1;
  for (int64_t i = std::max<int64_t>(from, 0); i < to && i < static_cast<int64_t>(s.size()); ++i)
    p *= s[static_cast<size_t>(i)];
  return p;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t normalize_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t d = dim < 0 ? dim + ndim : dim;
  if (d < 0 || d >= ndim)
    fail("{}: dim {} is out of range for a tensor of rank {} (expected {} to {})", op, dim, ndim,
         -ndim, ndim - 1);
  return d;
}

}  // namespace cstorch
