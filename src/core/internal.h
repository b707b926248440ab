// Internals shared by the op families, autograd, tracing and the runtime: the TensorImpl, the
// one dispatch entry point that either runs an op (eager) or records it (traced), and helpers.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cstorch/tensor.h"
#include "ir/node.h"

namespace cstorch {

struct TensorImpl {
  ir::NodePtr node;
  bool requires_grad = false;  // set by the user on leaves (parameters)
  std::shared_ptr<TensorImpl> grad;
  std::string name;
};

Tensor make_tensor(ir::NodePtr node);

namespace detail {

// Runs (eager) or records (traced) `op` on `inputs`. The single entry point for every op.
// Ops whose output shape is not a function of their inputs (creation ops, random draws) pass
// it as `out`; their shape rule then only validates.
struct OutSpec {
  Shape shape;
  DType dtype;
  Device device{};
};
Tensor dispatch(ir::OpCode op, ir::Attrs attrs, const std::vector<Tensor>& inputs,
                const std::optional<OutSpec>& out = std::nullopt);

// Replaces the value of `self` with `value` (same shape; value is cast to self's dtype).
// Eager: writes into self's buffer. Traced: rebinds self to the new node (a state write).
void assign_inplace(const Tensor& self, const Tensor& value, const char* op);

// A leaf node holding `buffer` (no inputs). Inside a trace it is a constant of the program.
ir::NodePtr make_constant_node(std::shared_ptr<ir::Buffer> buffer, const Shape& s, DType t);

// Host pointer of a tensor's value: waits for pending executor work; an error in a trace, and
// for a tensor on a device whose memory the host cannot read (use host_bytes there).
const void* host_data(const Tensor& t, const char* what);

// The node holding a tensor's value, once it may be read: an error inside a trace (or for a
// value computed in one and not returned), waits for pending steps.
const ir::Node& value_node(const Tensor& t, const char* what);

// Every host access to a tensor's memory goes through these. host_bytes: the value's bytes as
// host memory (the buffer itself where the device's memory is host memory, else a copy through
// the device's transfer function); waits for pending steps, errors inside a trace.
class HostBytes {
 public:
  const void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  friend HostBytes host_bytes(const Tensor& t, const char* what);
  std::shared_ptr<ir::Buffer> keep_;
  std::vector<unsigned char> copy_;
  const void* data_ = nullptr;
  size_t size_ = 0;
};
HostBytes host_bytes(const Tensor& t, const char* what);
// Copies `nbytes` (the tensor's size) of host memory into the tensor's storage, where it lives.
// Eager only; waits for pending steps.
void write_host_bytes(const Tensor& t, const void* src, size_t nbytes, const char* what);

// Moves a tensor's value (and its .grad) to device `d` under the same handle, keeping it a
// leaf that requires grad where it was one (Module::to). Eager only.
void move_to_device(const Tensor& t, Device d);

// Broadcast result shape; error names `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

// Normalises reduction dims for rank `ndim` (negative allowed; empty = all), sorted unique.
ir::Dims normalize_dims(const std::vector<int64_t>& dims, int64_t ndim, const char* op);

// Shape after reducing `dims` of `s`.
Shape reduced_shape(const Shape& s, const ir::Dims& dims, bool keepdim);

// A 0-d tensor holding `v`, of `like`'s dtype (f32 if `like` is integral and v is not whole).
Tensor scalar_like(double v, const Tensor& like);

bool in_trace();

// A copy of the global generator state (i64 [2]) for a kernel that draws by itself; the
// generator then advances as after any draw (src/ops/random.cpp).
Tensor take_rng_state();

// Leaves that require grad (weakly held), so a trace can note which of them had a .grad when
// the step was called: that decides whether the body assigns or accumulates gradients.
void register_grad_leaf(const std::shared_ptr<TensorImpl>& impl);
std::vector<std::shared_ptr<TensorImpl>> live_grad_leaves();

// Sets grad mode for its lifetime (the recomputed forward of a checkpoint runs with grad on
// inside the backward pass, which runs under no-grad).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

// While one is installed (thread-local), dispatch notes every distinct input node that requires
// grad: what a checkpointed function reads from outside itself (it runs under no-grad, so
// nothing it computes requires grad).
struct GradInputRecorder {
  std::vector<ir::NodePtr> nodes;
  std::unordered_set<ir::Node*> seen;
};
class RecordGradInputs {
 public:
  explicit RecordGradInputs(GradInputRecorder* r);
  ~RecordGradInputs();
  RecordGradInputs(const RecordGradInputs&) = delete;
  RecordGradInputs& operator=(const RecordGradInputs&) = delete;

 private:
  GradInputRecorder* prev_;
};

// The id the next node will get (ids only grow): nodes with a smaller id existed before.
uint32_t next_node_id();

// Reverse-mode pass from `roots` with gradients `root_grads` (Tensor::backward is this with
// one root and no capture). Nodes in `capture` (node -> slot) are end points: their summed
// gradient is put in captured[slot] instead of flowing on or into a leaf's .grad. With
// `fence` > 0, reaching a node older than the fence that is not captured is an error naming
// it (a recomputed function read a tensor that requires grad which its first run did not).
void backward_from(const std::vector<ir::NodePtr>& roots, const std::vector<Tensor>& root_grads,
                   const std::unordered_map<ir::Node*, size_t>* capture = nullptr,
                   std::vector<Tensor>* captured = nullptr, uint32_t fence = 0);

// The gradient rule of the outputs `outs` (Recompute nodes of one checkpoint call, with
// gradients `grads`) taken together: re-runs the function once and back-propagates through
// the re-run (src/ops/recompute.cpp). Returns the gradients of the shared inputs.
std::vector<Tensor> recompute_vjp(const std::vector<ir::NodePtr>& outs,
                                  const std::vector<Tensor>& grads);

}  // namespace detail
}  // namespace cstorch
