// Launch functions of the random-draw kernels (random.cu) and the Fused program interpreter
// (fused.cu), with the plain structs they take. Plain C++17 types only, as launch.h, so that
// the kernels build with any supported nvcc and the host code that fills these structs
// (fused_plan.cpp, runtime/random_fused_ops.cpp) needs no CUDA header. Every function queues its
// work on `stream` (a cudaStream_t) and returns at once; pointers are device memory; element
// counts are > 0.
#pragma once
#include <cstdint>

#include "backend/cuda/kernels/launch.h"

namespace cstorch::cuda::k {

// ---- random draws ----
// `state` is the generator state on the device (i64 {seed, offset}); it is read by the kernel,
// never by the host, so a traced step that advances it on the device draws fresh numbers.
// Element i of every draw uses Philox block {offset, i} under key seed, as the CPU's kernels.

// y = low + range * u, u in [0, 1) from the block's first word (24 bits).
void rand_uniform(const int64_t* state, float low, float range, float* y, int64_t n, void* stream);
// y = mean + stdev * z, z by Box-Muller from the block's first two words.
void rand_normal(const int64_t* state, float mean, float stdev, float* y, int64_t n, void* stream);
// y = 1 where the block's first word's top 24 bits k satisfy k < threshold, else 0, written as
// type t (bool is one byte).
void bernoulli(const int64_t* state, uint32_t threshold, Ty t, void* y, int64_t n, void* stream);

// The CPU draws 1 where u < p with u = k / 2^24 (k the top 24 bits) compared in double. Since
// u * 2^24 = k exactly, that is k < p * 2^24, and for an integer k that is k < ceil(p * 2^24):
// the same decision as one integer compare. NaN p draws no ones (every comparison with NaN is
// false); p <= 0 none; p >= 1 all.
inline uint32_t bernoulli_threshold(double p) {
  constexpr double kTwo24 = 16777216.0;
  if (!(p > 0.0)) return 0;  // also NaN
  if (p >= 1.0) return 16777216u;
  const double x = p * kTwo24;  // exact: a power-of-two scale of a value in (0, 1)
  const auto t = static_cast<uint32_t>(x);
  return static_cast<double>(t) == x ? t : t + 1;
}

// ---- the Fused op ----

// Registers of a program (inputs + instructions); equal to ir::kMaxFusedRegs (the runtime checks).
constexpr int kFusedRegs = 32;

// The interpreter's instruction set: the kFusable ops of ops.def, numbered for the kernel (the
// kernels cannot include the C++20 op table; fused_plan.cpp maps ir::OpCode to these).
enum class FOp : uint8_t {
  Neg,
  Abs,
  Exp,
  Log,
  Sqrt,
  Rsqrt,
  Reciprocal,
  Tanh,
  Sigmoid,
  Relu,
  Gelu,  // flag: tanh form
  Silu,
  Erf,
  Copy,
  Cast,  // flag: to bool (0 / 1), else to f32 (registers already hold f32)
  LogicalNot,
  Add,
  Sub,
  Mul,
  Div,
  Pow,  // flag: the exponent is one value, so the exact forms of common exponents apply
  Maximum,
  Minimum,
  Eq,
  Ne,
  Lt,
  Le,
  Gt,
  Ge,
  LogicalAnd,
  LogicalOr,
  LogicalXor,
  Where,
  Addcmul,
  ReluGrad,
  GeluGrad,  // flag: tanh form
  kCount
};

// One instruction: writes register (ninputs + its index) from up to three argument registers
// (unused arguments name register 0).
struct FusedIns {
  FOp op = FOp::Copy;
  uint8_t flag = 0;
  uint8_t args[3] = {0, 0, 0};
};

// A whole program, passed to the kernel by value (a kernel parameter: about 1 KB, under the
// 4 KB limit). Input r (register r) is read at element (i / div[r]) % mod[r] of in[r], as
// bytes 0 / 1 when bit r of bool_inputs is set, as bf16 widened exactly when bit r of
// bf16_inputs is set, else as f32. The last instruction's register is the output: f32, or
// rounded to bf16 (to nearest even, as the Cast kernel rounds) when out_bf16.
struct FusedProgram {
  int32_t ninputs = 0;
  int32_t ncode = 0;
  uint32_t bool_inputs = 0;
  uint32_t bf16_inputs = 0;
  int32_t out_bf16 = 0;
  FusedIns code[kFusedRegs] = {};
  int64_t div[kFusedRegs] = {};
  int64_t mod[kFusedRegs] = {};
  const void* in[kFusedRegs] = {};
};
static_assert(sizeof(FusedProgram) <= 2048, "a kernel parameter must stay well under 4 KB");

// out[i] = the program's value at element i, for i < n (float, or bf16 bits when p.out_bf16).
// `out` may alias an input of the output's shape and element size (each thread reads element i
// of such an input before writing element i).
void fused(const FusedProgram& p, void* out, int64_t n, void* stream);

}  // namespace cstorch::cuda::k
