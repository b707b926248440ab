// Reverse-mode autodiff over the node graph. The same walk serves eager mode (gradient ops run
// at once) and traced mode (they are recorded into the step's graph).
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "amp/autocast_state.h"
#include "core/internal.h"
#include "ir/device.h"
#include "ops/vjp.h"
#include "runtime/trace_context.h"

namespace cstorch {

namespace {

// Accumulates `g` into the .grad of the leaf that owns node `n`.
void accumulate_leaf(const std::shared_ptr<TensorImpl>& leaf, const Tensor& g_in) {
  Tensor g = g_in;
  if (g.dtype() != leaf->node->dtype) g = cast(g, leaf->node->dtype);
  if (!leaf->grad) {
    if (detail::in_trace()) {
      // A fresh handle: the value is the traced node (made persistent when the trace ends).
      leaf->grad = make_tensor(g.node()).impl_ptr();
    } else {
      // Own storage: the same gradient node may flow to several leaves.
      auto n = g.node();
      const ir::Node& src = detail::value_node(g, "backward");
      auto buf = ir::Buffer::alloc(n->nbytes(), src.buffer->device);
      ir::copy_between(src.buffer->device, buf->data, src.buffer->device, src.buffer->data,
                       n->nbytes());
      leaf->grad = make_tensor(detail::make_constant_node(buf, n->shape, n->dtype)).impl_ptr();
    }
    return;
  }
  Tensor acc(leaf->grad);
  detail::assign_inplace(acc, add(acc, g), "grad accumulation");
}

}  // namespace

namespace detail {

void backward_from(const std::vector<ir::NodePtr>& roots, const std::vector<Tensor>& root_grads,
                   const std::unordered_map<ir::Node*, size_t>* capture,
                   std::vector<Tensor>* captured, uint32_t fence) {
  NoGradGuard no_grad;           // gradient ops themselves build no history (create_graph=false)
  amp::detail::Off no_autocast;  // gradients keep the dtypes of the forward values
  auto is_captured = [&](ir::Node* n) { return capture && capture->count(n) != 0; };

  // Topological order of the nodes that require grad (iterative DFS, post-order; one root
  // after the other, so a root reached from another one still comes before it).
  std::vector<ir::Node*> order;
  std::unordered_set<ir::Node*> seen;
  for (const auto& root : roots) {
    if (!seen.insert(root.get()).second) continue;
    std::vector<std::pair<ir::Node*, size_t>> stack{{root.get(), 0}};
    while (!stack.empty()) {
      auto& [n, i] = stack.back();
      if (!n->leaf.expired() || i >= n->inputs.size() || is_captured(n)) {
        order.push_back(n);
        stack.pop_back();
        continue;
      }
      ir::Node* c = n->inputs[i++].get();
      if (!c->requires_grad || !seen.insert(c).second) continue;
      if (fence != 0 && c->id < fence && !is_captured(c))
        fail(
            "checkpoint: the recomputed function read a tensor that requires grad (op '{}', "
            "node %{}, shape {}) which its first run did not read; a checkpointed function must "
            "compute the same thing every time it is called",
            c->name(), c->id, shape_str(c->shape));
      stack.push_back({c, 0});
    }
  }

  std::unordered_map<ir::Node*, Tensor> grads;
  std::unordered_map<ir::Node*, ir::NodePtr> owners;  // shared ownership for wrapping
  for (size_t r = 0; r < roots.size(); ++r) {
    auto& slot = grads[roots[r].get()];
    slot = slot.defined() ? add(slot, root_grads[r]) : root_grads[r];
    owners[roots[r].get()] = roots[r];
  }
  for (auto* n : order)
    for (auto& in : n->inputs) owners.emplace(in.get(), in);

  // The outputs of one checkpoint call are differentiated together (one re-run, one pass
  // through it) when the first of them in `order` is reached: every consumer of each of them
  // comes later in `order`, so by then all their gradients are complete.
  std::unordered_map<const void*, std::vector<ir::Node*>> recompute_groups;
  for (auto* n : order)
    if (n->op == ir::OpCode::Recompute)
      recompute_groups[n->attr<ir::RecomputeAttrs>().scope.get()].push_back(n);

  auto add_input_grads = [&](ir::Node* n, const std::vector<Tensor>& gi) {
    for (size_t i = 0; i < n->inputs.size() && i < gi.size(); ++i) {
      ir::Node* in = n->inputs[i].get();
      if (!in->requires_grad || !gi[i].defined()) continue;
      CS_CHECK(gi[i].shape() == in->shape,
               "backward(): gradient rule of '{}' returned shape {} for input {} of shape {}",
               n->name(), shape_str(gi[i].shape()), i, shape_str(in->shape));
      auto& slot = grads[in];
      slot = slot.defined() ? add(slot, gi[i]) : gi[i];
    }
  };

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    ir::Node* n = *it;
    if (n->op == ir::OpCode::Recompute && !is_captured(n)) {
      const auto& group = recompute_groups[n->attr<ir::RecomputeAttrs>().scope.get()];
      if (group.front() != n) continue;  // its gradient waits for the group
      std::vector<ir::NodePtr> outs;
      std::vector<Tensor> gs;
      for (auto* m : group) {
        auto git = grads.find(m);
        if (git == grads.end()) continue;
        outs.push_back(owners[m]);
        gs.push_back(git->second);
        grads.erase(git);
      }
      if (outs.empty()) continue;
      // All outputs share the inputs after the value: their gradients come back once.
      add_input_grads(n, recompute_vjp(outs, gs));
      continue;
    }
    auto git = grads.find(n);
    if (git == grads.end()) continue;
    Tensor g = git->second;
    grads.erase(git);
    if (capture) {
      auto cit = capture->find(n);
      if (cit != capture->end()) {
        auto& slot = (*captured)[cit->second];
        slot = slot.defined() ? add(slot, g) : g;
        continue;
      }
    }
    if (auto leaf = n->leaf.lock()) {
      accumulate_leaf(leaf, g);
      // The gradient this backward leaves on the parameter: what data-parallel replicas
      // average (the compiler's gradient all-reduce pass).
      if (auto* ctx = runtime::TraceContext::current())
        ctx->note_gradient(ctx->resolve(leaf->grad));
      continue;
    }
    if (n->inputs.empty()) continue;
    auto vjp = ops::vjp_of(n->op);
    CS_CHECK(vjp != nullptr, "backward(): op '{}' has no gradient rule in this build", n->name());
    ops::VjpArgs args{*n, {}, make_tensor(owners[n]), g, {}};
    for (auto& in : n->inputs) {
      args.inputs.push_back(make_tensor(in));
      args.needs.push_back(in->requires_grad);
    }
    add_input_grads(n, vjp(args));
  }
}

}  // namespace detail

void Tensor::backward(const Tensor& grad_in) const {
  CS_CHECK(defined(), "backward(): tensor is undefined");
  CS_CHECK(requires_grad(),
           "backward(): the tensor does not require grad (no input of the computation that "
           "produced it requires grad, or it was computed under NoGradGuard)");
  Tensor root_grad = grad_in;
  if (!root_grad.defined()) {
    CS_CHECK(numel() == 1,
             "backward(): a gradient must be given for a non-scalar tensor of shape {}",
             shape_str(shape()));
    root_grad = ones(shape(), dtype(), device());
  } else {
    CS_CHECK(root_grad.shape() == shape(), "backward(): gradient shape {} does not match {}",
             shape_str(root_grad.shape()), shape_str(shape()));
  }
  auto* ctx = runtime::TraceContext::current();
  detail::backward_from({ctx ? ctx->resolve(impl_ptr()) : impl()->node}, {root_grad});
}

}  // namespace cstorch
