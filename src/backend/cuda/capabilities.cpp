// The CUDA backend's capability answers (see capabilities.h): plain C++, built in every
// configuration, generated from cuda_ops.def like the backend's kernel table.
#include "backend/cuda/capabilities.h"

#include <algorithm>

#include "backend/cuda/attention_plan.h"
#include "backend/cuda/fused_plan.h"
#include "cstorch/core/error.h"

namespace cstorch::cuda {

namespace {

constexpr uint32_t bit(DType t) {
  return 1u << static_cast<unsigned>(t);
}
constexpr uint32_t F32 = bit(DType::f32);
constexpr uint32_t kI64 = bit(DType::i64);
constexpr uint32_t kBool = bit(DType::boolean);
constexpr uint32_t kI32 = bit(DType::i32);
constexpr uint32_t kNum = F32 | kI32 | kI64;
constexpr uint32_t kAll = kNum | kBool;
// The 16-bit floats, computed in f32 and rounded once (kernels/half.cuh).
constexpr uint32_t kHalf = bit(DType::bf16) | bit(DType::f16);
constexpr uint32_t kF32H = F32 | kHalf;
constexpr uint32_t kAllH = kAll | kHalf;
constexpr uint32_t kF32I64 = F32 | kI64;
constexpr uint32_t kF32B = F32 | bit(DType::bf16);

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
  // Every input i has the output's dtype.
  auto same_as_output = [&](std::initializer_list<size_t> idx) -> std::string {
    for (size_t i : idx)
      if (i >= n.inputs.size() || n.inputs[i]->dtype != n.dtype) return bad_input(i);
    return "";
  };
  auto one_run = [&](const ir::Dims& d) -> std::string {
    // The kernels view the input as [outer, r, inner]: the reduced dims must be one run.
    for (size_t i = 1; i < d.size(); ++i)
      if (d[i] != d[i - 1] + 1)
        return fmt::format("{}: the CUDA kernel reduces one run of adjacent dims, got dims {}",
                           n.name(), shape_str(d));
    return "";
  };
  constexpr uint32_t kIndex = kI32 | kI64;
  switch (n.op) {
    case O::Full:
    case O::Arange:
      return "";
    case O::RandUniform:
    case O::RandNormal:
    case O::Bernoulli:  // input 0: the generator state
      return input_is(0, kI64) ? "" : bad_input(0);
    case O::Fused:
      return fused_unsupported(n);
    case O::Attention:
    case O::AttentionGrad:
      return attention_unsupported(n);
    case O::Tri:
      return same_as_output({0});
    case O::Cat:
      for (size_t i = 0; i < n.inputs.size(); ++i)
        if (n.inputs[i]->dtype != n.dtype) return bad_input(i);
      return "";
    case O::Where:
      if (!input_is(0, kBool)) return bad_input(0);
      return same_as_output({1, 2});
    case O::LogicalAnd:
    case O::LogicalOr:
    case O::LogicalXor:
      if (n.inputs.size() != 2 || n.inputs[0]->dtype != n.inputs[1]->dtype)
        return fmt::format("{}: the CUDA kernel combines inputs of one dtype", n.name());
      return input_is(0, kAll) ? "" : bad_input(0);
    case O::IndexSelect:
    case O::Gather:
      if (!input_is(1, kIndex)) return bad_input(1);
      if (n.op == O::Gather && n.inputs[1]->shape.empty())
        return fmt::format("{}: the CUDA kernel needs an index of at least one dim", n.name());
      return same_as_output({0});
    case O::IndexAdd:
    case O::ScatterAdd:
      if (!input_is(1, kIndex)) return bad_input(1);
      if (n.op == O::ScatterAdd && n.inputs[1]->shape.empty())
        return fmt::format("{}: the CUDA kernel needs an index of at least one dim", n.name());
      return same_as_output({0, 2});
    case O::CrossEntropyGrad:
      if (n.dtype != DType::f32)  // LossAttrs::bf16_out: the CUDA kernel stores f32 only
        return fmt::format("{}: the CUDA kernel stores an f32 gradient, not {}", n.name(),
                           dtype_name(n.dtype));
      if (!input_is(0, F32)) return bad_input(0);
      if (!input_is(1, F32)) return bad_input(1);
      if (!input_is(2, kIndex)) return bad_input(2);
      return n.shape.empty() ? fmt::format("{}: the CUDA kernel needs a class dim", n.name()) : "";
    case O::Var:
      return input_is(0, F32) ? one_run(n.attr<ir::VarAttrs>().dims) : bad_input(0);
    case O::Norm:
      return input_is(0, F32) ? one_run(n.attr<ir::NormAttrs>().dims) : bad_input(0);
    case O::LogSumExp:
      return input_is(0, F32) ? one_run(n.attr<ir::AxesAttrs>().dims) : bad_input(0);
    case O::Cast:
      return input_is(0, kAllH) ? "" : bad_input(0);
    case O::Slice:
      return same_as_output({0});
    case O::Copy:  // data movement by element size: every dtype, 16-bit ones included
    case O::Permute:
    case O::Expand:
      return same_as_output({0});
    case O::Sum:  // f32, bf16 or f16, summed in double and rounded to the output's dtype
      if (const std::string why = same_as_output({0}); !why.empty()) return why;
      return one_run(n.attr<ir::AxesAttrs>().dims);
    case O::Argmax:
    case O::Mean:
    case O::Max:
    case O::Min:
      return input_is(0, F32) ? one_run(n.attr<ir::AxesAttrs>().dims) : bad_input(0);
    case O::IsFinite:
      return input_is(0, F32) ? "" : bad_input(0);
    case O::LogicalNot:
      return input_is(0, kBool) ? "" : bad_input(0);
    case O::NllLoss:
    case O::NllLossGrad:
      if (!input_is(0, F32)) return bad_input(0);
      return input_is(1, kIndex) ? "" : bad_input(1);
    case O::Matmul: {
      // Operands of the output's dtype: f32, or bf16 / f16 summed in fp32 by cuBLASLt.
      if (const std::string why = same_as_output({0, 1}); !why.empty()) return why;
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
  // Elementwise ops, linear and the rest: every input has the output's dtype (which the table
  // allows: f32 for most, 16-bit for those autocast runs in 16-bit, i64 for add and sub).
  for (size_t i = 0; i < n.inputs.size(); ++i)
    if (n.inputs[i]->dtype != n.dtype) return bad_input(i);
  return "";
}

bool fuses(ir::OpCode op) {
  return cuda_fuses(op);
}

size_t workspace_bytes(const ir::Node& n) {
  if (n.op == ir::OpCode::AttentionGrad) return attention_workspace_bytes(n);
  // A 16-bit linear with a bias: its f32 product, to which the bias is added before rounding.
  if (n.op == ir::OpCode::Linear && n.inputs.size() == 3 && (kHalf & bit(n.dtype)))
    return static_cast<size_t>(n.numel()) * sizeof(float);
  return 0;
}

}  // namespace cstorch::cuda
