// Graph nodes built by hand for kernel tests: an f32 leaf of a shape, and an op node whose
// shape and dtype the op table infers.
#pragma once
#include <utility>
#include <vector>

#include "ir/node.h"

namespace cstorch::testing {

inline ir::NodePtr leaf(const Shape& s) {
  auto n = ir::Node::make(ir::OpCode::Constant, ir::NoAttrs{}, {});
  n->shape = s;
  n->dtype = DType::f32;
  return n;
}
inline ir::NodePtr op(ir::OpCode code, ir::Attrs attrs, std::vector<ir::NodePtr> in) {
  auto n = ir::Node::make(code, std::move(attrs), std::move(in));
  ir::op_info(code).infer(*n);
  return n;
}

}  // namespace cstorch::testing
