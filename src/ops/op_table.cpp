// Builds the op table (names, traits, shape rules, gradient rules) from ops.def.
#include "core/internal.h"
#include "ops/vjp.h"

namespace cstorch::ir {

using namespace cstorch::ops;

static const OpInfo kOpInfo[] = {
#define OP(Name, str, Attr, tr) {str, static_cast<uint32_t>(tr), &infer_##Name},
#include "ir/ops.def"
#undef OP
};

const OpInfo& op_info(OpCode op) {
  return kOpInfo[static_cast<int>(op)];
}

const char* Node::name() const {
  return op_info(op).name;
}

}  // namespace cstorch::ir

namespace cstorch::ops {
static const VjpFn kVjp[] = {
#define OP(Name, str, Attr, tr) &vjp_##Name,
#include "ir/ops.def"
#undef OP
};
VjpFn vjp_of(ir::OpCode op) {
  return kVjp[static_cast<int>(op)];
}
}  // namespace cstorch::ops
