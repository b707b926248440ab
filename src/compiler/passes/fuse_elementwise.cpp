// Elementwise fusion: maximal groups of elementwise ops of one output shape, whose intermediate
// values have no consumer outside the group, become one Fused node running the group's ops as a
// program (FusedAttrs) over blocks of elements, so the chain reads its inputs and writes its
// output once instead of once per op.
//
// A group has one output (its root). It grows from the root towards its inputs: a producer
// joins when it is fusable, has the root's shape, is not itself a step output or state write,
// and every one of its consumers is already in the group. So a value with a second consumer
// outside (e.g. AdamW's new m, written to state and read by the parameter update) ends a group
// and starts another: that costs one extra write and read of the shared value, but no
// recomputation, and the state write keeps its in-place placement. A last step
// (fold_state_updates, below) then joins such a state update into its single reader as a
// second result stored in place, so an optimizer passes over each state once. Because all consumers
// of a non-root member are inside the group, no path leaves the group and comes back, so replacing
// it by one node keeps the graph acyclic.
//
// Fusable ops: f32 arithmetic and math (the instruction set of src/backend/cpu/fused.cpp), and
// bool-valued comparisons, logical ops and casts inside a group (the root must be f32). External
// inputs may be f32 or bool, of the output's shape or broadcast in the (i / div) % mod form of
// ir::fused_operand (single elements, rows, columns). The kernel applies the same per-element
// float operations as the unfused kernels, in the same order, so results are bitwise equal.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "compiler/graph.h"
#include "ir/device.h"
#include "ir/fused.h"

namespace cstorch::compiler {
namespace {

using ir::OpCode;

bool all_dtype(const ir::Node& n, DType t) {
  for (auto& in : n.inputs)
    if (in->dtype != t) return false;
  return true;
}

// Whether the fused kernel implements this node exactly: an op of its instruction set
// (the kFusable trait, as the node's backend answers DeviceBackend::fuses) with the dtypes the
// kernel reads and writes.
bool fusable_op(const ir::Node& n) {
  const auto& backend = ir::device_backend(n.device);
  if (!backend.fuses(n.op) || !backend.kernel(OpCode::Fused)) return false;
  const bool f32 = n.dtype == DType::f32;
  const bool bool_out = n.dtype == DType::boolean;
  switch (n.op) {
    case OpCode::Copy:
      return (f32 || bool_out) && all_dtype(n, n.dtype);
    case OpCode::Where:
      return f32 && n.inputs[0]->dtype == DType::boolean && n.inputs[1]->dtype == DType::f32 &&
             n.inputs[2]->dtype == DType::f32;
    case OpCode::Cast:
      return (f32 || bool_out) &&
             (n.inputs[0]->dtype == DType::f32 || n.inputs[0]->dtype == DType::boolean);
    case OpCode::Eq:
    case OpCode::Ne:
    case OpCode::Lt:
    case OpCode::Le:
    case OpCode::Gt:
    case OpCode::Ge:
    case OpCode::LogicalAnd:
    case OpCode::LogicalOr:
    case OpCode::LogicalXor:
    case OpCode::LogicalNot:
      return bool_out && (all_dtype(n, DType::f32) || all_dtype(n, DType::boolean));
    default:  // arithmetic and math: f32 in, f32 out
      return f32 && all_dtype(n, DType::f32);
  }
}

// Fusable with every input readable in the kernel's broadcast form against the node's shape.
bool fusable(const ir::Node& n) {
  if (n.inputs.empty() || n.inputs.size() > 3 || !fusable_op(n)) return false;
  for (auto& in : n.inputs) {
    ir::FusedOperand op;
    if (!ir::fused_operand(in->shape, n.shape, op)) return false;
  }
  return true;
}

bool instr_flag(const ir::Node& n) {
  switch (n.op) {
    case OpCode::Gelu:
    case OpCode::GeluGrad:
      return n.attr<ir::GeluAttrs>().tanh_approx;
    case OpCode::Pow:  // the unfused kernel's condition for its exact scalar-exponent forms
      return n.inputs[1]->numel() == 1 && n.inputs[0]->numel() == n.numel();
    case OpCode::Cast:
      return n.dtype == DType::boolean;
    default:
      return false;
  }
}

// One pass over an optimizer's state: a Fused node G that is a state's new value (computed from
// that state's old value X, read by one other node F, a Fused node of the same shape) joins
// F's program, and F also stores G's result into X's buffer (FusedAttrs::stores): the state's
// new value becomes After(X, F). AdamW's first and second moments thus join the parameter
// update, and each step reads and writes every parameter's state once instead of writing the
// moments, reading them back and writing the parameter. Safe when nothing reads X after F (every
// other reader of X precedes F in the node order, which is the execution order) and X is no
// root; F's element i reads X's element i before the store writes it (the kernel stores after
// each block's last instruction). Results are bitwise those of the separate nodes: the same
// instructions on the same values.
bool fold_state_updates(Graph& g) {
  std::unordered_map<const ir::Node*, size_t> pos;
  std::unordered_map<const ir::Node*, std::vector<size_t>> readers;
  std::unordered_set<const ir::Node*> roots;
  std::unordered_map<const ir::Node*, StateSlot*> slot_of_write;
  auto index = [&] {
    pos.clear();
    readers.clear();
    for (size_t i = 0; i < g.nodes.size(); ++i) {
      pos[g.nodes[i].get()] = i;
      for (auto& in : g.nodes[i]->inputs) readers[in.get()].push_back(i);
    }
  };
  index();
  for (auto& o : g.outputs) roots.insert(o.get());
  for (auto& k : g.keep) roots.insert(k.get());
  for (auto& st : g.state)
    if (st.write) slot_of_write[st.write.get()] = &st;
  bool changed = false;
  std::vector<ir::NodePtr> afters;  // (inserted after their Fused node)
  std::unordered_set<const ir::Node*> removed;
  for (auto& f : g.nodes) {
    if (f->op != OpCode::Fused || removed.count(f.get())) continue;
    for (bool again = true; again;) {
      again = false;
      auto& fa = std::get<ir::FusedAttrs>(f->attrs);
      for (size_t j = 0; j < f->inputs.size(); ++j) {
        const ir::NodePtr gnode = f->inputs[j];
        if (gnode->op != OpCode::Fused || gnode->shape != f->shape || gnode->device != f->device ||
            roots.count(gnode.get()))
          continue;
        auto sw = slot_of_write.find(gnode.get());
        if (sw == slot_of_write.end() || !sw->second->input) continue;
        const ir::NodePtr x = sw->second->input;
        const auto& ga = gnode->attr<ir::FusedAttrs>();
        // G is read by F alone (once), X is one of G's inputs, f32 of the output's shape.
        const auto& rg = readers[gnode.get()];
        if (rg.size() != 1 || !ga.stores.empty() || x->dtype != DType::f32 ||
            x->shape != f->shape || roots.count(x.get()) ||
            std::find(gnode->inputs.begin(), gnode->inputs.end(), x) == gnode->inputs.end())
          continue;
        const size_t at_f = pos.at(f.get()), at_g = pos.at(gnode.get());
        const auto& rx = readers[x.get()];
        if (std::any_of(rx.begin(), rx.end(), [&](size_t r) { return r != at_g && r >= at_f; }))
          continue;
        // The merged program: F's inputs but G, then G's inputs not among them; G's code, then
        // F's. Register budget as the kernel's.
        std::vector<ir::NodePtr> inputs;
        for (size_t k = 0; k < f->inputs.size(); ++k)
          if (k != j) inputs.push_back(f->inputs[k]);
        for (auto& in : gnode->inputs)
          if (std::find(inputs.begin(), inputs.end(), in) == inputs.end()) inputs.push_back(in);
        const size_t ni = inputs.size();
        if (ni + ga.code.size() + fa.code.size() > static_cast<size_t>(ir::kMaxFusedRegs)) continue;
        auto input_reg = [&](const ir::NodePtr& in) {
          return static_cast<uint16_t>(std::find(inputs.begin(), inputs.end(), in) -
                                       inputs.begin());
        };
        ir::FusedAttrs merged;
        merged.shape = fa.shape;
        const size_t gi = gnode->inputs.size(), fi = f->inputs.size();
        for (const auto& ins : ga.code) {
          ir::FusedInstr c = ins;
          for (int a = 0; a < c.nargs; ++a)
            c.args[a] = c.args[a] < gi ? input_reg(gnode->inputs[c.args[a]])
                                       : static_cast<uint16_t>(ni + (c.args[a] - gi));
          merged.code.push_back(c);
        }
        const uint16_t g_result = static_cast<uint16_t>(ni + ga.code.size() - 1);
        for (const auto& ins : fa.code) {
          ir::FusedInstr c = ins;
          for (int a = 0; a < c.nargs; ++a) {
            const uint16_t r = c.args[a];
            if (r == j)
              c.args[a] = g_result;
            else if (r < fi)
              c.args[a] = input_reg(f->inputs[r]);
            else
              c.args[a] = static_cast<uint16_t>(ni + ga.code.size() + (r - fi));
          }
          merged.code.push_back(c);
        }
        for (const auto& st : fa.stores)
          merged.stores.push_back({st.reg < fi
                                       ? input_reg(f->inputs[st.reg])
                                       : static_cast<uint16_t>(ni + ga.code.size() + (st.reg - fi)),
                                   input_reg(f->inputs[st.input])});
        merged.stores.push_back({g_result, input_reg(x)});
        f->inputs = std::move(inputs);
        f->attrs = std::move(merged);
        // X's new value: its storage once F has run.
        auto after = ir::Node::make(OpCode::After, ir::NoAttrs{}, {x, f});
        after->device = x->device;
        ir::op_info(OpCode::After).infer(*after);
        after->trace_id = gnode->trace_id;
        sw->second->write = after;
        slot_of_write.erase(sw);
        afters.push_back(after);
        removed.insert(gnode.get());
        changed = true;
        again = true;
        index();  // F's inputs changed
        break;
      }
    }
  }
  if (!changed) return false;
  std::vector<ir::NodePtr> nodes;
  for (auto& n : g.nodes) {
    if (removed.count(n.get())) continue;
    nodes.push_back(n);
    for (auto& a : afters)
      if (a->inputs[1] == n) nodes.push_back(a);
  }
  g.nodes.swap(nodes);
  return true;
}

class FuseElementwise : public Pass {
 public:
  const char* name() const override { return "fuse_elementwise"; }
  bool run(Graph& g) override {
    const size_t n = g.nodes.size();
    std::unordered_map<const ir::Node*, size_t> pos;
    for (size_t i = 0; i < n; ++i) pos[g.nodes[i].get()] = i;
    std::vector<std::vector<size_t>> consumers(n);
    std::vector<bool> is_root(n, false);
    for (size_t i = 0; i < n; ++i)
      for (auto& in : g.nodes[i]->inputs) consumers[pos.at(in.get())].push_back(i);
    for (auto& o : g.outputs) is_root[pos.at(o.get())] = true;
    for (auto& s : g.state)
      if (s.write) is_root[pos.at(s.write.get())] = true;
    for (auto& k : g.keep)
      if (auto it = pos.find(k.get()); it != pos.end()) is_root[it->second] = true;
    std::vector<char> ok(n);
    for (size_t i = 0; i < n; ++i) ok[i] = fusable(*g.nodes[i]);

    std::vector<int> group(n, -1);  // group id of each member
    std::unordered_map<ir::Node*, ir::NodePtr> repl;
    std::unordered_map<size_t, ir::NodePtr> fused_at;  // root position -> its Fused node
    int groups = 0;
    for (size_t r = n; r-- > 0;) {
      const ir::Node& root = *g.nodes[r];
      if (!ok[r] || group[r] >= 0 || root.dtype != DType::f32) continue;
      const int gid = groups++;
      std::vector<size_t> members{r};
      group[r] = gid;
      size_t ext_inputs = root.inputs.size();
      // Grow to a fixpoint: a producer joins once all its consumers are members.
      for (bool grew = true; grew;) {
        grew = false;
        for (size_t mi = 0; mi < members.size(); ++mi) {
          for (auto& in : g.nodes[members[mi]]->inputs) {
            size_t p = pos.at(in.get());
            if (!ok[p] || group[p] >= 0 || is_root[p] || in->shape != root.shape ||
                in->device != root.device)
              continue;
            bool inside = true;
            for (size_t c : consumers[p]) inside = inside && group[c] == gid;
            if (!inside) continue;
            // Registers: members + distinct external inputs stay within the kernel's limit
            // (counted loosely: every input edge of a new member as a potential register).
            if (members.size() + 1 + ext_inputs + in->inputs.size() >
                static_cast<size_t>(ir::kMaxFusedRegs))
              continue;
            group[p] = gid;
            members.push_back(p);
            ext_inputs += in->inputs.size();
            grew = true;
          }
        }
      }
      if (members.size() < 2) {
        group[r] = -2;  // stays a plain node
        continue;
      }
      std::sort(members.begin(), members.end());
      // Registers: external inputs first (in order of first use), then one per member.
      std::vector<ir::NodePtr> inputs;
      std::unordered_map<const ir::Node*, uint16_t> reg;
      for (size_t m : members)
        for (auto& in : g.nodes[m]->inputs) {
          size_t p = pos.at(in.get());
          if (group[p] == gid || reg.count(in.get())) continue;
          reg[in.get()] = static_cast<uint16_t>(inputs.size());
          inputs.push_back(in);
        }
      ir::FusedAttrs attrs;
      attrs.shape = root.shape;
      for (size_t m : members) {
        const ir::Node& node = *g.nodes[m];
        ir::FusedInstr ins;
        ins.op = static_cast<uint16_t>(node.op);
        ins.nargs = static_cast<uint8_t>(node.inputs.size());
        ins.flag = instr_flag(node);
        for (size_t a = 0; a < node.inputs.size(); ++a) ins.args[a] = reg.at(node.inputs[a].get());
        reg[&node] = static_cast<uint16_t>(inputs.size() + attrs.code.size());
        attrs.code.push_back(ins);
      }
      auto f = ir::Node::make(OpCode::Fused, std::move(attrs), std::move(inputs));
      f->device = root.device;
      ir::op_info(OpCode::Fused).infer(*f);
      f->trace_id = root.trace_id;
      repl[g.nodes[r].get()] = f;
      fused_at[r] = f;
    }
    if (repl.empty()) return false;
    std::vector<ir::NodePtr> kept;
    kept.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      auto it = fused_at.find(i);
      if (it != fused_at.end())
        kept.push_back(it->second);
      else if (group[i] < 0)
        kept.push_back(g.nodes[i]);
    }
    g.nodes.swap(kept);
    g.replace_uses(repl);
    fold_state_updates(g);
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_elementwise_pass() {
  return std::make_unique<FuseElementwise>();
}

}  // namespace cstorch::compiler
