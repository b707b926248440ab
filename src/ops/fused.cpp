// Fused: a program of elementwise ops over broadcast inputs (FusedAttrs), made by the compiler's
// fusion pass after autodiff, so it has no gradient rule. The shape rule checks the program is
// well formed, since a malformed one would make the kernel read registers it never wrote.
#include "ir/fused.h"
#include "core/internal.h"
#include "ops/vjp.h"

namespace cstorch::ops {

void infer_Fused(ir::Node& n) {
  const auto& a = n.attr<ir::FusedAttrs>();
  const size_t ni = n.inputs.size();
  CS_CHECK(!a.code.empty(), "fused: the program is empty");
  CS_CHECK(ni + a.code.size() <= static_cast<size_t>(ir::kMaxFusedRegs),
           "fused: {} inputs and {} instructions exceed the {} registers of a fused program", ni,
           a.code.size(), ir::kMaxFusedRegs);
  for (size_t i = 0; i < ni; ++i) {
    const auto& in = *n.inputs[i];
    CS_CHECK(in.dtype == DType::f32 || in.dtype == DType::bf16 || in.dtype == DType::boolean,
             "fused: input {} is {}; only f32, bf16 and bool inputs are supported", i,
             dtype_name(in.dtype));
    ir::FusedOperand op;
    CS_CHECK(ir::fused_operand(in.shape, a.shape, op),
             "fused: input {} of shape {} is not a supported broadcast to {}", i,
             shape_str(in.shape), shape_str(a.shape));
  }
  for (size_t k = 0; k < a.code.size(); ++k) {
    const auto& ins = a.code[k];
    CS_CHECK(ir::fused_instr_supported(ins.op),
             "fused: instruction {} (op code {}) is not in the fused kernel's instruction set", k,
             ins.op);
    CS_CHECK(ins.nargs >= 1 && ins.nargs <= 3, "fused: instruction {} has {} arguments", k,
             ins.nargs);
    for (int j = 0; j < ins.nargs; ++j)
      CS_CHECK(ins.args[j] < ni + k, "fused: instruction {} reads register {} before it is written",
               k, ins.args[j]);
  }
  CS_CHECK(a.out == DType::f32 || a.out == DType::bf16,
           "fused: the output is stored as {}; only f32 and bf16 are supported", dtype_name(a.out));
  n.shape = a.shape;
  n.dtype = a.out;
}

CS_NO_VJP(Fused)

}  // namespace cstorch::ops
