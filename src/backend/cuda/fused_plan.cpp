// The CUDA Fused interpreter's admission rules and program translation (see fused_plan.h).
#include "backend/cuda/fused_plan.h"

#include "cstorch/core/error.h"
#include "ir/fused.h"

namespace cstorch::cuda {

namespace {

static_assert(k::kFusedRegs == ir::kMaxFusedRegs,
              "the kernel's register file must hold every register a Fused node may have");
static_assert(k::kFusedRegs <= 32, "FusedProgram::bool_inputs is one bit per input");

// The kernel's instruction for an op; false for ops it does not run.
bool instr_of(ir::OpCode op, k::FOp* out) {
  using O = ir::OpCode;
  using F = k::FOp;
  F f;
  switch (op) {
    // clang-format off
    case O::Neg:        f = F::Neg; break;
    case O::Abs:        f = F::Abs; break;
    case O::Exp:        f = F::Exp; break;
    case O::Log:        f = F::Log; break;
    case O::Sqrt:       f = F::Sqrt; break;
    case O::Rsqrt:      f = F::Rsqrt; break;
    case O::Reciprocal: f = F::Reciprocal; break;
    case O::Tanh:       f = F::Tanh; break;
    case O::Sigmoid:    f = F::Sigmoid; break;
    case O::Relu:       f = F::Relu; break;
    case O::Gelu:       f = F::Gelu; break;
    case O::Silu:       f = F::Silu; break;
    case O::Erf:        f = F::Erf; break;
    case O::Copy:       f = F::Copy; break;
    case O::Cast:       f = F::Cast; break;
    case O::LogicalNot: f = F::LogicalNot; break;
    case O::Add:        f = F::Add; break;
    case O::Sub:        f = F::Sub; break;
    case O::Mul:        f = F::Mul; break;
    case O::Div:        f = F::Div; break;
    case O::Pow:        f = F::Pow; break;
    case O::Maximum:    f = F::Maximum; break;
    case O::Minimum:    f = F::Minimum; break;
    case O::Eq:         f = F::Eq; break;
    case O::Ne:         f = F::Ne; break;
    case O::Lt:         f = F::Lt; break;
    case O::Le:         f = F::Le; break;
    case O::Gt:         f = F::Gt; break;
    case O::Ge:         f = F::Ge; break;
    case O::LogicalAnd: f = F::LogicalAnd; break;
    case O::LogicalOr:  f = F::LogicalOr; break;
    case O::LogicalXor: f = F::LogicalXor; break;
    case O::Where:      f = F::Where; break;
    case O::Addcmul:    f = F::Addcmul; break;
    case O::ReluGrad:   f = F::ReluGrad; break;
    case O::GeluGrad:   f = F::GeluGrad; break;
    // clang-format on
    default:
      return false;
  }
  *out = f;
  return true;
}

bool refuse(std::string* why, std::string msg) {
  if (why) *why = std::move(msg);
  return false;
}

}  // namespace

int fused_arity(k::FOp f) {
  using F = k::FOp;
  switch (f) {
    case F::Where:
    case F::Addcmul:
      return 3;
    case F::Add:
    case F::Sub:
    case F::Mul:
    case F::Div:
    case F::Pow:
    case F::Maximum:
    case F::Minimum:
    case F::Eq:
    case F::Ne:
    case F::Lt:
    case F::Le:
    case F::Gt:
    case F::Ge:
    case F::LogicalAnd:
    case F::LogicalOr:
    case F::LogicalXor:
    case F::ReluGrad:
    case F::GeluGrad:
      return 2;
    default:
      return 1;
  }
}

bool cuda_fuses(ir::OpCode op) {
  k::FOp f;
  return ir::fused_instr_supported(static_cast<uint16_t>(op)) && instr_of(op, &f);
}

bool fused_program_supported(const ir::FusedAttrs& a, int ninputs, std::string* why) {
  const int nc = static_cast<int>(a.code.size());
  if (nc == 0) return refuse(why, "fused: the program is empty");
  if (a.out != DType::f32 && a.out != DType::bf16)
    return refuse(why, fmt::format("fused: the CUDA interpreter stores f32 or bf16 results, not {}",
                                   dtype_name(a.out)));
  if (ninputs < 0 || ninputs + nc > k::kFusedRegs)
    return refuse(why, fmt::format("fused: {} inputs and {} instructions exceed the CUDA "
                                   "interpreter's {} registers",
                                   ninputs, nc, k::kFusedRegs));
  for (int i = 0; i < nc; ++i) {
    const ir::FusedInstr& ins = a.code[i];
    k::FOp f;
    if (!ir::fused_instr_supported(ins.op) || !instr_of(static_cast<ir::OpCode>(ins.op), &f))
      return refuse(why, fmt::format("fused: instruction {} (op code {}) is not in the CUDA "
                                     "interpreter's instruction set",
                                     i, ins.op));
    if (ins.nargs != fused_arity(f))
      return refuse(why, fmt::format("fused: instruction {} ({}) has {} arguments, expected {}", i,
                                     ir::op_info(static_cast<ir::OpCode>(ins.op)).name, ins.nargs,
                                     fused_arity(f)));
    for (int j = 0; j < ins.nargs; ++j)
      if (ins.args[j] >= ninputs + i)
        return refuse(why, fmt::format("fused: instruction {} reads register {} before it is "
                                       "written",
                                       i, ins.args[j]));
  }
  return true;
}

std::string fused_unsupported(const ir::Node& n) {
  const auto& a = n.attr<ir::FusedAttrs>();
  if (n.dtype != a.out || (n.dtype != DType::f32 && n.dtype != DType::bf16))
    return fmt::format("fused: the CUDA interpreter writes f32 or bf16 (the program's {}), not {}",
                       dtype_name(a.out), dtype_name(n.dtype));
  std::string why;
  if (!fused_program_supported(a, static_cast<int>(n.inputs.size()), &why)) return why;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const ir::Node& in = *n.inputs[i];
    if (in.dtype != DType::f32 && in.dtype != DType::boolean && in.dtype != DType::bf16)
      return fmt::format(
          "fused: the CUDA interpreter reads f32, bf16 and bool inputs, input {} is "
          "{}",
          i, dtype_name(in.dtype));
    ir::FusedOperand op;
    if (!ir::fused_operand(in.shape, n.shape, op))
      return fmt::format("fused: input {} of shape {} is not a supported broadcast to {}", i,
                         shape_str(in.shape), shape_str(n.shape));
  }
  return "";
}

k::FusedProgram fused_program(const ir::Node& n) {
  const auto& a = n.attr<ir::FusedAttrs>();
  k::FusedProgram p;
  p.ninputs = static_cast<int32_t>(n.inputs.size());
  p.ncode = static_cast<int32_t>(a.code.size());
  for (int i = 0; i < p.ninputs; ++i) {
    const ir::Node& in = *n.inputs[i];
    ir::FusedOperand op;
    ir::fused_operand(in.shape, n.shape, op);  // checked by fused_unsupported
    p.div[i] = op.div;
    p.mod[i] = op.mod;
    if (in.dtype == DType::boolean) p.bool_inputs |= 1u << i;
    if (in.dtype == DType::bf16) p.bf16_inputs |= 1u << i;
  }
  p.out_bf16 = a.out == DType::bf16 ? 1 : 0;
  for (int i = 0; i < p.ncode; ++i) {
    const ir::FusedInstr& ins = a.code[i];
    k::FusedIns& s = p.code[i];
    instr_of(static_cast<ir::OpCode>(ins.op), &s.op);
    s.flag = ins.flag ? 1 : 0;
    for (int j = 0; j < ins.nargs && j < 3; ++j) s.args[j] = static_cast<uint8_t>(ins.args[j]);
  }
  return p;
}

}  // namespace cstorch::cuda
