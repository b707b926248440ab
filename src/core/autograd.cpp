// Reverse-mode autodiff over the node graph. The same walk serves eager mode (gradient ops run
// at once) and traced mode (they are recorded into the step's graph).
#include <cstring>
#include <unordered_map>
#include <unordered_set>

#include "amp/autocast_state.h"
#include "core/internal.h"
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
      auto buf = ir::Buffer::alloc(n->nbytes());
      std::memcpy(buf->data, detail::host_data(g, "backward"), n->nbytes());
      leaf->grad = make_tensor(detail::make_constant_node(buf, n->shape, n->dtype)).impl_ptr();
    }
    return;
  }
  Tensor acc(leaf->grad);
  detail::assign_inplace(acc, add(acc, g), "grad accumulation");
}

}  // namespace

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
    root_grad = ones(shape(), dtype());
  } else {
    CS_CHECK(root_grad.shape() == shape(), "backward(): gradient shape {} does not match {}",
             shape_str(root_grad.shape()), shape_str(shape()));
  }
  NoGradGuard no_grad;           // gradient ops themselves build no history (create_graph=false)
  amp::detail::Off no_autocast;  // gradients keep the dtypes of the forward values

  auto* ctx = runtime::TraceContext::current();
  ir::NodePtr root = ctx ? ctx->resolve(impl_ptr()) : impl()->node;

  // Topological order of the nodes that require grad (iterative DFS, post-order).
  std::vector<ir::Node*> order;
  std::unordered_set<ir::Node*> seen;
  std::vector<std::pair<ir::Node*, size_t>> stack{{root.get(), 0}};
  seen.insert(root.get());
  while (!stack.empty()) {
    auto& [n, i] = stack.back();
    if (!n->leaf.expired() || i >= n->inputs.size()) {
      order.push_back(n);
      stack.pop_back();
      continue;
    }
    ir::Node* c = n->inputs[i++].get();
    if (c->requires_grad && seen.insert(c).second) stack.push_back({c, 0});
  }

  std::unordered_map<ir::Node*, Tensor> grads;
  std::unordered_map<ir::Node*, ir::NodePtr> owners;  // shared ownership for wrapping
  grads[root.get()] = root_grad;
  owners[root.get()] = root;
  for (auto* n : order)
    for (auto& in : n->inputs) owners.emplace(in.get(), in);

  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    ir::Node* n = *it;
    auto git = grads.find(n);
    if (git == grads.end()) continue;
    Tensor g = git->second;
    grads.erase(git);
    if (auto leaf = n->leaf.lock()) {
      accumulate_leaf(leaf, g);
      // The gradient this backward leaves on the parameter: what data-parallel replicas
      // average (the compiler's gradient all-reduce pass).
      if (ctx) ctx->note_gradient(ctx->resolve(leaf->grad));
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
    auto gi = vjp(args);
    for (size_t i = 0; i < n->inputs.size() && i < gi.size(); ++i) {
      if (!args.needs[i] || !gi[i].defined()) continue;
      ir::Node* in = n->inputs[i].get();
      CS_CHECK(gi[i].shape() == in->shape,
               "backward(): gradient rule of '{}' returned shape {} for input {} of shape {}",
               n->name(), shape_str(gi[i].shape()), i, shape_str(in->shape));
      auto& slot = grads[in];
      slot = slot.defined() ? add(slot, gi[i]) : gi[i];
    }
  }
}

}  // namespace cstorch
