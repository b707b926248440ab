// GEMM epilogue fusion: the elementwise op that alone consumes a product is folded into the
// product's kernel (a Gemm node, GemmAttrs), so the product is written once, finished, instead
// of written, read back and written again:
//   relu(linear(x, W[, b]))                  -> gemm{trans_b, bias, relu}(x, W[, b])
//   addcmul(matmul(A, B), C, s), s one value -> gemm{trans flags, addend}(A, B, C, s)
//   relu_grad(matmul(A, B), y)               -> gemm{trans flags, relu_grad}(A, B, y)
// The second is SGD's momentum update, grad + buf * momentum, with the weight gradient as the
// product: the new momentum comes out of the weight-gradient GEMM, and the gradient itself is
// never stored. The third is the backward of a hidden layer: the input gradient of the next
// layer, masked by where this layer's relu was positive. The planner may write it in place over the
// old momentum (the kernel reads each addend element just before writing that element).
//
// Conditions: the CPU backend runs the product through its own GEMM, which applies epilogues
// for free (cpu::own_gemm_applies; elsewhere the Gemm kernel would add a pass of its own and
// gain nothing); f32 throughout; the product has no other consumer and is not a step output, state
// write or kept root; a matmul is 2-d on both sides (no batch); the addcmul's other operand has
// the output's shape, and its product is one K block (K <= 384, a batch of at most 384 for a
// weight gradient: see cpu::own_gemm_one_k_block). The Gemm kernel applies the same per-element
// float operations in the same order as the separate kernels, so results are bitwise equal
// (tests/unit/compiler).
#include <algorithm>
#include <unordered_map>

#include "backend/cpu/gemm.h"
#include "compiler/graph.h"

namespace cstorch::compiler {
namespace {

using ir::OpCode;

// K of a Linear or 2-d Matmul node's product.
int64_t inner_size(const ir::Node& p) {
  const auto& a = p.inputs[0]->shape;
  if (p.op == OpCode::Linear) return a.back();
  return p.attr<ir::MatmulAttrs>().trans_a ? a[0] : a[1];
}

// Whether the CPU backend's own GEMM runs this product (and so applies an epilogue for free).
bool epilogue_is_free(const ir::Node& p) {
  const int64_t N = p.shape.back(), M = p.numel() / std::max<int64_t>(N, 1);
  const bool tb = p.op == OpCode::Linear || p.attr<ir::MatmulAttrs>().trans_b;
  return cpu::own_gemm_applies(M, N, inner_size(p), tb, true);
}

bool f32(const ir::Node& n) {
  if (n.dtype != DType::f32) return false;
  for (auto& in : n.inputs)
    if (in->dtype != DType::f32) return false;
  return true;
}

class FuseGemmEpilogue : public Pass {
 public:
  const char* name() const override { return "fuse_gemm_epilogue"; }
  bool run(Graph& g) override {
    // Consumers of every node; roots count as an extra (outside) consumer.
    std::unordered_map<const ir::Node*, int> uses;
    for (auto& n : g.nodes)
      for (auto& in : n->inputs) uses[in.get()]++;
    for (auto& o : g.outputs) uses[o.get()] += 2;
    for (auto& s : g.state)
      if (s.write) uses[s.write.get()] += 2;
    for (auto& k : g.keep) uses[k.get()] += 2;
    auto sole_use = [&](const ir::Node& p) { return uses[&p] == 1; };

    bool changed = false;
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
      } else if (n->op == OpCode::Addcmul && f32(*n)) {
        const auto& mm = *n->inputs[0];
        const auto& addend = n->inputs[1];
        const auto& scale = n->inputs[2];
        if (mm.op != OpCode::Matmul || !f32(mm) || !sole_use(mm) ||
            mm.inputs[0]->shape.size() != 2 || mm.inputs[1]->shape.size() != 2 ||
            mm.shape != n->shape || addend->shape != n->shape || scale->numel() != 1 ||
            !epilogue_is_free(mm) || !cpu::own_gemm_one_k_block(inner_size(mm)))
          continue;
        const auto& ma = mm.attr<ir::MatmulAttrs>();
        std::vector<ir::NodePtr> inputs = {mm.inputs[0], mm.inputs[1], addend, scale};
        n->op = OpCode::Gemm;
        n->attrs = ir::GemmAttrs{.trans_a = ma.trans_a, .trans_b = ma.trans_b, .addend = true};
        n->inputs = std::move(inputs);
        changed = true;
      }
    }
    if (changed) g.prune();
    return changed;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_gemm_epilogue_pass() {
  return std::make_unique<FuseGemmEpilogue>();
}

}  // namespace cstorch::compiler
