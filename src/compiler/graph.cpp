// Graph utilities: use rewriting, pruning, verification and text / Graphviz dumps.
#include "compiler/graph.h"

#include <sstream>
#include <unordered_set>

#include "ops/vjp.h"

namespace cstorch::compiler {

void Graph::replace_uses(const std::unordered_map<ir::Node*, ir::NodePtr>& repl) {
  if (repl.empty()) return;
  auto fix = [&](ir::NodePtr& p) {
    if (!p) return;
    for (int guard = 0; guard < 64; ++guard) {  // follow chains a -> b -> c
      auto it = repl.find(p.get());
      if (it == repl.end()) return;
      p = it->second;
    }
  };
  for (auto& n : nodes)
    for (auto& in : n->inputs) fix(in);
  for (auto& o : outputs) fix(o);
  for (auto& s : state) fix(s.write);
  for (auto& g : gradients) fix(g);
  for (auto& k : keep) fix(k);
}

size_t Graph::prune() {
  std::unordered_set<ir::Node*> live;
  std::vector<ir::Node*> stack;
  auto mark = [&](const ir::NodePtr& n) {
    if (n && live.insert(n.get()).second) stack.push_back(n.get());
  };
  for (auto& o : outputs) mark(o);
  for (auto& s : state) mark(s.write);
  for (auto& k : keep) mark(k);
  while (!stack.empty()) {
    auto* n = stack.back();
    stack.pop_back();
    for (auto& in : n->inputs) mark(in);
  }
  size_t before = nodes.size();
  std::vector<ir::NodePtr> kept;
  for (auto& n : nodes)
    if (live.count(n.get()) || (n->op == ir::OpCode::Input)) kept.push_back(n);
  nodes.swap(kept);
  return before - nodes.size();
}

size_t Graph::count_ops() const {
  size_t c = 0;
  for (auto& n : nodes)
    if (!has_trait(n->op, ir::kLeaf)) ++c;
  return c;
}

// "r2=mul(r0,r1) r3=exp(r2)": a Fused node's program; r0.. are its inputs, then one register
// per instruction (the last is the output).
static std::string fused_program_str(const ir::FusedAttrs& a, size_t num_inputs) {
  std::string s;
  for (size_t k = 0; k < a.code.size(); ++k) {
    const auto& i = a.code[k];
    s += fmt::format("{}r{}={}(", k ? " " : "", num_inputs + k,
                     ir::op_info(static_cast<ir::OpCode>(i.op)).name);
    for (int j = 0; j < i.nargs; ++j) s += fmt::format("{}r{}", j ? "," : "", i.args[j]);
    s += ")";
  }
  if (a.out != DType::f32) s += fmt::format(" stored as {}", dtype_name(a.out));
  return s;
}

std::string attrs_str(const ir::Node& n) {
  return std::visit(
      [&n](const auto& a) -> std::string {
        using A = std::decay_t<decltype(a)>;
        auto dims = [](const ir::Dims& d) { return shape_str(d); };
        if constexpr (std::is_same_v<A, ir::InputAttrs>)
          return fmt::format("{}#{}", a.kind == ir::InputKind::Batch ? "batch" : "state", a.index);
        else if constexpr (std::is_same_v<A, ir::FullAttrs>)
          return fmt::format("value={}", a.value);
        else if constexpr (std::is_same_v<A, ir::AxesAttrs>)
          return fmt::format("dims={} keepdim={}", dims(a.dims), a.keepdim);
        else if constexpr (std::is_same_v<A, ir::MatmulAttrs>)
          return fmt::format("trans_a={} trans_b={}{}", a.trans_a, a.trans_b,
                             a.f32_out ? " f32_out" : "");
        else if constexpr (std::is_same_v<A, ir::GemmAttrs>)
          return fmt::format(
              "trans_a={} trans_b={} bias={} addend={} relu={} relu_grad={} update={}{}", a.trans_a,
              a.trans_b, a.bias, a.addend, a.relu, a.relu_grad, a.update,
              !a.gelu_grad  ? ""
              : a.gelu_tanh ? " gelu_grad(tanh)"
                            : " gelu_grad");
        else if constexpr (std::is_same_v<A, ir::DimAttrs>)
          return fmt::format("dim={}", a.dim);
        else if constexpr (std::is_same_v<A, ir::ShapeAttrs>)
          return "shape=" + dims(a.shape);
        else if constexpr (std::is_same_v<A, ir::PermuteAttrs>)
          return "perm=" + dims(a.perm);
        else if constexpr (std::is_same_v<A, ir::SliceAttrs>)
          return fmt::format("dim={} {}:{}:{}", a.dim, a.start, a.end, a.step);
        else if constexpr (std::is_same_v<A, ir::LayerNormAttrs>)
          return fmt::format("dims={} eps={} weight={} bias={}", a.dims, a.eps, a.has_weight,
                             a.has_bias);
        else if constexpr (std::is_same_v<A, ir::FusedAttrs>)
          return fused_program_str(a, n.inputs.size());
        else
          return "";
      },
      n.attrs);
}

std::string Graph::dump() const {
  std::ostringstream os;
  for (auto& n : nodes) {
    os << "%" << n->id << " = " << n->name();
    std::string at = attrs_str(*n);
    if (!at.empty()) os << "{" << at << "}";
    os << "(";
    for (size_t i = 0; i < n->inputs.size(); ++i) os << (i ? ", " : "") << "%" << n->inputs[i]->id;
    os << ") : " << dtype_name(n->dtype) << shape_str(n->shape) << "\n";
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    os << "output " << i << " = %" << outputs[i]->id << "\n";
  for (size_t i = 0; i < state.size(); ++i)
    if (state[i].write) os << "state " << i << " <- %" << state[i].write->id << "\n";
  return os.str();
}

std::string Graph::dot() const {
  std::ostringstream os;
  os << "digraph step {\n  node [shape=box, fontname=monospace];\n";
  for (auto& n : nodes) {
    os << "  n" << n->id << " [label=\"%" << n->id << " " << n->name() << "\\n"
       << dtype_name(n->dtype) << shape_str(n->shape) << "\"];\n";
    for (auto& in : n->inputs) os << "  n" << in->id << " -> n" << n->id << ";\n";
  }
  for (size_t i = 0; i < outputs.size(); ++i)
    os << "  out" << i << " [shape=ellipse];\n  n" << outputs[i]->id << " -> out" << i << ";\n";
  for (size_t i = 0; i < state.size(); ++i)
    if (state[i].write)
      os << "  st" << i << " [shape=ellipse, label=\"state " << i << "\"];\n  n"
         << state[i].write->id << " -> st" << i << ";\n";
  os << "}\n";
  return os.str();
}

void verify(const Graph& g, const char* after) {
  std::unordered_set<ir::Node*> defined;
  for (auto& n : g.nodes) {
    for (auto& in : n->inputs)
      CS_CHECK(defined.count(in.get()),
               "graph verifier (after {}): node %{} ({}) uses %{} ({}) "
               "before it is defined",
               after, n->id, n->name(), in->id, in->name());
    if (!n->inputs.empty()) {  // creation ops and leaves carry their shape from construction
      ir::Node copy = *n;
      ir::op_info(n->op).infer(copy);
      CS_CHECK(copy.shape == n->shape && copy.dtype == n->dtype,
               "graph verifier (after {}): node %{} ({}) has {}{} but its inputs give {}{}", after,
               n->id, n->name(), dtype_name(n->dtype), shape_str(n->shape), dtype_name(copy.dtype),
               shape_str(copy.shape));
    }
    defined.insert(n.get());
  }
  for (auto& o : g.outputs)
    CS_CHECK(o && defined.count(o.get()),
             "graph verifier (after {}): an output is not in the graph", after);
  for (auto& s : g.state) {
    if (!s.write) continue;
    CS_CHECK(defined.count(s.write.get()),
             "graph verifier (after {}): a state write is not in the graph", after);
    CS_CHECK(s.write->shape == s.shape && s.write->dtype == s.dtype,
             "graph verifier (after {}): state write %{} has {}{} but the state is {}{}", after,
             s.write->id, dtype_name(s.write->dtype), shape_str(s.write->shape),
             dtype_name(s.dtype), shape_str(s.shape));
  }
}

}  // namespace cstorch::compiler
