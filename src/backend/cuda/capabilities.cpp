// The CUDA backend's capability answers (see capabilities.h): plain C++, built in every
// configuration, generated from cuda_ops.def like the backend's kernel table.
#include "backend/cuda/capabilities.h"

#include <algorithm>

#include "cstorch/core/error.h"

namespace cstorch::cuda {

namespace {

constexpr uint32_t bit(DType t) {
  return 1u << static_cast<unsigned>(t);
}
constexpr uint32_t F32 = bit(DType::f32);
constexpr uint32_t kI64 = bit(DType::i64);
constexpr uint32_t kBool = bit(DType::boolean);
constexpr uint32_t kAll = F32 | bit(DType::i32) | kI64 | kBool;

struct Table {
  uint32_t mask[ir::kNumOps] = {};
  int count = 0;
  constexpr Table() {
#define CUDA_OP(Name, m)                          \
  mask[static_cast<int>(ir::OpCode::Name)] = (m); \
  ++count;
#include "backend/cuda/cuda_ops.def"
#undef CUDA_OP
  }
};
constexpr Table kTable;

bool is_comparison(ir::OpCode op) {
  using O = ir::OpCode;
  return op == O::Eq || op == O::Ne || op == O::Lt || op == O::Le || op == O::Gt || op == O::Ge;
}

}  // namespace

uint32_t op_dtypes(ir::OpCode op) {
  const int i = static_cast<int>(op);
  return i >= 0 && i < ir::kNumOps ? kTable.mask[i] : 0;
}

bool supports(ir::OpCode op, DType t) {
  return (op_dtypes(op) & bit(t)) != 0;
}

int num_ops() {
  return kTable.count;
}

std::string unsupported(const ir::Node& n) {
  using O = ir::OpCode;
  const uint32_t m = op_dtypes(n.op);
  if (m == 0) return fmt::format("{}: no CUDA kernel", n.name());
  if (!(m & bit(n.dtype)))
    return fmt::format("{}: the CUDA kernel does not write dtype {}", n.name(),
                       dtype_name(n.dtype));
  if (static_cast<int>(n.shape.size()) > kCudaMaxRank)
    return fmt::format("{}: shape {} has more than {} dims", n.name(), shape_str(n.shape),
                       kCudaMaxRank);
  auto input_is = [&](size_t i, uint32_t allowed) {
    return i < n.inputs.size() && (allowed & bit(n.inputs[i]->dtype));
  };
  auto bad_input = [&](size_t i) {
    return fmt::format("{}: the CUDA kernel does not read input {} of dtype {}", n.name(), i,
                       i < n.inputs.size() ? dtype_name(n.inputs[i]->dtype) : "?");
  };
  for (const auto& in : n.inputs)
    if (static_cast<int>(in->shape.size()) > kCudaMaxRank)
      return fmt::format("{}: input shape {} has more than {} dims", n.name(), shape_str(in->shape),
                         kCudaMaxRank);
  switch (n.op) {
    case O::Full:
      return "";
    case O::Cast:
    case O::Copy:
    case O::Permute:
    case O::Expand:
    case O::Slice:
      return input_is(0, kAll) ? "" : bad_input(0);
    case O::Argmax:
    case O::Sum:
    case O::Mean:
    case O::Max:
    case O::Min: {
      if (!input_is(0, F32)) return bad_input(0);
      // The kernels view the input as [outer, r, inner]: the reduced dims must be one run.
      const auto& d = n.attr<ir::AxesAttrs>().dims;
      for (size_t i = 1; i < d.size(); ++i)
        if (d[i] != d[i - 1] + 1)
          return fmt::format("{}: the CUDA kernel reduces one run of adjacent dims, got dims {}",
                             n.name(), shape_str(d));
      return "";
    }
    case O::IsFinite:
      return input_is(0, F32) ? "" : bad_input(0);
    case O::LogicalNot:
      return input_is(0, kBool) ? "" : bad_input(0);
    case O::NllLoss:
    case O::NllLossGrad:
      if (!input_is(0, F32)) return bad_input(0);
      return input_is(1, bit(DType::i32) | kI64) ? "" : bad_input(1);
    case O::Matmul: {
      if (!input_is(0, F32)) return bad_input(0);
      if (!input_is(1, F32)) return bad_input(1);
      // The batched product is one strided batch: A and B have the same batch dims, or one of
      // them has none (its matrix is shared by every batch).
      const Shape &a = n.inputs[0]->shape, &b = n.inputs[1]->shape;
      const bool batched_a = a.size() > 2, batched_b = b.size() > 2;
      // Compared in place (no copies: kernels call this on every run and never allocate).
      if (batched_a && batched_b && !std::equal(a.begin(), a.end() - 2, b.begin(), b.end() - 2))
        return fmt::format(
            "matmul: the CUDA kernel needs equal batch dims or a 2-d operand, got {} and {}",
            shape_str(a), shape_str(b));
      return "";
    }
    default:
      break;
  }
  if (is_comparison(n.op)) {
    if (n.inputs.size() != 2 || n.inputs[0]->dtype != n.inputs[1]->dtype)
      return fmt::format("{}: the CUDA kernel compares inputs of one dtype", n.name());
    return input_is(0, kAll) ? "" : bad_input(0);
  }
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (!input_is(i, F32)) return bad_input(i);
  return "";
}

}  // namespace cstorch::cuda
