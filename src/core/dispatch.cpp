// The one dispatch path for every op: build the node, infer its shape and dtype, then run the
// CPU kernel at once (eager) or record the node (inside a trace).
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/internal.h"
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

namespace {
// A cache of freed host blocks by rounded size. Eager training loops allocate the same sizes
// every step; reusing blocks avoids malloc and, for large tensors, the fresh pages (faults and
// zeroing) of an mmap per allocation. Bounded: beyond kCacheLimit freed blocks go back to libc.
constexpr size_t kCacheLimit = size_t{256} << 20;
struct BlockCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free;
  size_t bytes = 0;
};
BlockCache& block_cache() {
  static BlockCache* c = new BlockCache();  // never destroyed: buffers may outlive statics
  return *c;
}
size_t block_size(size_t nbytes) {
  size_t n = nbytes < 4096 ? (nbytes + 63) / 64 * 64 : (nbytes + 4095) / 4096 * 4096;
  return n == 0 ? 64 : n;
}
}  // namespace

std::shared_ptr<Buffer> Buffer::alloc(size_t nbytes) {
  auto b = std::make_shared<Buffer>();
  size_t n = block_size(nbytes);
  {
    auto& c = block_cache();
    std::lock_guard<std::mutex> l(c.mu);
    auto it = c.free.find(n);
    if (it != c.free.end() && !it->second.empty()) {
      b->data = it->second.back();
      it->second.pop_back();
      c.bytes -= n;
    }
  }
  if (!b->data) b->data = std::aligned_alloc(64, n);
  if (!b->data) fail("out of host memory allocating {} bytes", nbytes);
  b->nbytes = nbytes;
  b->owned = true;
  return b;
}
std::shared_ptr<Buffer> Buffer::wrap(void* data, size_t nbytes) {
  auto b = std::make_shared<Buffer>();
  b->data = data;
  b->nbytes = nbytes;
  b->owned = false;
  return b;
}
Buffer::~Buffer() {
  if (!owned || !data) return;
  size_t n = block_size(nbytes);
  auto& c = block_cache();
  {
    std::lock_guard<std::mutex> l(c.mu);
    if (c.bytes + n <= kCacheLimit) {
      c.free[n].push_back(data);
      c.bytes += n;
      return;
    }
  }
  std::free(data);
}

NodePtr Node::make(OpCode op, Attrs attrs, std::vector<NodePtr> inputs) {
  auto n = std::make_shared<Node>();
  n->op = op;
  n->attrs = std::move(attrs);
  n->inputs = std::move(inputs);
  n->id = g_next_node_id.fetch_add(1, std::memory_order_relaxed);
  return n;
}

}  // namespace ir

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
  n->buffer = std::move(buffer);
  return n;
}

// Waits until the executor has produced (or finished writing) this node's value. Only values
// a compiled step writes need it, so data tensors are read without stalling the pipeline.
static void wait_ready(const ir::Node& n) {
  if (runtime::on_executor_thread()) return;
  if (n.async_written)
    runtime::synchronize();
  else if (n.pending_job >= 0)
    runtime::wait_for_job(n.pending_job);
}

const void* host_data(const Tensor& t, const char* what) {
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
  return n->buffer->data;
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
  auto kernel = ir::kernels_for(DeviceType::CPU).kernels[static_cast<int>(n.op)];
  CS_CHECK(kernel != nullptr, "op '{}' has no CPU kernel in this build", info.name);
  n.buffer = ir::Buffer::alloc(n.nbytes());
  kernel(n, in, n.buffer->data);
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
  auto node = ir::Node::make(op, std::move(attrs), std::move(in_nodes));
  CS_CHECK(info.infer != nullptr, "op '{}' has no shape rule in this build", info.name);
  if (out) {
    for (auto d : out->shape)
      CS_CHECK(d >= 0, "{}: negative dimension in shape {}", info.name, shape_str(out->shape));
    node->shape = out->shape;
    node->dtype = out->dtype;
  }
  info.infer(*node);
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
  CS_CHECK(self.shape() == value_in.shape(),
           "{}: in-place result has shape {} but the tensor has shape {} (in-place ops cannot "
           "broadcast the destination)",
           op, shape_str(value_in.shape()), shape_str(self.shape()));
  Tensor value = value_in.dtype() == self.dtype() ? value_in : cast(value_in, self.dtype());
  auto* impl = self.impl();
  if (impl->requires_grad && impl->node->inputs.empty() && is_grad_enabled())
    fail(
        "{}: a leaf tensor that requires grad is used in an in-place operation; wrap the update "
        "in cstorch::NoGradGuard (optimizers do)",
        op);
  if (in_trace() || value.node()->requires_grad || impl->node->requires_grad ||
      impl->node->buffer == nullptr || impl->node->buffer.get() == value.node()->buffer.get()) {
    impl->node = value.node();  // rebinding: a state write inside a trace, history when eager
    return;
  }
  // Eager: write into the existing buffer so every holder of this storage sees the update.
  wait_ready(*impl->node);  // a queued step may still read or write it
  const void* src = host_data(value, op);
  std::memcpy(impl->node->buffer->data, src, impl->node->nbytes());
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

const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::CPU:
      return "CPU";
    case DeviceType::GPU:
      return "GPU";
    case DeviceType::CSX:
      return "CSX";
  }
  return "?";
}

}  // namespace cstorch
