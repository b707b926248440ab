// The recording context of one cstorch::trace call. While it is active (thread-local), ops
// record nodes instead of running. Tensors from outside the trace are captured as state
// inputs, read afresh at every execution; in-place updates of captured tensors become state
// writes.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/internal.h"

namespace cstorch::runtime {

// A module's training mode as the traced body read it (Module::is_training): `flag` is valid
// while `owner` lives.
struct ModeRead {
  std::weak_ptr<const void> owner;
  const bool* flag = nullptr;
  bool value = false;
  // A setting read another way (an optimizer's fixed hyper-parameter, folded into the graph as
  // a constant): whether it still holds what the body read, instead of flag / value; `id`
  // names it, so that it is noted once.
  std::function<bool()> same;
  std::string id;
  bool unchanged() const { return same ? same() : *flag == value; }
};

struct Capture {
  std::shared_ptr<TensorImpl> impl;
  ir::NodePtr original;    // the impl's node before the trace (holds the state buffer)
  ir::NodePtr input_node;  // the Input(State) node that reads it
};

class TraceContext {
 public:
  TraceContext();
  ~TraceContext();
  uint64_t id() const { return id_; }

  // The node an op should use for `impl` inside this trace (captures external values).
  ir::NodePtr resolve(const std::shared_ptr<TensorImpl>& impl);
  // Registers a node created by an op in this trace.
  void record(const ir::NodePtr& n);
  // A new batch input placeholder on device `d` (the step's device: a batch on another device
  // is moved there before each execution).
  Tensor add_batch_input(const Shape& s, DType t, Device d = {});

  std::vector<ir::NodePtr>& nodes() { return nodes_; }
  std::vector<ir::NodePtr>& batch_inputs() { return batch_inputs_; }
  std::vector<Capture>& captures() { return captures_; }
  // Adds a capture slot for an impl created inside the trace whose value must persist (a new
  // .grad); `original` is the persistent leaf that will hold it.
  size_t add_persistent(const std::shared_ptr<TensorImpl>& impl, ir::NodePtr original);
  // backward() notes each parameter gradient it leaves (the accumulated .grad value), in the
  // order produced; the compiler's gradient all-reduce pass starts from these.
  void note_gradient(const ir::NodePtr& n) { gradients_.push_back(n); }
  std::vector<ir::NodePtr>& gradients() { return gradients_; }
  // Module::is_training notes each mode the body reads (once per module): the step is keyed by
  // them, so a call after train()/eval() changed one traces the step again for the new mode
  // instead of replaying the other mode's graph.
  void note_mode(std::weak_ptr<const void> owner, const bool* flag, bool value);
  // Another setting the body read (see ModeRead::same), noted once per `id`: the step is keyed
  // by it as by a mode, so a call after it changed traces the step again.
  void note_setting(std::weak_ptr<const void> owner, std::string id, std::function<bool()> same);
  const std::vector<ModeRead>& modes() const { return modes_; }

  static TraceContext* current();

 private:
  uint64_t id_;
  TraceContext* prev_;
  std::vector<ir::NodePtr> nodes_;
  std::vector<ir::NodePtr> batch_inputs_;
  std::vector<Capture> captures_;
  std::vector<ir::NodePtr> gradients_;
  std::vector<ModeRead> modes_;
  std::unordered_map<TensorImpl*, size_t> capture_index_;
};

// Runs ops eagerly inside a trace for its lifetime (creating persistent state, such as
// optimizer buffers in preinitialize(), while the step is being traced).
class SuspendTrace {
 public:
  SuspendTrace();
  ~SuspendTrace();
  SuspendTrace(const SuspendTrace&) = delete;
  SuspendTrace& operator=(const SuspendTrace&) = delete;

 private:
  TraceContext* saved_;
};

}  // namespace cstorch::runtime
