// Attention on a packed QKV projection without the copies around it. A transformer block
// projects its input once to X = [B, T, 3E] and attends over q, k, v = the three E-wide column
// slices of X, viewed as [B, T, H, D] (E = H D):
//   scaled_dot_product_attention(reshape(slice(X, 0:E)), reshape(slice(X, E:2E)),
//                                reshape(slice(X, 2E:3E)))
// Each slice is a strided copy of a third of X. Viewed as [B, T, 3H, D] (a reshape, no copy), X
// holds q, k and v as heads [0, H), [H, 2H) and [2H, 3H), which the attention kernel reads in
// place (AttentionAttrs::qkv). The backward is the mirror image: attention_grad writes dq, dk,
// dv one after another, which are sliced out again and concatenated along the last dim into
// X's gradient:
//   cat(reshape(slice(G, 0:n)), reshape(slice(G, n:2n)), reshape(slice(G, 2n:3n)), dim=2)
// With qkv set, G writes that gradient directly in X's layout, and the cat becomes a reshape
// of G. Each kernel reads and writes the same values as before, only at other addresses, so
// results are bitwise the same (tests/unit/compiler/test_pack_attention_qkv.cpp).
// Under autocast the projection is bf16 (or f16) and the attention casts each third to f32, and
// each third of its gradient back between the reshapes before the cat: X is then cast to f32
// once and viewed, and G, reshaped to X's shape, cast back once. A cast gives each element the
// same value whether it casts a third or the whole (in the bf16 GPT-2 124M step: 36 slices of
// the projection, 36 of its gradient and 12 cats gone, 3.6 ms a step on 2 cores).
//
// Conditions: the [B, T, H, D] layout (bthd), attention in f32; the three inputs are reshapes of
// the three thirds of one rank-3 tensor, in order (or casts to f32 of them, that tensor 16-bit);
// the node's backend runs the packed form (its capability answer, cannot_run: the CUDA kernel does
// not). A gradient node is rewritten only when it reads the same three inputs, writes no bias
// gradient, and its one consumer pattern is the cat above (every slice, reshape and cast read by
// nothing else).
#include <algorithm>
#include <unordered_map>

#include "compiler/graph.h"
#include "ir/device.h"

namespace cstorch::compiler {
namespace {

using ir::OpCode;

// X when q, k, v of attention node `n` are reshapes of X's three thirds along its last dim
// (X rank 3, [B, T, 3E], and each reshape [B, T, H, D] with H D = E), X f32; or casts to f32 of
// such reshapes, X of another float type (a bf16 projection under autocast, attention in f32:
// `cast` is then set). Else null.
ir::NodePtr packed_source(const ir::Node& n, bool& cast) {
  if (n.inputs.size() < 3) return nullptr;
  ir::NodePtr x;
  for (int i = 0; i < 3; ++i) {
    const ir::Node* in = n.inputs[i].get();
    const bool c = in->op == OpCode::Cast;
    if (c) {
      if (in->dtype != DType::f32) return nullptr;
      in = in->inputs[0].get();
    }
    if (i == 0) cast = c;
    if (c != cast) return nullptr;
    const ir::Node& r = *in;
    if (r.op != OpCode::Reshape || r.shape.size() != 4 || (r.dtype == DType::f32) == cast)
      return nullptr;
    const ir::Node& s = *r.inputs[0];
    if (s.op != OpCode::Slice) return nullptr;
    const ir::NodePtr& src = s.inputs[0];
    if (i == 0) x = src;
    if (src != x || src->shape.size() != 3 || src->dtype != r.dtype) return nullptr;
    const int64_t e = r.shape[2] * r.shape[3];
    const auto& sa = s.attr<ir::SliceAttrs>();
    if (src->shape[2] != 3 * e || sa.dim != 2 || sa.step != 1 || sa.start != i * e ||
        sa.end != (i + 1) * e || r.shape[0] != src->shape[0] || r.shape[1] != src->shape[1] ||
        r.shape != n.inputs[0]->shape)
      return nullptr;
  }
  return x;
}

class PackAttentionQkv : public Pass {
 public:
  const char* name() const override { return "pack_attention_qkv"; }
  bool run(Graph& g) override {
    // Consumers of every node (roots count as outside consumers).
    std::unordered_map<const ir::Node*, std::vector<ir::Node*>> users;
    std::unordered_map<const ir::Node*, int> roots;
    for (auto& n : g.nodes)
      for (auto& in : n->inputs) users[in.get()].push_back(n.get());
    for (auto& o : g.outputs) roots[o.get()]++;
    for (auto& s : g.state)
      if (s.write) roots[s.write.get()]++;
    for (auto& k : g.keep) roots[k.get()]++;
    // `n`'s only consumer, or null (several, none, or a root).
    auto sole_user = [&](const ir::Node& n) -> ir::Node* {
      auto it = users.find(&n);
      if (roots.count(&n) || it == users.end() || it->second.size() != 1) return nullptr;
      return it->second[0];
    };

    // The packed view of each source X, made once and placed before its first reader.
    std::unordered_map<const ir::Node*, ir::NodePtr> views;
    std::vector<std::pair<ir::NodePtr, const ir::Node*>> inserts;  // (new node, before this one)
    bool changed = false;
    for (auto& n : g.nodes) {
      if (n->op != OpCode::Attention && n->op != OpCode::AttentionGrad) continue;
      auto at = n->attr<ir::AttentionAttrs>();
      if (!at.bthd || at.qkv || n->dtype != DType::f32) continue;
      bool cast = false;
      const ir::NodePtr x = packed_source(*n, cast);
      if (!x) continue;
      ir::Node* cat = nullptr;
      if (n->op == OpCode::AttentionGrad) {
        // dq, dk, dv sliced out of n in order, each reshaped to [B, T, E] (with autocast, cast
        // back to X's type between reshapes), concatenated.
        if (at.bias_grad) continue;
        const int64_t third = n->shape[0] / 3;
        ir::Node* pieces[3] = {};
        for (ir::Node* s : users[n.get()]) {
          if (s->op != OpCode::Slice || roots.count(s)) break;
          const auto& sa = s->attr<ir::SliceAttrs>();
          const int64_t i = sa.start / std::max<int64_t>(third, 1);
          if (sa.dim != 0 || sa.step != 1 || sa.start != i * third || sa.end != (i + 1) * third ||
              i > 2 || pieces[i])
            break;
          pieces[i] = s;
        }
        if (users[n.get()].size() != 3 || !pieces[0] || !pieces[1] || !pieces[2] ||
            roots.count(n.get()))
          continue;
        for (int i = 0; i < 3; ++i) {
          // Reshapes, and one cast where the forward had them, each the sole reader of the last.
          ir::Node* r = pieces[i];
          bool casts = false;
          ir::Node* u = sole_user(*r);
          while (u && (u->op == OpCode::Reshape || (u->op == OpCode::Cast && cast && !casts))) {
            casts = casts || u->op == OpCode::Cast;
            r = u;
            u = sole_user(*r);
          }
          if (!u || u->op != OpCode::Cat || casts != cast || r->shape.size() != 3 ||
              u->inputs.size() != 3 || u->inputs[i].get() != r ||
              u->attr<ir::DimAttrs>().dim != 2 || (cat && u != cat)) {
            cat = nullptr;
            break;
          }
          cat = u;
        }
        if (!cat || cat->shape != x->shape || cat->dtype != x->dtype) continue;
      }
      at.qkv = true;
      auto make = [&](OpCode op, ir::Attrs attrs, ir::NodePtr in) {
        ir::NodePtr m = ir::Node::make(op, std::move(attrs), {std::move(in)});
        m->device = x->device;
        m->trace_id = n->trace_id;
        ir::op_info(op).infer(*m);
        return m;
      };
      ir::NodePtr& view = views[x.get()];
      ir::NodePtr v = view, xf;
      if (!v) {
        // With autocast, X cast to f32 once (each element as its third's cast gave it).
        const Shape& q = n->inputs[0]->shape;
        xf = cast ? make(OpCode::Cast, ir::CastAttrs{DType::f32}, x) : x;
        v = make(OpCode::Reshape, ir::ShapeAttrs{{q[0], q[1], 3 * q[2], q[3]}}, xf);
      }
      ir::Node probe = *n;
      probe.attrs = at;
      probe.inputs[0] = probe.inputs[1] = probe.inputs[2] = v;
      if (!ir::device_backend(n->device).cannot_run(probe).empty()) continue;
      if (!view) {
        view = v;
        if (xf != x) inserts.push_back({xf, n.get()});
        inserts.push_back({v, n.get()});
      }
      n->attrs = at;
      n->inputs[0] = n->inputs[1] = n->inputs[2] = v;
      if (cat && !cast) {  // X's gradient is n's output, in X's layout
        cat->op = OpCode::Reshape;
        cat->attrs = ir::ShapeAttrs{cat->shape};
        cat->inputs = {n};
      } else if (cat) {  // ... cast back to X's type once
        ir::NodePtr r = make(OpCode::Reshape, ir::ShapeAttrs{cat->shape}, n);
        inserts.push_back({r, cat});
        cat->op = OpCode::Cast;
        cat->attrs = ir::CastAttrs{cat->dtype};
        cat->inputs = {r};
      }
      changed = true;
    }
    for (auto& [node, before] : inserts) {
      auto it = std::find_if(g.nodes.begin(), g.nodes.end(),
                             [before = before](const ir::NodePtr& p) { return p.get() == before; });
      g.nodes.insert(it, node);
    }
    if (changed) g.prune();
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_pack_attention_qkv_pass() {
  return std::make_unique<PackAttentionQkv>();
}

}  // namespace cstorch::compiler
