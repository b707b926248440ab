// Shared facts about Fused nodes (see FusedAttrs in attrs.h): how an input is broadcast and the
// size limit of a program, used by the fusion pass, the shape rule and the CPU kernel.
#pragma once
#include <cstdint>

#include "cstorch/core/shape.h"
#include "ir/node.h"

namespace cstorch::ir {

// At most this many registers (inputs + instructions) per Fused node: the CPU kernel keeps one
// block of every register in per-thread stack scratch.
inline constexpr int kMaxFusedRegs = 32;

// A group of Fused nodes run block by block as one pass (DeviceBackend::fused_group_kernel): at
// most this many nodes, and this many registers (inputs + instructions) over all of them.
inline constexpr int kMaxFusedGroup = 4;
inline constexpr int kMaxFusedGroupRegs = 64;
// Groups are formed of nodes of at least this many elements: below it the states of a step
// stay in cache between its nodes anyway, and the group's per-call setup would not pay.
inline constexpr int64_t kMinFusedGroupElements = 65536;

// How a Fused input is read: output element i reads input element (i / div) % mod. This covers
// same-shape inputs (div 1, mod = numel), single elements (mod 1), rows ([D] against [N, D]:
// div 1, mod D) and columns ([N, 1] against [N, D]: div D, mod N); in general any input whose
// non-broadcast dims are one contiguous run of the output's dims.
struct FusedOperand {
  int64_t div = 1, mod = 1;
};

// False when `in` (broadcastable to `out`) is not of that form.
inline bool fused_operand(const Shape& in, const Shape& out, FusedOperand& r) {
  const int od = static_cast<int>(out.size()), id = static_cast<int>(in.size());
  if (id > od) return false;
  // Walk from the innermost dim: broadcast dims (inner), then full dims, then broadcast (outer).
  int phase = 0;  // 0: inner broadcast run, 1: full run, 2: outer broadcast run
  int64_t div = 1, mod = 1;
  for (int d = od - 1; d >= 0; --d) {
    const int k = d - (od - id);
    const int64_t isz = k >= 0 ? in[k] : 1;
    if (out[d] == 1) continue;
    if (isz == out[d]) {
      if (phase == 2) return false;
      phase = 1;
      mod *= isz;
    } else if (isz == 1) {
      if (phase == 0)
        div *= out[d];
      else
        phase = 2;
    } else {
      return false;
    }
  }
  r.div = mod == 1 ? 1 : div;
  r.mod = mod;
  return true;
}

// The ops a Fused program may hold: the kFusable trait of ops.def.
inline bool fused_instr_supported(uint16_t op) {
  return op < kNumOps && has_trait(static_cast<OpCode>(op), kFusable);
}

}  // namespace cstorch::ir
