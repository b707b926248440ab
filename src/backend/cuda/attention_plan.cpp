// The CUDA attention kernels' workspace and limits (see attention_plan.h): plain C++, built in
// every configuration. The limits come from kernels/attention_launch.h (plain C++ too), the
// header the kernels are compiled against, so the check and the kernels cannot disagree.
#include "backend/cuda/attention_plan.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "backend/cuda/kernels/attention_launch.h"
#include "cstorch/core/error.h"

namespace cstorch::cuda {

namespace {

struct Sizes {
  int64_t B = 0, H = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
};

// Sizes of a node whose q, k, v are 4-d (the op's shape inference guarantees it).
Sizes sizes_of(const ir::Node& n) {
  const auto& at = n.attr<ir::AttentionAttrs>();
  const auto& q = n.inputs[0]->shape;
  const auto& k = n.inputs[1]->shape;
  const auto& v = n.inputs[2]->shape;
  const int t = at.bthd ? 1 : 2, h = at.bthd ? 2 : 1;
  return Sizes{q[0], q[h], q[t], k[t], q[3], v[3]};
}

}  // namespace

size_t attention_workspace_bytes(const ir::Node& n) {
  if (n.op != ir::OpCode::AttentionGrad || n.inputs.size() < 3) return 0;
  const Sizes s = sizes_of(n);
  return static_cast<size_t>(k::attention_stats_floats(s.B, s.H, s.Tq)) * sizeof(float);
}

std::string attention_unsupported(const ir::Node& n) {
  if (n.op != ir::OpCode::Attention && n.op != ir::OpCode::AttentionGrad)
    return fmt::format("{}: not an attention node", n.name());
  const auto& at = n.attr<ir::AttentionAttrs>();
  const bool grad = n.op == ir::OpCode::AttentionGrad;
  if (at.qkv)
    return fmt::format(
        "{}: the CUDA kernel reads q, k and v as three tensors, not one packed "
        "[B, T, 3H, D] tensor",
        n.name());
  const size_t want = 3 + at.has_bias + at.has_mask + (at.dropout_p > 0) + (grad ? 2 : 0);
  if (n.inputs.size() != want)
    return fmt::format("{}: expected {} inputs, got {}", n.name(), want, n.inputs.size());
  if (n.dtype != DType::f32)
    return fmt::format("{}: the CUDA kernel writes f32, not {}", n.name(), dtype_name(n.dtype));
  auto bad = [&](size_t i, const char* what, const char* wanted) {
    return fmt::format("{}: the CUDA kernel reads {} {}, got {}", n.name(), wanted, what,
                       dtype_name(n.inputs[i]->dtype));
  };
  const char* names[3] = {"q", "k", "v"};
  for (size_t i = 0; i < 3; ++i) {
    if (n.inputs[i]->dtype != DType::f32) return bad(i, names[i], "f32");
    if (n.inputs[i]->shape.size() != 4)
      return fmt::format("{}: {} must be 4-d, got {}", n.name(), names[i],
                         shape_str(n.inputs[i]->shape));
  }
  size_t i = 3;
  if (at.has_bias) {
    if (n.inputs[i]->dtype != DType::f32) return bad(i, "bias", "f32");
    if (n.inputs[i]->shape.size() > 4)
      return fmt::format("{}: the bias has more than 4 dims: {}", n.name(),
                         shape_str(n.inputs[i]->shape));
    ++i;
  }
  if (at.has_mask) {
    if (n.inputs[i]->dtype != DType::boolean) return bad(i, "mask", "a bool");
    if (n.inputs[i]->shape.size() > 4)
      return fmt::format("{}: the mask has more than 4 dims: {}", n.name(),
                         shape_str(n.inputs[i]->shape));
    ++i;
  }
  if (at.dropout_p > 0) {
    if (n.inputs[i]->dtype != DType::i64) return bad(i, "generator state", "an i64");
    ++i;
  }
  if (grad) {
    if (n.inputs[i]->dtype != DType::f32) return bad(i, "forward output", "f32");
    if (n.inputs[i + 1]->dtype != DType::f32) return bad(i + 1, "output gradient", "f32");
  }
  const Sizes s = sizes_of(n);
  if (s.D > k::kAttentionMaxHeadDim || s.Dv > k::kAttentionMaxHeadDim)
    return fmt::format(
        "{}: the CUDA kernel takes head sizes up to {}, got {} for q and k and {} for v", n.name(),
        k::kAttentionMaxHeadDim, s.D, s.Dv);
  // One thread block per (b, h, tile of rows): the grid must fit a launch's 2^31 - 1 blocks.
  const int64_t tiles = (std::max(s.Tq, s.Tk) + k::kAttentionTile - 1) / k::kAttentionTile;
  if (s.B * s.H > 0 && tiles > std::numeric_limits<int32_t>::max() / (s.B * s.H))
    return fmt::format("{}: {} x {} heads of {} rows need more thread blocks than one launch has",
                       n.name(), s.B, s.H, std::max(s.Tq, s.Tk));
  return "";
}

}  // namespace cstorch::cuda
