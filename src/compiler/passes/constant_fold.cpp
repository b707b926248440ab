// Constant folding: a node whose inputs are all constants (and creation ops such as full and
// arange) is evaluated once at compile time with the CPU kernels and becomes a constant.
// Results above `max_bytes` stay computed at run time, so folding never bloats the program.
#include "compiler/graph.h"

namespace cstorch::compiler {
namespace {

class ConstantFold : public Pass {
 public:
  explicit ConstantFold(size_t max_bytes) : max_bytes_(max_bytes) {}
  const char* name() const override { return "constant_fold"; }
  bool run(Graph& g) override {
    const auto& kernels = ir::kernels_for(DeviceType::CPU);
    bool changed = false;
    for (auto& n : g.nodes) {
      if (has_trait(n->op, ir::kLeaf | ir::kRandom | ir::kCollective | ir::kBarrier)) continue;
      if (n->nbytes() > max_bytes_) continue;
      bool all_const = true;
      for (auto& in : n->inputs) all_const = all_const && in->op == ir::OpCode::Constant;
      if (!all_const) continue;
      const void* ins[64];
      if (n->inputs.size() > 64) continue;
      for (size_t i = 0; i < n->inputs.size(); ++i) ins[i] = n->inputs[i]->buffer->data;
      auto buf = ir::Buffer::alloc(n->nbytes());
      if (has_trait(n->op, ir::kAlias))
        std::memcpy(buf->data, ins[0], n->nbytes());
      else
        kernels.kernels[static_cast<int>(n->op)](*n, ins, buf->data);
      // Turn the node into a constant in place: every user keeps pointing at it.
      n->op = ir::OpCode::Constant;
      n->attrs = ir::NoAttrs{};
      n->inputs.clear();
      n->buffer = std::move(buf);
      changed = true;
    }
    if (changed) g.prune();
    return changed;
  }

 private:
  size_t max_bytes_;
};
}  // namespace
std::unique_ptr<Pass> make_constant_fold_pass(size_t max_bytes) {
  return std::make_unique<ConstantFold>(max_bytes);
}
}  // namespace cstorch::compiler
