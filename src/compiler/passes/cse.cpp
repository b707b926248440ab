// Common-subexpression elimination by structural hashing: two nodes with the same op,
// attributes and (already deduplicated) inputs compute the same value, so one is kept.
// Random draws are never merged (each draw is distinct by design), nor barriers (kBarrier: a
// recomputed forward must stay separate from the original), and leaves are identities.
#include <unordered_map>

#include "compiler/graph.h"

namespace cstorch::compiler {
namespace {

struct Key {
  const ir::Node* n;
  bool operator==(const Key& o) const {
    const auto& a = *n;
    const auto& b = *o.n;
    if (a.op != b.op || a.dtype != b.dtype || a.shape != b.shape ||
        a.inputs.size() != b.inputs.size())
      return false;
    for (size_t i = 0; i < a.inputs.size(); ++i)
      if (a.inputs[i].get() != b.inputs[i].get()) return false;
    return a.attrs == b.attrs;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = ir::hash_mix(static_cast<size_t>(k.n->op), ir::hash_attrs(k.n->attrs));
    h = ir::hash_mix(h, static_cast<size_t>(k.n->dtype));
    for (auto& in : k.n->inputs) h = ir::hash_mix(h, std::hash<const void*>{}(in.get()));
    return ir::hash_dims(h, k.n->shape);
  }
};

class Cse : public Pass {
 public:
  const char* name() const override { return "cse"; }
  bool run(Graph& g) override {
    std::unordered_map<Key, ir::NodePtr, KeyHash> seen;
    std::unordered_map<ir::Node*, ir::NodePtr> repl;
    for (auto& n : g.nodes) {
      for (auto& in : n->inputs) {  // inputs first, so structurally equal chains collapse
        auto it = repl.find(in.get());
        if (it != repl.end()) in = it->second;
      }
      if (n->inputs.empty() || has_trait(n->op, ir::kRandom | ir::kCollective | ir::kBarrier))
        continue;
      auto [it, inserted] = seen.emplace(Key{n.get()}, n);
      if (!inserted) repl[n.get()] = it->second;
    }
    if (repl.empty()) return false;
    g.replace_uses(repl);
    g.prune();
    return true;
  }
};
}  // namespace
std::unique_ptr<Pass> make_cse_pass() {
  return std::make_unique<Cse>();
}
}  // namespace cstorch::compiler
