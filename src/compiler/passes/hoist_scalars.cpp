// Scheduling: every single-element elementwise node (an optimizer's bias corrections and step
// sizes, a loss scale) moves up to just after its last input, so that the large nodes it sat
// between become neighbours: the Fused updates of one parameter (AdamW's two moments and the
// parameter) then run as one pass (Program::plan_groups). Only the order of the node list
// changes; every value and dependency stays, and the memory plan is made for the new order.
#include <algorithm>
#include <unordered_map>

#include "compiler/graph.h"

namespace cstorch::compiler {
namespace {

class HoistScalars : public Pass {
 public:
  const char* name() const override { return "hoist_scalars"; }
  bool run(Graph& g) override {
    // Sort key: (anchor, depth, position). A node that stays is its own anchor at depth 0; a
    // hoisted node takes the greatest (anchor, depth) of its inputs, one deeper; leaves sort
    // first. Every input then sorts before its user, and nodes that stay keep their order.
    struct Key {
      size_t anchor, depth, pos;
      bool operator<(const Key& o) const {
        return std::tie(anchor, depth, pos) < std::tie(o.anchor, o.depth, o.pos);
      }
    };
    std::unordered_map<const ir::Node*, Key> key;
    std::vector<std::pair<Key, ir::NodePtr>> order;
    order.reserve(g.nodes.size());
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      const ir::Node& n = *g.nodes[i];
      Key k{i, 0, i};
      if (has_trait(n.op, ir::kLeaf)) {
        k = {0, 0, i};  // inputs and constants run nothing: all first, in their order
      } else if (has_trait(n.op, ir::kElementwise) && n.numel() <= 1) {
        k = {0, 0, i};
        for (const auto& in : n.inputs) {
          const Key& ki = key.at(in.get());
          if (std::tie(ki.anchor, ki.depth) > std::tie(k.anchor, k.depth)) {
            k.anchor = ki.anchor;
            k.depth = ki.depth;
          }
        }
        ++k.depth;
      }
      key[&n] = k;
      order.push_back({k, g.nodes[i]});
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    bool moved = false;
    for (size_t i = 0; i < order.size(); ++i) {
      moved = moved || order[i].second != g.nodes[i];
      g.nodes[i] = order[i].second;
    }
    return moved;
  }
};

}  // namespace

std::unique_ptr<Pass> make_hoist_scalars_pass() {
  return std::make_unique<HoistScalars>();
}

}  // namespace cstorch::compiler
