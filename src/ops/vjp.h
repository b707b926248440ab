// Gradient rules (VJPs). Each op family file defines `vjp_<Name>` for each of its ops, written
// with ordinary tensor ops, so the backward pass is itself graph (run at once in eager mode,
// recorded and optimised in a traced step).
#pragma once
#include <vector>

#include "core/internal.h"

namespace cstorch::ops {

struct VjpArgs {
  const ir::Node& node;
  std::vector<Tensor> inputs;  // the op's inputs (values as of the forward pass)
  Tensor out;                  // the op's output
  Tensor grad;                 // gradient with respect to `out`
  std::vector<bool> needs;     // needs[i]: gradient for input i is wanted
};
// Returns one gradient per input (undefined where not needed or not differentiable).
using VjpFn = std::vector<Tensor> (*)(const VjpArgs&);
VjpFn vjp_of(ir::OpCode op);

// Declared weak: an op whose rule is missing is reported by name at run time and by the
// op-table completeness test, not as a link error.
#define OP(Name, str, Attr, traits)                     \
  __attribute__((weak)) void infer_##Name(ir::Node& n); \
  __attribute__((weak)) std::vector<Tensor> vjp_##Name(const VjpArgs& a);
#include "ir/ops.def"
#undef OP

// For ops without a gradient (kNoGrad): a VJP that is never called.
#define CS_NO_VJP(Name)                              \
  std::vector<Tensor> vjp_##Name(const VjpArgs& a) { \
    fail("op '{}' has no gradient", a.node.name());  \
  }

}  // namespace cstorch::ops
