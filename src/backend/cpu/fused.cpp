// The Fused kernel: runs a FusedAttrs program over blocks of kBlock elements. Every register
// has one block of per-thread stack scratch; same-shape f32 inputs are read in place, other
// inputs (bool, single elements, rows, columns) are expanded into their block first, and the
// last instruction writes straight into the output. Each instruction is one vectorisable loop
// with the same per-element formula as the op's own kernel (elementwise.cpp and
// elementwise_math.h), so the result is bitwise equal to running the ops one by one.
//
// In place: the planner may place the output on a state buffer that is also a same-shape input.
// That is safe: block b of the output is written only by the last instruction, after every read
// of block b, and element j of that instruction reads its arguments' element j only.
#include <cmath>
#include <cstring>

#include "backend/cpu/elementwise_math.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "ir/fused.h"

namespace cstorch::cpu {

namespace {

constexpr int64_t kBlock = 512;

using ir::OpCode;

inline bool truthy(float x) {
  return x != 0.0f;
}
inline float as_bool(bool b) {
  return b ? 1.0f : 0.0f;
}

// out[0, len) = instruction applied to registers a, b, c.
void run_instr(const ir::FusedInstr& ins, const float* a, const float* b, const float* c, float* o,
               int64_t len) {
// One vectorised loop, then return from run_instr.
#define CS_LOOP(expr)                                                    \
  do {                                                                   \
    _Pragma("omp simd") for (int64_t j = 0; j < len; ++j) o[j] = (expr); \
    return;                                                              \
  } while (0)
  switch (static_cast<OpCode>(ins.op)) {
    case OpCode::Neg:
      CS_LOOP(-a[j]);
    case OpCode::Abs:
      CS_LOOP(std::fabs(a[j]));
    case OpCode::Exp:
      for (int64_t j = 0; j < len; ++j) o[j] = std::exp(a[j]);
      return;
    case OpCode::Log:
      for (int64_t j = 0; j < len; ++j) o[j] = std::log(a[j]);
      return;
    case OpCode::Sqrt:
      CS_LOOP(std::sqrt(a[j]));
    case OpCode::Rsqrt:
      CS_LOOP(rsqrt_f(a[j]));
    case OpCode::Reciprocal:
      CS_LOOP(1.0f / a[j]);
    case OpCode::Tanh:
      for (int64_t j = 0; j < len; ++j) o[j] = std::tanh(a[j]);
      return;
    case OpCode::Sigmoid:
      for (int64_t j = 0; j < len; ++j) o[j] = sigmoid_f(a[j]);
      return;
    case OpCode::Relu:
      CS_LOOP(a[j] < 0.0f ? 0.0f : a[j]);
    case OpCode::Gelu:
      if (ins.flag) CS_LOOP(gelu_tanh(a[j]));
      for (int64_t j = 0; j < len; ++j) o[j] = gelu_erf(a[j]);
      return;
    case OpCode::Silu:
      for (int64_t j = 0; j < len; ++j) o[j] = silu_f(a[j]);
      return;
    case OpCode::Erf:
      for (int64_t j = 0; j < len; ++j) o[j] = std::erf(a[j]);
      return;
    case OpCode::Copy:
      CS_LOOP(a[j]);
    case OpCode::Cast:
      if (ins.flag) CS_LOOP(as_bool(truthy(a[j])));
      CS_LOOP(a[j]);  // f32 or bool (0 / 1) to f32
    case OpCode::LogicalNot:
      CS_LOOP(as_bool(!truthy(a[j])));
    case OpCode::Add:
      CS_LOOP(a[j] + b[j]);
    case OpCode::Sub:
      CS_LOOP(a[j] - b[j]);
    case OpCode::Mul:
      CS_LOOP(a[j] * b[j]);
    case OpCode::Div:
      CS_LOOP(a[j] / b[j]);
    case OpCode::Pow:
      // b is one value broadcast: the unfused kernel's exact forms.
      if (ins.flag && pow_exact_form(b[0], [&](auto f) {
            _Pragma("omp simd") for (int64_t j = 0; j < len; ++j) o[j] = f(a[j]);
          }))
        return;
      for (int64_t j = 0; j < len; ++j) o[j] = std::pow(a[j], b[j]);
      return;
    case OpCode::Maximum:
      CS_LOOP(max_nan(a[j], b[j]));
    case OpCode::Minimum:
      CS_LOOP(min_nan(a[j], b[j]));
    case OpCode::Eq:
      CS_LOOP(as_bool(a[j] == b[j]));
    case OpCode::Ne:
      CS_LOOP(as_bool(a[j] != b[j]));
    case OpCode::Lt:
      CS_LOOP(as_bool(a[j] < b[j]));
    case OpCode::Le:
      CS_LOOP(as_bool(a[j] <= b[j]));
    case OpCode::Gt:
      CS_LOOP(as_bool(a[j] > b[j]));
    case OpCode::Ge:
      CS_LOOP(as_bool(a[j] >= b[j]));
    case OpCode::LogicalAnd:
      CS_LOOP(as_bool(truthy(a[j]) && truthy(b[j])));
    case OpCode::LogicalOr:
      CS_LOOP(as_bool(truthy(a[j]) || truthy(b[j])));
    case OpCode::LogicalXor:
      CS_LOOP(as_bool(truthy(a[j]) != truthy(b[j])));
    case OpCode::Where:
      CS_LOOP(truthy(a[j]) ? b[j] : c[j]);
    case OpCode::Addcmul:
      CS_LOOP(a[j] + b[j] * c[j]);
    case OpCode::ReluGrad:
      CS_LOOP(relu_grad_f(a[j], b[j]));
    case OpCode::GeluGrad:
      if (ins.flag) CS_LOOP(gelu_tanh_grad(a[j], b[j]));
      for (int64_t j = 0; j < len; ++j) o[j] = gelu_erf_grad(a[j], b[j]);
      return;
    default:  // excluded by the shape rule (ir::fused_instr_supported)
      return;
  }
#undef CS_LOOP
}

// How one input is read: in place (same shape, f32), or expanded into its register's block.
struct Operand {
  const void* data;
  bool is_bool;
  bool direct;    // f32 of the output's shape: read in place
  bool constant;  // a single element: its block is filled once per chunk
  int64_t div, mod;
};

// Fills dst[0, len) with the input elements (i / div) % mod for output i = start...
template <class T>
void expand(const T* src, const Operand& op, int64_t start, int64_t len, float* dst) {
  int64_t q = start / op.div, c = start % op.div;
  int64_t k = q % op.mod;
  int64_t j = 0;
  while (j < len) {
    const int64_t run = std::min(op.div - c, len - j);  // output elements reading src[k]
    if (op.div == 1) {
      // Rows: a contiguous stretch of the input.
      const int64_t n = std::min(op.mod - k, len - j);
      for (int64_t t = 0; t < n; ++t) dst[j + t] = static_cast<float>(src[k + t]);
      j += n;
      k += n;
      if (k == op.mod) k = 0;
      continue;
    }
    const float v = static_cast<float>(src[k]);
    for (int64_t t = 0; t < run; ++t) dst[j + t] = v;
    j += run;
    c = 0;
    if (++k == op.mod) k = 0;
  }
}

}  // namespace

void cpu_Fused(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const auto& fa = n.attr<ir::FusedAttrs>();
  const int ni = static_cast<int>(n.inputs.size());
  const int nc = static_cast<int>(fa.code.size());
  const int64_t total = n.numel();
  if (total == 0) return;
  Operand ops[ir::kMaxFusedRegs];
  for (int i = 0; i < ni; ++i) {
    const auto& x = *n.inputs[i];
    ir::FusedOperand fo;
    ir::fused_operand(x.shape, n.shape, fo);  // checked by the shape rule
    Operand& op = ops[i];
    op.data = in[i];
    op.is_bool = x.dtype == DType::boolean;
    op.div = fo.div;
    op.mod = fo.mod;
    op.constant = fo.mod == 1;
    op.direct = !op.is_bool && fo.mod == total && fo.div == 1;
  }
  float* o = static_cast<float*>(out);
  // Grain: the chain's work per element grows with its length.
  const int64_t grain = std::max<int64_t>(4 * kBlock, kElementwiseGrain / nc);
  parallel_for(total, grain, [&](int64_t b, int64_t e) {
    alignas(64) float scratch[ir::kMaxFusedRegs][kBlock];
    const float* reg[ir::kMaxFusedRegs];
    for (int i = 0; i < ni; ++i)
      if (ops[i].constant) {
        const float v = ops[i].is_bool ? as_bool(*static_cast<const uint8_t*>(ops[i].data) != 0)
                                       : *static_cast<const float*>(ops[i].data);
        // Only as much as this chunk's blocks read (small tensors are common: biases, norms).
        const int64_t fill = std::min(kBlock, e - b);
        for (int64_t j = 0; j < fill; ++j) scratch[i][j] = v;
      }
    for (int64_t s = b; s < e; s += kBlock) {
      const int64_t len = std::min(kBlock, e - s);
      for (int i = 0; i < ni; ++i) {
        const Operand& op = ops[i];
        if (op.direct) {
          reg[i] = static_cast<const float*>(op.data) + s;
          continue;
        }
        reg[i] = scratch[i];
        if (op.constant) continue;
        if (op.is_bool)
          expand(static_cast<const uint8_t*>(op.data), op, s, len, scratch[i]);
        else
          expand(static_cast<const float*>(op.data), op, s, len, scratch[i]);
      }
      for (int k = 0; k < nc; ++k) {
        const auto& ins = fa.code[k];
        float* dst = k == nc - 1 ? o + s : scratch[ni + k];
        run_instr(ins, reg[ins.args[0]], ins.nargs > 1 ? reg[ins.args[1]] : nullptr,
                  ins.nargs > 2 ? reg[ins.args[2]] : nullptr, dst, len);
        reg[ni + k] = dst;
      }
    }
  });
}

}  // namespace cstorch::cpu
