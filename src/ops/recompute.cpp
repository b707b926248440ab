// Activation recomputation: cstorch::checkpoint and the two ops behind it.
//
// The forward pass runs the function under no-grad (so nothing it computes is kept for the
// backward pass) while dispatch records which outside tensors requiring grad it reads. Each
// floating output becomes a Recompute node: an alias of the value whose inputs are that value,
// the function's inputs and those outside tensors, so the backward pass routes gradients to
// them. Its gradient rule re-runs the function (grad on, the forward's autocast mode, the
// generator restored) on RecomputeBarrier aliases of the saved inputs and back-propagates
// through the re-run, stopping at the barriers and the outside tensors (their gradients are
// the rule's results). In a trace the re-run is recorded in the backward part of the graph;
// the barriers (kBarrier: CSE never merges them) make every re-run op that depends on an input
// differ from its forward twin, so CSE cannot merge the two and keep the activations alive.
#include <optional>
#include <unordered_set>

#include "amp/autocast_state.h"
#include "core/internal.h"
#include "cstorch/recompute.h"
#include "ops/vjp.h"
#include "runtime/trace_context.h"

namespace cstorch {

namespace ir {
struct RecomputeScope {
  CheckpointFn fn;
  size_t num_inputs = 0;
  size_t num_outputs = 0;
  std::vector<bool> out_defined;
  std::vector<Shape> out_shapes;
  std::vector<DType> out_dtypes;
  Tensor rng;                     // the generator state when the first run started
  std::optional<DType> autocast;  // the autocast mode of the first run
};
}  // namespace ir

namespace ops {

void infer_RecomputeBarrier(ir::Node& n) {
  CS_CHECK(n.inputs.size() == 1, "recompute_barrier: expected 1 input, got {}", n.inputs.size());
  n.shape = n.inputs[0]->shape;
  n.dtype = n.inputs[0]->dtype;
}
std::vector<Tensor> vjp_RecomputeBarrier(const VjpArgs& a) {
  return {a.grad};
}

void infer_Recompute(ir::Node& n) {
  CS_CHECK(!n.inputs.empty(), "recompute: expected the function's output as input 0");
  n.shape = n.inputs[0]->shape;
  n.dtype = n.inputs[0]->dtype;
}

// The backward pass differentiates the outputs of one call together (detail::recompute_vjp,
// called by the autodiff itself); this rule serves a lone output.
std::vector<Tensor> vjp_Recompute(const VjpArgs& a) {
  return detail::recompute_vjp({a.out.node()}, {a.grad});
}

}  // namespace ops

namespace detail {

std::vector<Tensor> recompute_vjp(const std::vector<ir::NodePtr>& outs,
                                  const std::vector<Tensor>& grads) {
  const ir::Node& first = *outs.at(0);
  auto scope = first.attr<ir::RecomputeAttrs>().scope;
  auto& s = *scope;
  const uint32_t fence = next_node_id();
  std::vector<Tensor> rerun;
  std::unordered_map<ir::Node*, size_t> capture;  // barrier / outside node -> input slot
  {
    GradModeGuard grad_on(true);
    struct RestoreAutocast {
      std::optional<DType> v;
      ~RestoreAutocast() { amp::detail::set_active(v); }
    } restore{amp::detail::active()};
    amp::detail::set_active(s.autocast);

    Tensor rng_now = rng_state();
    set_rng_state(s.rng);
    std::vector<Tensor> ins;
    for (size_t i = 0; i < s.num_inputs; ++i) {
      Tensor b =
          dispatch(ir::OpCode::RecomputeBarrier, ir::NoAttrs{}, {make_tensor(first.inputs[1 + i])});
      if (b.node()->requires_grad) capture.emplace(b.node().get(), 1 + i);
      ins.push_back(b);
    }
    for (size_t i = 1 + s.num_inputs; i < first.inputs.size(); ++i)
      capture.emplace(first.inputs[i].get(), i);
    rerun = s.fn(ins);
    set_rng_state(rng_now);
  }
  CS_CHECK(rerun.size() == s.num_outputs,
           "checkpoint: the recomputed function returned {} outputs, the first run {}",
           rerun.size(), s.num_outputs);
  for (size_t k = 0; k < rerun.size(); ++k) {
    CS_CHECK(rerun[k].defined() == s.out_defined[k],
             "checkpoint: output {} of the recomputed function is {}, in the first run it was {}",
             k, rerun[k].defined() ? "defined" : "undefined",
             s.out_defined[k] ? "defined" : "undefined");
    if (!rerun[k].defined()) continue;
    CS_CHECK(rerun[k].shape() == s.out_shapes[k] && rerun[k].dtype() == s.out_dtypes[k],
             "checkpoint: output {} of the recomputed function is {} {}, the first run gave {} {}",
             k, dtype_name(rerun[k].dtype()), shape_str(rerun[k].shape()),
             dtype_name(s.out_dtypes[k]), shape_str(s.out_shapes[k]));
  }
  std::vector<ir::NodePtr> roots;
  std::vector<Tensor> root_grads;
  for (size_t j = 0; j < outs.size(); ++j) {
    const Tensor& r = rerun[static_cast<size_t>(outs[j]->attr<ir::RecomputeAttrs>().index)];
    if (!r.node()->requires_grad) continue;  // does not depend on anything requiring grad
    roots.push_back(r.node());
    root_grads.push_back(grads[j]);
  }
  std::vector<Tensor> result(first.inputs.size());
  if (!roots.empty()) backward_from(roots, root_grads, &capture, &result, fence);
  return result;
}

}  // namespace detail

std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs) {
  CS_CHECK(static_cast<bool>(fn), "checkpoint: the function is empty");
  for (size_t i = 0; i < inputs.size(); ++i)
    CS_CHECK(inputs[i].defined(), "checkpoint: input {} is undefined", i);
  if (!is_grad_enabled()) return fn(inputs);

  auto scope = std::make_shared<ir::RecomputeScope>();
  scope->fn = fn;
  scope->num_inputs = inputs.size();
  scope->autocast = amp::detail::active();
  scope->rng = rng_state();

  detail::GradInputRecorder rec;
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    detail::RecordGradInputs recording(&rec);
    outs = fn(inputs);
  }
  scope->num_outputs = outs.size();
  for (auto& o : outs) {
    scope->out_defined.push_back(o.defined());
    scope->out_shapes.push_back(o.defined() ? o.shape() : Shape{});
    scope->out_dtypes.push_back(o.defined() ? o.dtype() : DType::f32);
  }

  // The wrapper inputs after the value: the function's inputs, then the outside tensors
  // requiring grad that it read and that are not among them.
  auto* ctx = runtime::TraceContext::current();
  std::vector<Tensor> extra;
  std::unordered_set<ir::Node*> given;
  bool any_grad = false;
  for (auto& t : inputs) {
    ir::NodePtr n = ctx ? ctx->resolve(t.impl_ptr()) : t.node();
    given.insert(n.get());
    any_grad = any_grad || n->requires_grad;
  }
  for (auto& n : rec.nodes)
    if (!given.count(n.get())) extra.push_back(make_tensor(n));
  if (!any_grad && extra.empty()) return outs;  // nothing to differentiate

  std::vector<Tensor> wrapper_inputs(1);
  wrapper_inputs.insert(wrapper_inputs.end(), inputs.begin(), inputs.end());
  wrapper_inputs.insert(wrapper_inputs.end(), extra.begin(), extra.end());
  for (size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].defined() || !is_floating(outs[k].dtype())) continue;
    wrapper_inputs[0] = outs[k];
    outs[k] = detail::dispatch(ir::OpCode::Recompute,
                               ir::RecomputeAttrs{scope, static_cast<int64_t>(k)}, wrapper_inputs);
  }
  return outs;
}

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  CS_CHECK(static_cast<bool>(fn), "checkpoint: the function is empty");
  return checkpoint([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in[0])}; },
                    std::vector<Tensor>{input})[0];
}

}  // namespace cstorch
