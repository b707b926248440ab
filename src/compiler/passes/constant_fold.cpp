// Constant folding: a node whose inputs are all constants (and creation ops such as full and
// arange) is evaluated once at compile time, on the host with the CPU kernels, and becomes a
// constant; a node of another device gets the result uploaded to its device. Results above
// `max_bytes` stay computed at run time, so folding never bloats the program.
#include "compiler/graph.h"
#include "ir/device.h"

namespace cstorch::compiler {
namespace {

class ConstantFold : public Pass {
 public:
  explicit ConstantFold(size_t max_bytes) : max_bytes_(max_bytes) {}
  const char* name() const override { return "constant_fold"; }
  bool run(Graph& g) override {
    const auto& host = ir::device_backend(Device{});
    bool changed = false;
    for (auto& n : g.nodes) {
      if (has_trait(n->op, ir::kLeaf | ir::kRandom | ir::kCollective | ir::kBarrier)) continue;
      if (n->nbytes() > max_bytes_) continue;
      bool all_const = true;
      for (auto& in : n->inputs) all_const = all_const && in->op == ir::OpCode::Constant;
      if (!all_const) continue;
      const void* ins[64];
      if (n->inputs.size() > 64) continue;
      std::vector<std::shared_ptr<ir::Buffer>> host_ins;
      for (size_t i = 0; i < n->inputs.size(); ++i) {
        host_ins.push_back(ir::host_view(n->inputs[i]->buffer));
        ins[i] = host_ins.back()->data;
      }
      auto buf = ir::Buffer::alloc(n->nbytes());
      if (has_trait(n->op, ir::kAlias) || n->op == ir::OpCode::ToDevice) {
        if (n->nbytes()) std::memcpy(buf->data, ins[0], n->nbytes());
      } else {
        ir::KernelContext ctx;
        ctx.backend = &host;
        std::shared_ptr<ir::Buffer> ws;
        if (size_t bytes = host.workspace_bytes(*n)) {
          ws = ir::Buffer::alloc(bytes);
          ctx.workspace = ws->data;
          ctx.workspace_bytes = bytes;
        }
        const ir::Kernel k = host.kernel(n->op);
        CS_CHECK(k != nullptr, "constant_fold: op '{}' has no CPU kernel", n->name());
        k(ctx, *n, ins, buf->data);
      }
      if (n->device != Device{}) {  // computed on the host: upload the result
        auto dev = ir::Buffer::alloc(n->nbytes(), n->device);
        ir::copy_between(n->device, dev->data, Device{}, buf->data, n->nbytes());
        buf = std::move(dev);
      }
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
