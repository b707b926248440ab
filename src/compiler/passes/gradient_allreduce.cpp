// Gradient all-reduce placement (data parallel). Every parameter gradient the step uses is
// replaced by its weighted mean over the replicas: buckets of gradients in production order,
// an all_reduce_start right after a bucket's last gradient exists, an all_reduce_unpack right
// before each gradient's first use. The program runs kernels in node order, so everything
// between a start and its unpacks (the rest of the backward pass) overlaps the communication.
#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <unordered_set>

#include "compiler/graph.h"

namespace cstorch::ops {
uint64_t next_collective_serial();
}

namespace cstorch::compiler {
namespace {

class GradientAllReduce : public Pass {
 public:
  GradientAllReduce(double weight, size_t bucket_bytes)
      : weight_(weight), bucket_bytes_(std::max<size_t>(bucket_bytes, 1)) {}
  const char* name() const override { return "gradient_allreduce"; }

  bool run(Graph& g) override {
    const size_t n = g.nodes.size();
    std::unordered_map<const ir::Node*, size_t> pos;
    for (size_t i = 0; i < n; ++i) pos[g.nodes[i].get()] = i;

    // First node (position) using each value; state writes and outputs count as "the end".
    std::unordered_map<const ir::Node*, size_t> first_use;
    std::unordered_set<const ir::Node*> used_by_node;
    for (size_t i = 0; i < n; ++i)
      for (auto& in : g.nodes[i]->inputs) {
        used_by_node.insert(in.get());
        first_use.emplace(in.get(), i);
      }
    std::unordered_set<const ir::Node*> used_as_output;
    for (auto& o : g.outputs) used_as_output.insert(o.get());

    std::unordered_set<const ir::Node*> stored;
    for (auto& s : g.state)
      if (s.write) stored.insert(s.write.get());

    // Gradients to average: computed in this step and f32, except those the step only stores
    // (a gradient-accumulation micro-step: the stored sum stays local until the step that
    // consumes it averages the sum of stored and new gradients, which is the same mean). The
    // rule depends on the program only, never on the replica, so every replica issues the
    // same collectives.
    std::vector<ir::NodePtr> grads;
    std::unordered_set<const ir::Node*> seen;
    for (auto& gr : g.gradients) {
      if (!gr || !pos.count(gr.get()) || !seen.insert(gr.get()).second) continue;
      if (has_trait(gr->op, ir::kLeaf) || gr->dtype != DType::f32) continue;
      const bool used = used_by_node.count(gr.get()) || used_as_output.count(gr.get());
      if (!used && stored.count(gr.get())) continue;
      grads.push_back(gr);
    }
    if (grads.empty()) return false;
    std::stable_sort(grads.begin(), grads.end(), [&](const ir::NodePtr& a, const ir::NodePtr& b) {
      return pos[a.get()] < pos[b.get()];
    });

    // Buckets in production order; each starts after its last member.
    std::unordered_map<size_t, std::vector<ir::NodePtr>> starts_after;  // position -> starts
    std::unordered_map<size_t, std::vector<ir::NodePtr>> unpacks_before;
    std::vector<ir::NodePtr> unpacks_at_end;
    std::unordered_map<ir::Node*, ir::NodePtr> repl;
    for (size_t b = 0; b < grads.size();) {
      // A bucket also closes before a gradient produced after an earlier member's first use:
      // its start must precede every unpack.
      size_t e = b, bytes = 0, earliest_use = SIZE_MAX;
      // A bucket holds gradients of one device (its kernels pack and unpack there).
      while (e < grads.size() &&
             (e == b || (bytes < bucket_bytes_ && pos[grads[e].get()] < earliest_use &&
                         grads[e]->device == grads[b]->device))) {
        auto fu = first_use.find(grads[e].get());
        if (fu != first_use.end()) earliest_use = std::min(earliest_use, fu->second);
        bytes += grads[e++]->nbytes();
      }
      std::vector<ir::NodePtr> members(grads.begin() + b, grads.begin() + e);
      auto start =
          ir::Node::make(ir::OpCode::AllReduceStart,
                         ir::AllReduceAttrs{ops::next_collective_serial(), weight_}, members);
      start->device = members.front()->device;
      ir::op_info(start->op).infer(*start);
      starts_after[pos[members.back().get()]].push_back(start);
      int64_t off = 0;
      for (auto& m : members) {
        auto u = ir::Node::make(ir::OpCode::AllReduceUnpack, ir::UnpackAttrs{off, m->shape, true},
                                {start});
        u->device = start->device;
        ir::op_info(u->op).infer(*u);
        off += m->numel();
        repl[m.get()] = u;
        auto fu = first_use.find(m.get());
        if (fu != first_use.end())
          unpacks_before[fu->second].push_back(u);
        else
          unpacks_at_end.push_back(u);
        // Unused here: still waited for (the bucket must stay intact until it is reduced).
        if (!used_by_node.count(m.get()) && !used_as_output.count(m.get()) &&
            !stored.count(m.get()))
          g.keep.push_back(u);
      }
      b = e;
    }

    // The gradients are inputs of their buckets now; only the unused waits need keeping. Then
    // every use goes through the waits (the starts are not in g.nodes yet, so their own inputs
    // stay the gradients), and the nodes are laid out in execution order.
    std::vector<ir::NodePtr> keep;
    for (auto& k : g.keep)
      if (!repl.count(k.get())) keep.push_back(k);
    g.keep.swap(keep);
    g.replace_uses(repl);
    std::vector<ir::NodePtr> out;
    out.reserve(n + repl.size() + starts_after.size());
    for (size_t i = 0; i < n; ++i) {
      if (auto it = unpacks_before.find(i); it != unpacks_before.end())
        for (auto& u : it->second) out.push_back(u);
      out.push_back(g.nodes[i]);
      if (auto it = starts_after.find(i); it != starts_after.end())
        for (auto& s : it->second) out.push_back(s);
    }
    for (auto& u : unpacks_at_end) out.push_back(u);
    g.nodes.swap(out);
    return true;
  }

 private:
  double weight_;
  size_t bucket_bytes_;
};

}  // namespace

std::unique_ptr<Pass> make_gradient_allreduce_pass(double weight, size_t bucket_bytes) {
  return std::make_unique<GradientAllReduce>(weight, bucket_bytes);
}

}  // namespace cstorch::compiler
