// Cached state casts: a step that casts a state it also writes (autocast's bf16 copy of an f32
// master weight, which the optimizer updates at the end of the step) casts the new value once,
// right after writing it, into a state slot of its own, and its next execution reads that slot
// instead of casting again. The cast then runs while the update's values are still in cache
// (in the optimizer's one-pass group, where the backend stores bf16 from a Fused program), so
// the copy costs one 2-byte write per element instead of a 4-byte read and a 2-byte write.
//
// The copy is only as good as the state it was made from: Program::run recomputes it (the
// slot's `refresh` node, the original cast) before any execution where the state's buffer was
// written by something other than this program's last execution (ir::Buffer::version: eager
// in-place ops, loading a checkpoint, another program). The values are the same casts of the
// same f32 values either way, so results are bitwise those without the pass.
#include <unordered_map>
#include <unordered_set>

#include "compiler/graph.h"
#include "ir/device.h"

namespace cstorch::compiler {
namespace {

class CacheStateCasts : public Pass {
 public:
  const char* name() const override { return "cache_state_casts"; }
  bool run(Graph& g) override {
    std::unordered_map<const ir::Node*, size_t> slot_of_input;
    for (size_t s = 0; s < g.state.size(); ++s) {
      const auto& slot = g.state[s];
      if (slot.input && slot.write && slot.cast_of < 0 && slot.dtype == DType::f32)
        slot_of_input[slot.input.get()] = s;
    }
    // A cast that is itself a step output or state write stays: those must be computed nodes.
    std::unordered_set<const ir::Node*> roots;
    for (auto& o : g.outputs) roots.insert(o.get());
    for (auto& s : g.state) roots.insert(s.write.get());
    for (auto& k : g.keep) roots.insert(k.get());
    std::unordered_map<ir::Node*, ir::NodePtr> repl;
    std::unordered_map<const ir::Node*, ir::NodePtr> write_after;  // W -> the cast of W
    std::vector<ir::NodePtr> inputs;
    for (const auto& c : g.nodes) {
      if (c->op != ir::OpCode::Cast || (c->dtype != DType::bf16 && c->dtype != DType::f16))
        continue;
      auto it = slot_of_input.find(c->inputs[0].get());
      if (it == slot_of_input.end() || roots.count(c.get())) continue;
      const size_t src = it->second;
      // Copy the fields first: push_back below may move the vector's slots.
      const Device device = g.state[src].device;
      const ir::NodePtr write = g.state[src].write;
      if (write->device != c->device || write_after.count(write.get())) continue;

      StateSlot copy;
      copy.shape = c->shape;
      copy.dtype = c->dtype;
      copy.device = device;
      copy.cast_of = static_cast<int>(src);
      copy.refresh = c;
      auto buf = ir::Buffer::alloc(c->nbytes(), device);
      ir::device_backend(device).fill_zero(buf->data, c->nbytes());
      copy.impl = std::make_shared<TensorImpl>();
      copy.impl->node = detail::make_constant_node(buf, c->shape, c->dtype);
      copy.impl->name = fmt::format("{} ({} copy)", g.state[src].impl->name, dtype_name(c->dtype));
      copy.input = ir::Node::make(
          ir::OpCode::Input, ir::InputAttrs{ir::InputKind::State, static_cast<int>(g.state.size())},
          {});
      copy.input->shape = c->shape;
      copy.input->dtype = c->dtype;
      copy.input->device = c->device;
      copy.input->trace_id = c->trace_id;
      copy.write = ir::Node::make(ir::OpCode::Cast, c->attrs, {write});
      copy.write->device = c->device;
      ir::op_info(ir::OpCode::Cast).infer(*copy.write);
      copy.write->trace_id = c->trace_id;

      repl[c.get()] = copy.input;
      write_after[write.get()] = copy.write;
      inputs.push_back(copy.input);
      g.state.push_back(std::move(copy));
    }
    if (repl.empty()) return false;
    // The copies' inputs first; each new cast right after the write it casts, so that a backend
    // that runs an optimizer's updates as one pass can take it into that pass.
    std::vector<ir::NodePtr> nodes = inputs;
    nodes.reserve(g.nodes.size() + 2 * inputs.size());
    for (auto& n : g.nodes) {
      nodes.push_back(n);
      if (auto it = write_after.find(n.get()); it != write_after.end()) nodes.push_back(it->second);
    }
    g.nodes.swap(nodes);
    g.replace_uses(repl);
    g.prune();  // the casts of the old values
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_cache_state_casts_pass() {
  return std::make_unique<CacheStateCasts>();
}

}  // namespace cstorch::compiler
