// Shared by the compiler tests: one training step recorded into a Graph as a traced step would
// be, with its state writes (what the memory planner and the fusion passes see).
#pragma once
#include <cstorch/cstorch.h>

#include "compiler/graph.h"
#include "runtime/trace_context.h"

namespace cstorch::testing {

// Runs `body(x)` on a batch placeholder x of `shape` inside a trace context and returns the
// graph: the loss it returns as the output, every captured state tensor as a slot, with its new
// value as the slot's write where the step wrote one.
template <class F>
compiler::Graph record_step(const Shape& shape, F body) {
  compiler::Graph g;
  runtime::TraceContext ctx;
  auto x = ctx.add_batch_input(shape, DType::f32);
  Tensor loss = body(x);
  g.outputs.push_back(ctx.resolve(loss.impl_ptr()));
  for (auto& c : ctx.captures()) {
    compiler::StateSlot s{c.impl, c.input_node, nullptr, c.original->shape, c.original->dtype};
    if (c.impl->node != c.original && c.impl->node != c.input_node) s.write = c.impl->node;
    g.state.push_back(s);
    c.impl->node = c.original;
  }
  g.nodes = ctx.nodes();
  g.batch_inputs = ctx.batch_inputs();
  return g;
}

}  // namespace cstorch::testing
