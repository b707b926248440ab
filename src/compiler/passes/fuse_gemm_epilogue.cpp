// GEMM epilogue fusion: the elementwise op that alone consumes a product is folded into the
// product's kernel (a Gemm node, GemmAttrs), so the product is written once, finished, instead
// of written, read back and written again:
//   relu(linear(x, W[, b]))                  -> gemm{trans_b, bias, relu}(x, W[, b])
//   addcmul(matmul(A, B), C, s), s one value -> gemm{trans flags, addend}(A, B, C, s)
//   relu_grad(matmul(A, B), y)               -> gemm{trans flags, relu_grad}(A, B, y)
//   gelu_grad(matmul(A, B), x)               -> gemm{trans flags, gelu_grad}(A, B, x), also
//                                               through a Linear's input-gradient reshapes
//   then addcmul(p, that momentum gemm, r)   -> the same gemm also writes p <- p + m * r in
//                                               place, and p's new value is After(p, gemm)
// And a bf16 product's cast to f32 (directly or through a reshape) becomes the product itself,
// storing f32 values (MatmulAttrs::f32_out) where the backend runs that (its capability answer,
// cannot_run): bitwise the cast's. A bf16 Linear without bias cast to f32 (a language model's
// head under autocast, its logits cast for the loss) becomes such a product of its input's rows,
// and the loss's gradient cast back to bf16 for the head's products is stored as bf16 by the
// loss's kernel (LossAttrs::bf16_out).
// The second is SGD's momentum update, grad + buf * momentum, with the weight gradient as the
// product: the new momentum comes out of the weight-gradient GEMM, and the gradient itself is
// never stored. The planner may write it in place over the old momentum (the kernel reads each
// addend element just before writing that element). The third is the backward of a hidden
// layer: the input gradient of the next layer, masked by where this layer's relu was positive;
// the fourth the same for a gelu layer (a transformer's MLP), the gradient applied to each tile
// of the product while it is in L1, so that the [tokens, 4 x width] product is not written out
// and read back.
//
// Conditions: the product's backend applies an epilogue for free at this shape (the capability
// query DeviceBackend::gemm_epilogue_applies; the CPU answers for its own GEMM, elsewhere the
// Gemm kernel would add a pass of its own and gain nothing); f32 throughout; the product has no
// other consumer and is not a step output, state write or kept root; a matmul is 2-d on both sides
// (no batch); the addcmul's other operand has the output's shape, and its product is one K block (K
// <= 384, a batch of at most 384 for a weight gradient: DeviceBackend::gemm_addend_exact). The Gemm
// kernel applies the same per-element float operations in the same order as the separate kernels,
// so results are bitwise equal (tests/unit/compiler).
#include <algorithm>
#include <unordered_map>

#include "compiler/graph.h"
#include "ir/device.h"

namespace cstorch::compiler {
namespace {

using ir::OpCode;

// K of a Linear or 2-d Matmul node's product.
int64_t inner_size(const ir::Node& p) {
  const auto& a = p.inputs[0]->shape;
  if (p.op == OpCode::Linear) return a.back();
  return p.attr<ir::MatmulAttrs>().trans_a ? a[0] : a[1];
}

// Whether the product's backend applies an epilogue to it for free.
bool epilogue_is_free(const ir::Node& p) {
  const int64_t N = p.shape.back(), M = p.numel() / std::max<int64_t>(N, 1);
  const bool tb = p.op == OpCode::Linear || p.attr<ir::MatmulAttrs>().trans_b;
  return ir::device_backend(p.device).gemm_epilogue_applies(M, N, inner_size(p), tb);
}

// Whether n's backend would run n rewritten to these attributes and output dtype (asked before
// rewriting it: a fold applies only where the backend runs its result).
bool runs_as(const ir::Node& n, ir::Attrs attrs, DType dtype) {
  ir::Node probe = n;
  probe.attrs = std::move(attrs);
  probe.dtype = dtype;
  return ir::device_backend(n.device).cannot_run(probe).empty();
}

bool f32(const ir::Node& n) {
  if (n.dtype != DType::f32) return false;
  for (auto& in : n.inputs)
    if (in->dtype != DType::f32) return false;
  return true;
}

// SGD's parameter update after a momentum Gemm: u = addcmul(p, m, r) with m a Gemm{addend} (the
// new momentum, a state write read by nothing but u) and u the state write of p read by
// nothing. The Gemm then also writes p <- p + m * r in place (GemmAttrs::update) and u becomes
// After(p, m): p's storage, holding its new value once m has run. Safe only if nothing reads
// p's old value after m: every other reader of p comes before m in the node order (which is
// the execution order), and p is not a root (a root is read after every kernel).
bool fold_parameter_updates(Graph& g, std::unordered_map<const ir::Node*, int>& uses) {
  std::unordered_map<const ir::Node*, size_t> pos;
  for (size_t i = 0; i < g.nodes.size(); ++i) pos[g.nodes[i].get()] = i;
  // Where each node is read: positions of the nodes reading it (once per input slot).
  std::unordered_map<const ir::Node*, std::vector<size_t>> readers;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (auto& in : g.nodes[i]->inputs) readers[in.get()].push_back(i);
  std::unordered_map<const ir::Node*, const StateSlot*> slot_of_write;
  for (auto& s : g.state)
    if (s.write) slot_of_write[s.write.get()] = &s;
  bool changed = false;
  // The scale becomes an input of m: one defined after m (a CPU scalar moved to the device
  // where it is used) moves to just before m, which its own inputs precede.
  std::vector<std::pair<ir::NodePtr, ir::NodePtr>> moves;  // (scale, before this node)
  for (auto& u : g.nodes) {
    if (u->op != OpCode::Addcmul || !f32(*u)) continue;
    const ir::NodePtr p = u->inputs[0], m = u->inputs[1], r = u->inputs[2];
    if (m->op != OpCode::Gemm || m->shape != u->shape || p->shape != u->shape || r->numel() != 1)
      continue;
    auto at = m->attr<ir::GemmAttrs>();
    auto us = slot_of_write.find(u.get());
    if (!at.addend || at.update || !slot_of_write.count(m.get()) || uses[m.get()] != 3 ||
        us == slot_of_write.end() || us->second->input != p || uses[u.get()] != 2)
      continue;
    // p is read by nodes only (not a root: uses[p] counts node readers alone), and every reader
    // but u comes before m (so also m itself does not read it).
    const auto& rp = readers[p.get()];
    const size_t at_m = pos[m.get()], at_u = pos[u.get()];
    if (static_cast<int>(rp.size()) != uses[p.get()] ||
        std::any_of(rp.begin(), rp.end(), [&](size_t r) { return r != at_u && r >= at_m; }))
      continue;
    if (pos[r.get()] > at_m) {
      if (std::any_of(r->inputs.begin(), r->inputs.end(),
                      [&](const ir::NodePtr& x) { return pos[x.get()] >= at_m; }))
        continue;
      moves.push_back({r, m});
    }
    at.update = true;
    m->attrs = at;
    m->inputs.push_back(p);
    m->inputs.push_back(r);
    u->op = OpCode::After;
    u->attrs = ir::NoAttrs{};
    u->inputs = {p, m};
    changed = true;
  }
  for (auto& [r, before] : moves) {
    auto from = std::find(g.nodes.begin(), g.nodes.end(), r);
    auto to = std::find(g.nodes.begin(), g.nodes.end(), before);
    if (from < to) continue;  // moved already (a scale shared by several updates)
    ir::NodePtr keep = *from;
    g.nodes.erase(from);
    g.nodes.insert(std::find(g.nodes.begin(), g.nodes.end(), before), std::move(keep));
  }
  return changed;
}

// cast(linear(x, W) in bf16, f32), directly or through a reshape, with no bias: the product as
// a Matmul{trans_b, f32_out} of x's rows (x reshaped to [rows, K] when it has more dims) and the
// cast as a reshape of it to the cast's shape, where the backend runs that product. The product
// stores the f32 value of its bf16 result, bitwise the cast's (the same GEMM sums, rounded to
// bf16 once), and the bf16 logits of a language model's head (a [tokens, vocabulary] cast read
// by the loss) are neither written as bf16 nor read back. New nodes go into `inserts`, to be
// placed before `cast`; the cast is rewritten in place.
bool linear_stored_as_f32(ir::Node& cast, const ir::Node& lin,
                          std::unordered_map<const ir::Node*, int>& uses,
                          std::vector<std::pair<ir::NodePtr, const ir::Node*>>& inserts) {
  if (lin.dtype != DType::bf16 || lin.inputs.size() != 2 || uses[&lin] != 1) return false;
  const ir::NodePtr x = lin.inputs[0], w = lin.inputs[1];
  if (x->dtype != DType::bf16 || w->dtype != DType::bf16 || x->shape.size() < 2) return false;
  const int64_t K = w->shape[1];
  const int64_t M = x->numel() / std::max<int64_t>(K, 1);
  ir::NodePtr rows = x;
  if (x->shape.size() != 2) {
    rows = ir::Node::make(OpCode::Reshape, ir::ShapeAttrs{{M, K}}, {x});
    rows->device = x->device;
    rows->trace_id = lin.trace_id;
    ir::op_info(OpCode::Reshape).infer(*rows);
  }
  ir::NodePtr product =
      ir::Node::make(OpCode::Matmul, ir::MatmulAttrs{.trans_b = true, .f32_out = true}, {rows, w});
  product->device = lin.device;
  product->trace_id = lin.trace_id;
  ir::op_info(OpCode::Matmul).infer(*product);
  if (product->dtype != DType::f32 || !ir::device_backend(lin.device).cannot_run(*product).empty())
    return false;
  if (rows != x) inserts.push_back({rows, &cast});
  inserts.push_back({product, &cast});
  cast.op = OpCode::Reshape;
  cast.attrs = ir::ShapeAttrs{cast.shape};
  cast.inputs = {product};
  return true;
}

class FuseGemmEpilogue : public Pass {
 public:
  const char* name() const override { return "fuse_gemm_epilogue"; }
  bool run(Graph& g) override {
    // Consumers of every node; roots count as two (outside) consumers.
    std::unordered_map<const ir::Node*, int> uses;
    auto count_uses = [&] {
      uses.clear();
      for (auto& n : g.nodes)
        for (auto& in : n->inputs) uses[in.get()]++;
      for (auto& o : g.outputs) uses[o.get()] += 2;
      for (auto& s : g.state)
        if (s.write) uses[s.write.get()] += 2;
      for (auto& k : g.keep) uses[k.get()] += 2;
    };
    count_uses();
    auto sole_use = [&](const ir::Node& p) { return uses[&p] == 1; };

    bool changed = false;
    std::vector<std::pair<ir::NodePtr, const ir::Node*>> inserts;  // (new node, before this one)
    for (auto& n : g.nodes) {
      if (n->op == OpCode::Relu && f32(*n)) {
        const auto& lin = *n->inputs[0];
        if (lin.op != OpCode::Linear || !f32(lin) || !sole_use(lin) ||
            lin.inputs[0]->shape.size() < 2 || !epilogue_is_free(lin))
          continue;
        n->op = OpCode::Gemm;
        n->attrs = ir::GemmAttrs{.trans_b = true, .bias = lin.inputs.size() == 3, .relu = true};
        n->inputs = lin.inputs;
        changed = true;
      } else if (n->op == OpCode::ReluGrad && f32(*n)) {
        const auto& mm = *n->inputs[0];
        const auto& y = n->inputs[1];
        if (mm.op != OpCode::Matmul || !f32(mm) || !sole_use(mm) ||
            mm.inputs[0]->shape.size() != 2 || mm.inputs[1]->shape.size() != 2 ||
            mm.shape != n->shape || y->shape != n->shape || !epilogue_is_free(mm))
          continue;
        const auto& ma = mm.attr<ir::MatmulAttrs>();
        std::vector<ir::NodePtr> inputs = {mm.inputs[0], mm.inputs[1], y};
        n->op = OpCode::Gemm;
        n->attrs = ir::GemmAttrs{.trans_a = ma.trans_a, .trans_b = ma.trans_b, .relu_grad = true};
        n->inputs = std::move(inputs);
        changed = true;
      } else if (n->op == OpCode::GeluGrad && f32(*n)) {
        // The product is the next layer's input gradient: a Matmul of 2-d operands, reshaped to
        // the activation's [batch, tokens, features] when the Linear had leading dims (its A
        // then a reshape of the incoming gradient to rows, or rows already). The Gemm takes
        // that gradient with the leading dims (an untransposed A may have them: the reshape's
        // input, or a new reshape of A), and so has gelu_grad's shape.
        const ir::NodePtr dy = n->inputs[0], x = n->inputs[1];
        const bool through = dy->op == OpCode::Reshape && sole_use(*dy);
        const ir::Node& mm = through ? *dy->inputs[0] : *dy;
        if (mm.op != OpCode::Matmul || !f32(mm) || !sole_use(mm) ||
            mm.inputs[0]->shape.size() != 2 || mm.inputs[1]->shape.size() != 2 ||
            x->shape != n->shape || !epilogue_is_free(mm))
          continue;
        const auto& ma = mm.attr<ir::MatmulAttrs>();
        ir::NodePtr a = mm.inputs[0];
        if (mm.shape != n->shape) {
          if (ma.trans_a) continue;
          Shape lead = n->shape;
          lead.back() = a->shape[1];
          if (a->op == OpCode::Reshape && a->inputs[0]->shape == lead) {
            a = a->inputs[0];
          } else {
            ir::NodePtr r = ir::Node::make(OpCode::Reshape, ir::ShapeAttrs{lead}, {a});
            r->device = a->device;
            r->trace_id = n->trace_id;
            ir::op_info(OpCode::Reshape).infer(*r);
            inserts.push_back({r, n.get()});
            a = r;
          }
        }
        const bool tanh_form = n->attr<ir::GeluAttrs>().tanh_approx;
        std::vector<ir::NodePtr> inputs = {a, mm.inputs[1], x};
        n->op = OpCode::Gemm;
        n->attrs = ir::GemmAttrs{.trans_a = ma.trans_a,
                                 .trans_b = ma.trans_b,
                                 .gelu_grad = true,
                                 .gelu_tanh = tanh_form};
        n->inputs = std::move(inputs);
        changed = true;
      } else if (n->op == OpCode::Cast && n->dtype == DType::bf16) {
        // cast(cross_entropy_grad(y, g, t) in f32, bf16) -> cross_entropy_grad{bf16_out}: the
        // gradient of the logits, cast for the bf16 products of a head's backward, stored as
        // bf16 by the loss's kernel (bitwise the cast's), never as f32.
        const ir::Node& ce = *n->inputs[0];
        if (ce.op != OpCode::CrossEntropyGrad || ce.dtype != DType::f32 || !sole_use(ce)) continue;
        ir::LossAttrs la = ce.attr<ir::LossAttrs>();
        la.bf16_out = true;
        if (!runs_as(ce, la, DType::bf16)) continue;
        std::vector<ir::NodePtr> inputs = ce.inputs;
        n->op = OpCode::CrossEntropyGrad;
        n->attrs = la;
        n->inputs = std::move(inputs);
        changed = true;
      } else if (n->op == OpCode::Cast && n->dtype == DType::f32) {
        // cast(matmul(A, B) in bf16, f32) -> matmul{f32_out}(A, B): the product stores the f32
        // value of its bf16 result (autocast's weight gradients, back to the f32 master weights).
        // Also through a reshape between them, cast(reshape(matmul)) -> reshape(matmul{f32_out})
        // (autocast's input gradients of a Linear on [batch, tokens, features], whose product
        // runs on the rows flattened, back to the f32 ops between the products).
        const ir::NodePtr in = n->inputs[0];
        const bool through = in->op == OpCode::Reshape && sole_use(*in);
        const ir::NodePtr mmp = through ? in->inputs[0] : in;
        if (mmp->op == OpCode::Linear) {
          if (linear_stored_as_f32(*n, *mmp, uses, inserts)) changed = true;
          continue;
        }
        const auto& mm = *mmp;
        if (mm.op != OpCode::Matmul || mm.dtype != DType::bf16 || !sole_use(mm) ||
            mm.inputs[0]->shape.size() != 2 || mm.inputs[1]->shape.size() != 2)
          continue;
        ir::MatmulAttrs ma = mm.attr<ir::MatmulAttrs>();
        ma.f32_out = true;
        if (!runs_as(mm, ma, DType::f32)) continue;
        if (through) {
          // The product (read by the reshape alone) now stores f32; the cast becomes the reshape.
          mmp->attrs = ma;
          mmp->dtype = DType::f32;
          n->op = OpCode::Reshape;
          n->attrs = in->attrs;
          n->inputs = {mmp};
        } else {
          std::vector<ir::NodePtr> inputs = mm.inputs;
          n->op = OpCode::Matmul;
          n->attrs = ma;
          n->inputs = std::move(inputs);
        }
        changed = true;
      } else if (n->op == OpCode::Addcmul && f32(*n)) {
        const auto& mm = *n->inputs[0];
        const auto& addend = n->inputs[1];
        const auto& scale = n->inputs[2];
        if (mm.op != OpCode::Matmul || !f32(mm) || !sole_use(mm) ||
            mm.inputs[0]->shape.size() != 2 || mm.inputs[1]->shape.size() != 2 ||
            mm.shape != n->shape || addend->shape != n->shape || scale->numel() != 1 ||
            !epilogue_is_free(mm) ||
            !ir::device_backend(mm.device).gemm_addend_exact(inner_size(mm)))
          continue;
        const auto& ma = mm.attr<ir::MatmulAttrs>();
        std::vector<ir::NodePtr> inputs = {mm.inputs[0], mm.inputs[1], addend, scale};
        n->op = OpCode::Gemm;
        n->attrs = ir::GemmAttrs{.trans_a = ma.trans_a, .trans_b = ma.trans_b, .addend = true};
        n->inputs = std::move(inputs);
        changed = true;
      }
    }
    for (auto& [node, before] : inserts) {
      auto at = std::find_if(g.nodes.begin(), g.nodes.end(),
                             [before = before](const ir::NodePtr& x) { return x.get() == before; });
      g.nodes.insert(at, node);
    }
    if (changed) {
      g.prune();
      count_uses();
    }
    return fold_parameter_updates(g, uses) || changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_gemm_epilogue_pass() {
  return std::make_unique<FuseGemmEpilogue>();
}

}  // namespace cstorch::compiler
