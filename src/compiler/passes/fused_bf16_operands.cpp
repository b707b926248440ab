// bf16 products read only by Fused programs stay bf16. Epilogue fusion stores a bf16 product's
// cast to f32 as the product's own f32 output (MatmulAttrs::f32_out: the f32 value of its bf16
// result), the form every consumer reads. When every consumer is a Fused program on a backend
// whose Fused kernel widens bf16 inputs (DeviceBackend::fused_reads_bf16), the product can store
// the bf16 result itself: the programs read exactly the same f32 values, and the product's
// write and each of its reads move 2 bytes an element instead of 4. Under autocast that is every
// weight gradient read only by its optimizer's update (the largest stream of the step's
// non-product work), and through one reshape the same for an input gradient.
//
// Runs after elementwise fusion, which decides what is a Fused program; a product with any other
// consumer, or that is a step output, state write or kept value, stays f32.
#include <unordered_map>
#include <unordered_set>

#include "compiler/graph.h"
#include "ir/device.h"

namespace cstorch::compiler {
namespace {

using ir::OpCode;

class FusedBf16Operands : public Pass {
 public:
  const char* name() const override { return "fused_bf16_operands"; }
  bool run(Graph& g) override {
    std::unordered_map<const ir::Node*, std::vector<ir::Node*>> readers;
    for (auto& n : g.nodes)
      for (auto& in : n->inputs) readers[in.get()].push_back(n.get());
    std::unordered_set<const ir::Node*> root;
    for (auto& o : g.outputs) root.insert(o.get());
    for (auto& s : g.state)
      if (s.write) root.insert(s.write.get());
    for (auto& k : g.keep) root.insert(k.get());
    // Read by Fused programs only (at least one), and by nothing outside the graph.
    auto fused_only = [&](const ir::Node& v) {
      auto it = readers.find(&v);
      if (root.count(&v) || it == readers.end()) return false;
      for (const ir::Node* r : it->second)
        if (r->op != OpCode::Fused) return false;
      return true;
    };
    bool changed = false;
    for (auto& n : g.nodes) {
      if (n->op != OpCode::Matmul || !n->attr<ir::MatmulAttrs>().f32_out) continue;
      const auto& backend = ir::device_backend(n->device);
      if (!backend.fused_reads_bf16() || root.count(n.get())) continue;
      // Directly, or through a reshape (an alias on the product's device) that is its only
      // reader.
      const auto& rd = readers[n.get()];
      ir::Node* reshape = rd.size() == 1 && rd[0]->op == OpCode::Reshape ? rd[0] : nullptr;
      if (!fused_only(reshape ? *reshape : *n)) continue;
      ir::MatmulAttrs ma = n->attr<ir::MatmulAttrs>();
      ma.f32_out = false;
      ir::Node narrowed = *n;
      narrowed.attrs = ma;
      narrowed.dtype = DType::bf16;
      if (!backend.cannot_run(narrowed).empty()) continue;
      n->attrs = ma;
      n->dtype = DType::bf16;
      if (reshape) reshape->dtype = DType::bf16;
      changed = true;
    }
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fused_bf16_operands_pass() {
  return std::make_unique<FusedBf16Operands>();
}

}  // namespace cstorch::compiler
