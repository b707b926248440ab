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
// recomputation, and the state write keeps its in-place placement. Because all consumers of a
// non-root member are inside the group, no path leaves the group and comes back, so replacing
// it by one node keeps the graph acyclic. Groups need two ops, except a large state write,
// which becomes a one-instruction program so that it can run in its optimizer's one-pass group.
//
// Fusable ops: f32 arithmetic and math (the instruction set of src/backend/cpu/fused.cpp), and
// bool-valued comparisons, logical ops and casts inside a group (the root must be f32, or a
// cast of f32 to bf16 on a backend whose Fused kernel stores bf16: the program then ends in a
// copy stored rounded, FusedAttrs::out), and casts of bf16 to f32 on a backend whose Fused
// kernel reads bf16 (the cast's bf16 input is then an external input). External
// inputs may be f32, bool or bf16, of the output's shape or broadcast in the (i / div) % mod form
// of ir::fused_operand (single elements, rows, columns). The kernel applies the same per-element
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
      // A bf16 input is always external (members compute f32 or bool): the kernel widens it.
      return (f32 || bool_out) &&
             (n.inputs[0]->dtype == DType::f32 || n.inputs[0]->dtype == DType::boolean ||
              (f32 && n.inputs[0]->dtype == DType::bf16 && backend.fused_reads_bf16()));
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

// A cast of f32 to bf16 that may end a Fused program as its stored result.
bool narrowing_root(const ir::Node& n) {
  ir::FusedOperand op;
  return n.op == OpCode::Cast && n.dtype == DType::bf16 && n.inputs[0]->dtype == DType::f32 &&
         ir::device_backend(n.device).fused_stores_bf16() &&
         ir::device_backend(n.device).kernel(OpCode::Fused) &&
         ir::fused_operand(n.inputs[0]->shape, n.shape, op);
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
    std::vector<bool> state_write(n, false);
    for (auto& s : g.state)
      if (s.write) is_root[pos.at(s.write.get())] = state_write[pos.at(s.write.get())] = true;
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
      const bool narrow = narrowing_root(root);
      if (!(ok[r] && root.dtype == DType::f32) && !narrow) continue;
      if (group[r] >= 0) continue;
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
      // A lone op stays a plain node, except a large state write on a backend that runs groups of
      // Fused nodes as one pass (Program::plan_groups): as a one-instruction program it can join
      // its neighbours' pass (Adagrad's sum, amsgrad's maximum, Adadelta's parameter update).
      if (members.size() < 2 && !(state_write[r] && root.numel() >= ir::kMinFusedGroupElements &&
                                  ir::device_backend(root.device).fused_group_kernel())) {
        group[r] = -2;
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
      if (narrow) attrs.out = DType::bf16;
      for (size_t m : members) {
        const ir::Node& node = *g.nodes[m];
        ir::FusedInstr ins;
        // The narrowing root computes its input's value; the kernel rounds it when storing.
        ins.op = static_cast<uint16_t>(narrow && m == r ? OpCode::Copy : node.op);
        ins.nargs = static_cast<uint8_t>(node.inputs.size());
        ins.flag = narrow && m == r ? false : instr_flag(node);
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
    return true;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fuse_elementwise_pass() {
  return std::make_unique<FuseElementwise>();
}

}  // namespace cstorch::compiler
