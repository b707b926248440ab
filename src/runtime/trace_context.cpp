// Recording context for cstorch::trace (see trace_context.h).
#include "runtime/trace_context.h"

#include <atomic>

namespace cstorch::runtime {

namespace {
thread_local TraceContext* t_current = nullptr;
std::atomic<uint64_t> g_next_trace{1};
}  // namespace

TraceContext::TraceContext() : id_(g_next_trace.fetch_add(1)), prev_(t_current) {
  CS_CHECK(prev_ == nullptr,
           "cstorch::trace: a traced step cannot be called inside another traced step");
  t_current = this;
}
TraceContext::~TraceContext() {
  t_current = prev_;
}
TraceContext* TraceContext::current() {
  return t_current;
}

ir::NodePtr TraceContext::resolve(const std::shared_ptr<TensorImpl>& impl) {
  const auto& n = impl->node;
  if (n->trace_id == id_) return n;
  if (n->trace_id != 0)
    fail(
        "tensor from another traced step (op '{}', node %{}) used in this step; return it "
        "from that step to use its value",
        n->name(), n->id);
  auto it = capture_index_.find(impl.get());
  if (it != capture_index_.end()) return captures_[it->second].input_node;
  // Capture: an Input(State) node that reads the tensor's current value at every execution.
  auto in =
      ir::Node::make(ir::OpCode::Input,
                     ir::InputAttrs{ir::InputKind::State, static_cast<int>(captures_.size())}, {});
  in->shape = n->shape;
  in->dtype = n->dtype;
  in->device = n->device;
  in->trace_id = id_;
  if (impl->requires_grad || n->requires_grad) {
    in->requires_grad = impl->requires_grad;
    if (impl->requires_grad) in->leaf = impl;
  }
  capture_index_[impl.get()] = captures_.size();
  captures_.push_back(Capture{impl, n, in});
  nodes_.push_back(in);
  return in;
}

void TraceContext::record(const ir::NodePtr& n) {
  n->trace_id = id_;
  nodes_.push_back(n);
}

Tensor TraceContext::add_batch_input(const Shape& s, DType t, Device d) {
  auto in = ir::Node::make(
      ir::OpCode::Input,
      ir::InputAttrs{ir::InputKind::Batch, static_cast<int>(batch_inputs_.size())}, {});
  in->shape = s;
  in->dtype = t;
  in->device = d;
  in->trace_id = id_;
  batch_inputs_.push_back(in);
  nodes_.push_back(in);
  return make_tensor(in);
}

size_t TraceContext::add_persistent(const std::shared_ptr<TensorImpl>& impl, ir::NodePtr original) {
  // No Input node: the slot is written, never read.
  capture_index_[impl.get()] = captures_.size();
  captures_.push_back(Capture{impl, std::move(original), nullptr});
  return captures_.size() - 1;
}

SuspendTrace::SuspendTrace() : saved_(t_current) {
  t_current = nullptr;
}
SuspendTrace::~SuspendTrace() {
  t_current = saved_;
}

void TraceContext::note_mode(std::weak_ptr<const void> owner, const bool* flag, bool value) {
  for (const auto& m : modes_)
    if (m.flag == flag) return;
  modes_.push_back({std::move(owner), flag, value, {}, {}});
}

void TraceContext::note_setting(std::weak_ptr<const void> owner, std::string id,
                                std::function<bool()> same) {
  for (const auto& m : modes_)
    if (m.same && m.id == id) return;
  modes_.push_back({std::move(owner), nullptr, false, std::move(same), std::move(id)});
}

}  // namespace cstorch::runtime
