// Algebraic simplification: a transpose of the last two dims feeding a matmul becomes the
// GEMM's transpose flag (no copy); permute-of-permute composes; identity permutes, reshapes to
// the same shape, reshape chains and same-dtype casts disappear. The sum of zero-padded
// concatenations (the gradients of slices of one tensor, e.g. a packed QKV projection) becomes
// one concatenation of the pieces. A scatter into zeros added to a tensor scatters into it.
// Cross-entropy's two backward ops become one.
#include <algorithm>

#include "compiler/graph.h"
#include "ir/device.h"

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

// A zero tensor: full(0), or a constant whose bytes are all zero (constant folding turns small
// zeros() into constants).
bool is_zero_fill(const ir::Node& n) {
  if (n.op == ir::OpCode::Full) return n.attr<ir::FullAttrs>().value == 0.0;
  if (n.op != ir::OpCode::Constant || !n.buffer) return false;
  const auto host = ir::host_view(n.buffer);
  const auto* p = static_cast<const unsigned char*>(host->data);
  const size_t bytes = n.nbytes();
  for (size_t i = 0; i < bytes; ++i)
    if (p[i]) return false;
  return true;
}

// The non-zero pieces of a Cat (offset along its dim, node); false if `n` is not a Cat.
struct Piece {
  int64_t off, len;
  ir::NodePtr node;
};
bool cat_pieces(const ir::Node& n, std::vector<Piece>& out) {
  if (n.op != ir::OpCode::Cat) return false;
  const int64_t dim = n.attr<ir::DimAttrs>().dim;
  int64_t off = 0;
  for (auto& in : n.inputs) {
    const int64_t len = in->shape[dim];
    if (!is_zero_fill(*in)) out.push_back({off, len, in});
    off += len;
  }
  return true;
}

// add(cat(a, 0), cat(0, b)) -> cat(a, b) along one dim when the non-zero pieces do not overlap
// (x + 0 = x; only the sign of a zero may differ). Rewrites `n` in place into the Cat; new zero
// fills for the gaps are appended to `fills` (to be placed before `n`).
bool merge_padded_cats(ir::Node& n, std::vector<ir::NodePtr>& fills) {
  if (n.op != ir::OpCode::Add || n.inputs.size() != 2) return false;
  const auto& a = *n.inputs[0];
  const auto& b = *n.inputs[1];
  if (a.op != ir::OpCode::Cat || b.op != ir::OpCode::Cat || a.shape != n.shape ||
      b.shape != n.shape || a.dtype != n.dtype || b.dtype != n.dtype ||
      a.attr<ir::DimAttrs>().dim != b.attr<ir::DimAttrs>().dim)
    return false;
  const int64_t dim = a.attr<ir::DimAttrs>().dim;
  std::vector<Piece> pieces;
  cat_pieces(a, pieces);
  cat_pieces(b, pieces);
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& x, const Piece& y) { return x.off < y.off; });
  for (size_t i = 1; i < pieces.size(); ++i)
    if (pieces[i].off < pieces[i - 1].off + pieces[i - 1].len) return false;  // overlap: a sum
  std::vector<ir::NodePtr> inputs;
  int64_t off = 0;
  auto gap = [&](int64_t to) {
    if (to <= off) return;
    Shape s = n.shape;
    s[dim] = to - off;
    auto z = ir::Node::make(ir::OpCode::Full, ir::FullAttrs{0.0}, {});
    z->shape = s;
    z->dtype = n.dtype;
    z->device = n.device;
    z->trace_id = n.trace_id;
    fills.push_back(z);
    inputs.push_back(z);
  };
  for (auto& p : pieces) {
    gap(p.off);
    inputs.push_back(p.node);
    off = p.off + p.len;
  }
  gap(n.shape[dim]);
  if (inputs.size() == 1) return false;  // both all zeros: leave it
  n.op = ir::OpCode::Cat;
  n.attrs = ir::DimAttrs{dim};
  n.inputs = std::move(inputs);
  return true;
}

// Turns `n` into op(inputs) with `attrs` (taken by value: they may belong to one of n's old
// inputs, which the new input list may drop).
void rewrite_as(ir::Node& n, ir::OpCode op, ir::Attrs attrs, std::vector<ir::NodePtr> inputs) {
  n.op = op;
  n.attrs = std::move(attrs);
  n.inputs = std::move(inputs);
}

// add(A, index_add(0, dim, i, s)) -> index_add(A, dim, i, s) (either operand order): the
// gradient of a tied embedding (a scatter into zeros) added to the head's gradient scatters
// straight into it, instead of zero-filling, scattering and adding full-size tensors. With no
// repeated index the sums are the same (0 + s = s exactly); rows an index repeats add their
// pieces onto A one after another instead of summing them first (fp32 rounding of a sum in
// another order). Rewrites `n` in place.
bool scatter_into_addend(ir::Node& n) {
  if (n.op != ir::OpCode::Add || n.inputs.size() != 2) return false;
  for (int k = 0; k < 2; ++k) {
    const auto& x = *n.inputs[k];
    const auto& other = n.inputs[1 - k];
    if (x.op != ir::OpCode::IndexAdd || !is_zero_fill(*x.inputs[0]) || x.shape != n.shape ||
        other->shape != n.shape || x.dtype != n.dtype || other->dtype != n.dtype ||
        x.device != n.device || other->device != n.device)
      continue;
    rewrite_as(n, ir::OpCode::IndexAdd, x.attrs, {other, x.inputs[1], x.inputs[2]});
    return true;
  }
  return false;
}

// log_softmax_grad(nll_loss_grad(g, t), y) -> cross_entropy_grad(y, g, t) with the class dim
// last (rank 1 or 2), where the device has the kernel: cross-entropy's backward then writes no
// [rows, classes] sparse gradient (and may run in the log-probs' bytes). Bitwise the same
// result (see cpu_CrossEntropyGrad). Rewrites `n` in place.
bool fold_cross_entropy_grad(ir::Node& n) {
  if (n.op != ir::OpCode::LogSoftmaxGrad || n.inputs.size() != 2) return false;
  const auto& g = *n.inputs[0];
  const auto& y = n.inputs[1];
  const int64_t rank = static_cast<int64_t>(y->shape.size());
  if (g.op != ir::OpCode::NllLossGrad || (rank != 1 && rank != 2) ||
      n.attr<ir::DimAttrs>().dim != rank - 1 || g.shape != y->shape || g.dtype != y->dtype ||
      g.device != n.device || y->device != n.device ||
      !ir::device_backend(n.device).supports(ir::OpCode::CrossEntropyGrad, n.dtype))
    return false;
  rewrite_as(n, ir::OpCode::CrossEntropyGrad, g.attrs, {y, g.inputs[0], g.inputs[1]});
  return true;
}

class Simplify : public Pass {
 public:
  const char* name() const override { return "simplify"; }
  bool run(Graph& g) override {
    std::unordered_map<ir::Node*, ir::NodePtr> repl;
    std::unordered_map<ir::Node*, std::vector<ir::NodePtr>> fills;  // new nodes before a node
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
        case ir::OpCode::LogSoftmaxGrad:
          changed = fold_cross_entropy_grad(*n) || changed;
          break;
        case ir::OpCode::Add: {
          std::vector<ir::NodePtr> f;
          if (merge_padded_cats(*n, f)) {
            fills[n.get()] = std::move(f);
            changed = true;
          } else if (scatter_into_addend(*n)) {
            changed = true;
          }
          break;
        }
        default:
          break;
      }
    }
    if (!changed) return false;
    if (!fills.empty()) {
      std::vector<ir::NodePtr> nodes;
      for (auto& n : g.nodes) {
        auto it = fills.find(n.get());
        if (it != fills.end()) nodes.insert(nodes.end(), it->second.begin(), it->second.end());
        nodes.push_back(n);
      }
      g.nodes.swap(nodes);
    }
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
