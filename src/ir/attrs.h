// Typed attributes: one struct per kind of op parameter, never a bag of integers. Each struct
// has equality and a hash so CSE can compare nodes structurally.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "cstorch/core/dtype.h"
#include "cstorch/core/shape.h"

namespace cstorch::ir {

using Dims = std::vector<int64_t>;

inline size_t hash_mix(size_t h, size_t v) {
  return h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
}
inline size_t hash_dims(size_t h, const Dims& d) {
  for (auto x : d) h = hash_mix(h, std::hash<int64_t>{}(x));
  return h;
}

struct NoAttrs {
  bool operator==(const NoAttrs&) const = default;
  size_t hash() const { return 0; }
};
// ToDevice: the destination device.
struct DeviceAttrs {
  Device device;
  bool operator==(const DeviceAttrs&) const = default;
  size_t hash() const { return hash_mix(static_cast<size_t>(device.type), device.index); }
};
// Where an Input node's value comes from at each execution.
enum class InputKind : uint8_t { Batch, State };
struct InputAttrs {
  InputKind kind = InputKind::Batch;
  int index = 0;  // position among the program's batch inputs or state slots
  bool operator==(const InputAttrs&) const = default;
  size_t hash() const { return hash_mix(static_cast<size_t>(kind), index); }
};
struct FullAttrs {
  double value = 0;
  bool operator==(const FullAttrs&) const = default;
  size_t hash() const { return std::hash<double>{}(value); }
};
struct ArangeAttrs {
  double start = 0, step = 1;
  bool operator==(const ArangeAttrs&) const = default;
  size_t hash() const { return hash_mix(std::hash<double>{}(start), std::hash<double>{}(step)); }
};
// Random draws: uniform [a, b), normal (mean a, std b), bernoulli (probability a).
struct RandomAttrs {
  double a = 0, b = 1;
  bool operator==(const RandomAttrs&) const = default;
  size_t hash() const { return hash_mix(std::hash<double>{}(a), std::hash<double>{}(b)); }
};
// Cast: the output dtype.
struct CastAttrs {
  DType to = DType::f32;
  bool operator==(const CastAttrs&) const = default;
  size_t hash() const { return static_cast<size_t>(to) + 1; }
};
struct GeluAttrs {
  bool tanh_approx = false;
  bool operator==(const GeluAttrs&) const = default;
  size_t hash() const { return tanh_approx; }
};
// Reduction axes (already normalised to non-negative, sorted, unique; empty means all).
struct AxesAttrs {
  Dims dims;
  bool keepdim = false;
  bool operator==(const AxesAttrs&) const = default;
  size_t hash() const { return hash_dims(keepdim, dims); }
};
struct VarAttrs {
  Dims dims;
  bool keepdim = false;
  double correction = 1;  // Bessel's correction: divide by N - correction
  bool operator==(const VarAttrs&) const = default;
  size_t hash() const {
    return hash_dims(hash_mix(keepdim, std::hash<double>{}(correction)), dims);
  }
};
struct NormAttrs {
  Dims dims;
  bool keepdim = false;
  double p = 2;  // p-norm; 0 < p < inf
  bool operator==(const NormAttrs&) const = default;
  size_t hash() const { return hash_dims(hash_mix(keepdim, std::hash<double>{}(p)), dims); }
};
// C = op(A) @ op(B); trans_x means the last two dims of that input are read transposed.
struct MatmulAttrs {
  bool trans_a = false, trans_b = false;
  // bf16 operands, an f32 output holding the bf16 product's value (the product rounded to bf16
  // as a bf16 matmul stores it, widened back: exact): a bf16 product and its cast to f32 in one
  // kernel, made by the compiler (fuse_gemm_epilogue) where the backend runs it.
  bool f32_out = false;
  bool operator==(const MatmulAttrs&) const = default;
  size_t hash() const { return trans_a * 4 + trans_b * 2 + f32_out; }
};
// A Gemm node (made by src/compiler/passes/fuse_gemm_epilogue.cpp): out = op(A) @ op(B)
// [+ bias] [+ C * s], then [relu], then [zeroed where y <= 0 (relu's gradient)] or [gelu's
// gradient at x: gelu_grad(out, x), the tanh form when gelu_tanh]. Inputs: A, B, then bias [N]
// when `bias`, then C (the output's shape) and s (one element) when `addend`, then y or x (the
// output's shape) when `relu_grad` or `gelu_grad` (not both), then P (the output's shape) and r
// (one element) when `update`: then the kernel also writes P <- P + out * r in place (SGD's
// parameter update from the new momentum; the graph holds P's new value as an After node).
// gelu_grad takes no addend, relu or update. A without trans_a may have leading dims
// (flattened into rows, as Linear's input); with trans_a it is 2-d. B is 2-d.
struct GemmAttrs {
  bool trans_a = false, trans_b = false;
  bool bias = false, addend = false, relu = false, relu_grad = false, update = false;
  bool gelu_grad = false, gelu_tanh = false;
  bool operator==(const GemmAttrs&) const = default;
  size_t hash() const {
    return gelu_grad * 512 + gelu_tanh * 256 + trans_a * 64 + trans_b * 32 + bias * 16 +
           addend * 8 + relu * 4 + relu_grad * 2 + update;
  }
  // Whether the epilogue reads a second operand of the output's shape (y or x).
  bool gated() const { return relu_grad || gelu_grad; }
  // Input positions of the optional operands.
  size_t addend_index() const { return 2 + bias; }
  size_t update_index() const { return 2 + bias + 2 * addend + gated(); }
};
struct DimAttrs {
  int64_t dim = 0;
  bool operator==(const DimAttrs&) const = default;
  size_t hash() const { return std::hash<int64_t>{}(dim); }
};
enum class Reduction : uint8_t { None, Mean, Sum };
struct LossAttrs {
  int64_t ignore_index = -100;
  Reduction reduction = Reduction::Mean;
  int64_t num_classes = 0;  // used by NllLossGrad to shape its output
  // CrossEntropyGrad only: the gradient is stored as bf16 (rounded to nearest even, as the Cast
  // kernel rounds) from f32 log-probs: the compiler's fold of the gradient's cast.
  bool bf16_out = false;
  bool operator==(const LossAttrs&) const = default;
  size_t hash() const {
    return hash_mix(hash_mix(hash_mix(ignore_index, static_cast<size_t>(reduction)), num_classes),
                    bf16_out);
  }
};
struct ShapeAttrs {
  Dims shape;
  bool operator==(const ShapeAttrs&) const = default;
  size_t hash() const { return hash_dims(1, shape); }
};
struct PermuteAttrs {
  Dims perm;
  bool operator==(const PermuteAttrs&) const = default;
  size_t hash() const { return hash_dims(2, perm); }
};
struct SliceAttrs {
  int64_t dim = 0, start = 0, end = 0, step = 1;  // normalised: 0 <= start <= end <= size
  bool operator==(const SliceAttrs&) const = default;
  size_t hash() const { return hash_dims(3, {dim, start, end, step}); }
};
struct TriAttrs {
  int64_t diagonal = 0;
  bool upper = false;  // triu when true, tril when false
  bool operator==(const TriAttrs&) const = default;
  size_t hash() const { return hash_mix(std::hash<int64_t>{}(diagonal), upper); }
};

// Fused scaled-dot-product attention (src/ops/attention.cpp). Inputs, in order: q, k, v, then
// the bias (f32, additive) if has_bias, the boolean mask (true = attend) if has_mask, the
// generator state if dropout_p > 0; AttentionGrad adds the forward output and its gradient.
struct AttentionAttrs {
  double scale = 1;
  double dropout_p = 0;
  bool causal = false;
  int64_t causal_offset = 0;  // causal: key j is visible to query i iff j <= i + causal_offset
  bool has_bias = false;
  bool has_mask = false;
  bool bthd = false;       // layout [B, T, H, D] instead of [B, H, T, D]
  bool bias_grad = false;  // AttentionGrad: also write the bias gradient
  // q, k and v are heads [0, H), [H, 2H) and [2H, 3H) of one [B, T, 3H, D] tensor (a packed QKV
  // projection viewed by heads; bthd only), given as inputs 0, 1 and 2 alike. AttentionGrad
  // then writes their gradient as that one tensor (dq, dk, dv interleaved by heads; the bias
  // gradient after it). Set by the compiler (passes/pack_attention_qkv.cpp), not by the functional
  // API.
  bool qkv = false;
  bool operator==(const AttentionAttrs&) const = default;
  size_t hash() const {
    size_t h = hash_mix(std::hash<double>{}(scale), std::hash<double>{}(dropout_p));
    h = hash_mix(h, std::hash<int64_t>{}(causal_offset));
    return hash_mix(h, causal + 2 * has_bias + 4 * has_mask + 8 * bthd + 16 * bias_grad + 32 * qkv);
  }
};
// LayerNorm / LayerNormGrad (src/ops/nn.cpp): each row of input x's trailing `dims` dims (their
// product is the row length D) normalised by its own mean and biased variance,
// y = (x - mean) / sqrt(var + eps) (* weight) (+ bias). Inputs: LayerNorm (x, weight if
// has_weight, bias if has_bias); LayerNormGrad (dy, x, weight if has_weight), whose f32 output
// holds dx, then the weight's gradient (if has_weight), then the bias's (if has_bias), packed
// flat.
struct LayerNormAttrs {
  int64_t dims = 1;
  double eps = 1e-5;
  bool has_weight = false;
  bool has_bias = false;
  bool operator==(const LayerNormAttrs&) const = default;
  size_t hash() const {
    return hash_mix(hash_mix(std::hash<int64_t>{}(dims), std::hash<double>{}(eps)),
                    has_weight + 2 * has_bias);
  }
};
// AllReduceStart: packs its inputs, each multiplied by `weight`, into one f32 bucket and starts
// its sum over the replicas. `serial` is unique per collective, so no two are ever merged.
struct AllReduceAttrs {
  uint64_t serial = 0;
  double weight = 1;
  bool operator==(const AllReduceAttrs&) const = default;
  size_t hash() const {
    return hash_mix(std::hash<uint64_t>{}(serial), std::hash<double>{}(weight));
  }
};
// AllReduceUnpack: waits for the bucket and takes `shape` values from `offset` (divided by the
// summed weights when `mean`).
struct UnpackAttrs {
  int64_t offset = 0;
  Dims shape;
  bool mean = false;
  bool operator==(const UnpackAttrs&) const = default;
  size_t hash() const { return hash_dims(hash_mix(std::hash<int64_t>{}(offset), mean), shape); }
};

// The output `index` of one checkpointed call (src/ops/recompute.cpp). The scope (the function,
// the generator state and autocast mode it ran under) is opaque here; two calls never compare
// equal.
struct RecomputeScope;
struct RecomputeAttrs {
  std::shared_ptr<RecomputeScope> scope;
  int64_t index = 0;
  bool operator==(const RecomputeAttrs& o) const { return scope == o.scope && index == o.index; }
  size_t hash() const {
    return hash_mix(std::hash<const void*>{}(scope.get()), std::hash<int64_t>{}(index));
  }
};

// A Fused node's program (built by src/compiler/passes/fuse_elementwise.cpp, run by
// src/backend/cpu/fused.cpp). Register r < number of inputs holds input r broadcast to `shape`;
// instruction k writes register (number of inputs + k); the last instruction's register is the
// node's output, stored as `out` (f32, or rounded to bf16 where the backend stores that:
// DeviceBackend::fused_stores_bf16). Each instruction is an original elementwise op (its OpCode
// value) with its argument registers; registers hold f32 values (bool values as 0 / 1, bf16
// inputs widened, where the backend reads them: DeviceBackend::fused_reads_bf16).
struct FusedInstr {
  uint16_t op = 0;    // ir::OpCode
  uint8_t nargs = 0;  // 1..3
  bool flag = false;  // gelu/gelu_grad: tanh form; pow: PyTorch's scalar-exponent forms apply;
                      // cast: to bool (else to f32)
  uint16_t args[3] = {0, 0, 0};
  bool operator==(const FusedInstr&) const = default;
};
struct FusedAttrs {
  std::vector<FusedInstr> code;
  Dims shape;  // the output shape
  DType out = DType::f32;
  bool operator==(const FusedAttrs&) const = default;
  size_t hash() const {
    size_t h = hash_mix(hash_dims(5, shape), static_cast<size_t>(out));
    for (const auto& i : code) {
      h = hash_mix(h, i.op * 2 + i.flag);
      for (int a = 0; a < i.nargs; ++a) h = hash_mix(h, i.args[a]);
    }
    return h;
  }
};

using Attrs =
    std::variant<NoAttrs, InputAttrs, FullAttrs, ArangeAttrs, RandomAttrs, CastAttrs, GeluAttrs,
                 AxesAttrs, VarAttrs, NormAttrs, MatmulAttrs, DimAttrs, LossAttrs, ShapeAttrs,
                 PermuteAttrs, SliceAttrs, TriAttrs, AttentionAttrs, AllReduceAttrs, UnpackAttrs,
                 RecomputeAttrs, FusedAttrs, GemmAttrs, DeviceAttrs, LayerNormAttrs>;

inline size_t hash_attrs(const Attrs& a) {
  return hash_mix(a.index(), std::visit([](const auto& x) { return x.hash(); }, a));
}

}  // namespace cstorch::ir
