// Shared by the compiler tests: a body recorded into a Graph as a traced step would be, with its
// outputs and its state (reads, and writes where the body wrote); the count of a graph's nodes of
// one op.
#pragma once
#include <cstorch/cstorch.h>

#include "compiler/graph.h"
#include "runtime/trace_context.h"

namespace cstorch::testing {

struct RecordInput {
  Shape shape;
  DType dtype = DType::f32;
};

// Runs `body(inputs)` on batch placeholders of the given shapes and dtypes inside a trace
// context and returns the graph: the tensors it returns as outputs, every captured state tensor
// as a slot, with its new value as the slot's write where the body wrote one.
template <class F>
compiler::Graph record(const std::vector<RecordInput>& ins, F body) {
  compiler::Graph g;
  runtime::TraceContext ctx;
  std::vector<Tensor> in;
  for (auto& s : ins) in.push_back(ctx.add_batch_input(s.shape, s.dtype));
  std::vector<Tensor> outs = body(in);
  for (auto& o : outs) g.outputs.push_back(ctx.resolve(o.impl_ptr()));
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

// The nodes of `g` that run `op`.
inline size_t count_nodes(const compiler::Graph& g, ir::OpCode op) {
  size_t c = 0;
  for (auto& n : g.nodes) c += n->op == op;
  return c;
}

// One training step: `body(x)` on an f32 batch of `shape`, its loss as the output.
template <class F>
compiler::Graph record_step(const Shape& shape, F body) {
  return record({{shape}},
                [&](std::vector<Tensor>& in) { return std::vector<Tensor>{body(in[0])}; });
}

}  // namespace cstorch::testing
