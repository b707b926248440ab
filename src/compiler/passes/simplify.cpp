// Algebraic simplification: a transpose of the last two dims feeding a matmul becomes the
// GEMM's transpose flag (no copy); permute-of-permute composes; identity permutes, reshapes to
// the same shape, reshape chains and same-dtype casts disappear.
#include "compiler/graph.h"

namespace cstorch::compiler {
namespace {

bool swaps_last_two(const ir::Dims& perm) {
  size_t r = perm.size();
  if (r < 2) return false;
  for (size_t i = 0; i + 2 < r; ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return perm[r - 2] == static_cast<int64_t>(r - 1) && perm[r - 1] == static_cast<int64_t>(r - 2);
}
bool is_identity(const ir::Dims& perm) {
  for (size_t i = 0; i < perm.size(); ++i)
    if (perm[i] != static_cast<int64_t>(i)) return false;
  return true;
}

class Simplify : public Pass {
 public:
  const char* name() const override { return "simplify"; }
  bool run(Graph& g) override {
    std::unordered_map<ir::Node*, ir::NodePtr> repl;
    bool changed = false;
    for (auto& n : g.nodes) {
      for (auto& in : n->inputs) {
        auto it = repl.find(in.get());
        if (it != repl.end()) in = it->second;
      }
      switch (n->op) {
        case ir::OpCode::Matmul: {
          auto a = std::get<ir::MatmulAttrs>(n->attrs);
          for (int i = 0; i < 2; ++i) {
            auto& in = n->inputs[i];
            if (in->op == ir::OpCode::Permute &&
                swaps_last_two(in->attr<ir::PermuteAttrs>().perm)) {
              in = in->inputs[0];
              (i == 0 ? a.trans_a : a.trans_b) ^= true;
              changed = true;
            }
          }
          n->attrs = a;
          break;
        }
        case ir::OpCode::Permute: {
          const auto& perm = n->attr<ir::PermuteAttrs>().perm;
          if (is_identity(perm)) {
            repl[n.get()] = n->inputs[0];
            changed = true;
          } else if (n->inputs[0]->op == ir::OpCode::Permute) {
            const auto& inner = n->inputs[0]->attr<ir::PermuteAttrs>().perm;
            ir::Dims composed(perm.size());
            for (size_t i = 0; i < perm.size(); ++i) composed[i] = inner[perm[i]];
            n->inputs[0] = n->inputs[0]->inputs[0];
            n->attrs = ir::PermuteAttrs{composed};
            if (is_identity(composed)) repl[n.get()] = n->inputs[0];
            changed = true;
          }
          break;
        }
        case ir::OpCode::Reshape:
          while (n->inputs[0]->op == ir::OpCode::Reshape) {  // reshape chains collapse
            n->inputs[0] = n->inputs[0]->inputs[0];
            changed = true;
          }
          if (n->inputs[0]->shape == n->shape) {
            repl[n.get()] = n->inputs[0];
            changed = true;
          }
          break;
        case ir::OpCode::Cast:
          if (n->inputs[0]->dtype == n->dtype) {
            repl[n.get()] = n->inputs[0];
            changed = true;
          }
          break;
        default:
          break;
      }
    }
    if (!changed) return false;
    g.replace_uses(repl);
    g.prune();
    return true;
  }
};
}  // namespace
std::unique_ptr<Pass> make_simplify_pass() {
  return std::make_unique<Simplify>();
}
}  // namespace cstorch::compiler
