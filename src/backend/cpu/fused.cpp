// The Fused kernel: runs a FusedAttrs program over blocks of kBlock elements. Every register
// has one block of per-thread stack scratch; same-shape f32 inputs are read in place, other
// inputs (bool, bf16, single elements, rows, columns) are expanded into their block first (bf16
// widened exactly, as the Cast kernel widens it), and the
// last instruction writes straight into the output. Each instruction is one vectorisable loop
// with the same per-element formula as the op's own kernel (elementwise.cpp and
// elementwise_math.h), so the result is bitwise equal to running the ops one by one.
//
// In place: the planner may place the output on a state buffer that is also a same-shape input.
// That is safe: block b of the output is written only by the last instruction, after every read
// of block b, and element j of that instruction reads its arguments' element j only.
#include <cmath>
#include <cstring>
#include <optional>

#include "backend/cpu/elementwise_math.h"
#include "backend/cpu/isa.h"
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
      if (ins.flag) return gelu_tanh_n(a, o, len);
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
      return gelu_grad_n(ins.flag, a, b, o, len);
    default:  // excluded by the shape rule (ir::fused_instr_supported)
      return;
  }
#undef CS_LOOP
}

// How one input is read, decided once per node: in place (f32 of the output's shape), from its
// register's block filled once per chunk (a single element), widened into its block (bf16 of
// the output's shape: vectorised, as a product read by an update is), or expanded into it.
enum class Elem : uint8_t { F32, Bool, Bf16 };
enum class Read : uint8_t { InPlace, Constant, Widen, Expand };
struct Operand {
  const void* data;
  Elem elem;
  Read read;
  int64_t div, mod;
};

float element(const Operand& op, int64_t k) {
  switch (op.elem) {
    case Elem::Bool:
      return as_bool(static_cast<const uint8_t*>(op.data)[k] != 0);
    case Elem::Bf16:
      return static_cast<float>(static_cast<const bf16_t*>(op.data)[k]);
    case Elem::F32:
      break;
  }
  return static_cast<const float*>(op.data)[k];
}

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

namespace {

// Straight-line loops for the instruction sequences of AdamW's one-pass update (and of any
// program that has exactly their shape): the interpreter stores every instruction's block to
// scratch and the next instruction reads it back, which makes a long update program bound by
// those stores rather than by memory; these keep the intermediate values in vector registers.
// Each computes every element with the same IEEE operations, in the same order, as the
// interpreter's loops in this variant of the kernels (mul, sqrt, div and add each rounded once;
// addcmul a + b * c as one FMA, as its loop is contracted), so the results are bitwise the
// interpreter's (CpuVariants.FusedStraightLines* checks it, special values included). Only in the
// AVX-512 variant; elsewhere, and for any other program, the interpreter runs.
enum class Line : uint8_t {
  None,
  Moment1,     // r = addcmul(mul(x, y), z, w)            (AdamW's first moment)
  Moment2,     // r = addcmul(mul(x1, y1), z, mul(x0, y0)) (AdamW's second moment)
  AdamParam,   // r = addcmul(mul(x, y), f / (sqrt(s) / d + e), g)
  CopyToBf16,  // r = x, stored as bf16: narrowed straight from its input
};

// A line and its argument registers, in the order its formula above names them (x, y, z, w;
// x0, y0, x1, y1, z; x, y, s, d, e, f, g), resolved once per node.
struct LineProgram {
  Line line = Line::None;
  uint16_t args[7] = {};
};

// The line that computes `code` over `ni` inputs (registers 0..ni-1; instruction k writes
// register ni + k), if any: every argument named below is checked, so a program that differs in
// any way runs on the interpreter.
LineProgram straight_line(const std::vector<ir::FusedInstr>& code, int ni, bool bf16_out) {
  auto is = [](const ir::FusedInstr& i, OpCode op, int nargs) {
    return i.op == static_cast<uint16_t>(op) && i.nargs == nargs && !i.flag;
  };
  auto input = [&](uint16_t r) { return r < ni; };
  if (bf16_out) {
    if (code.size() == 1 && is(code[0], OpCode::Copy, 1) && input(code[0].args[0]))
      return {Line::CopyToBf16, {code[0].args[0]}};
    return {};
  }
#if CSTORCH_AVX512_KERNELS
  const auto t = [&](int k) { return static_cast<uint16_t>(ni + k); };
  const size_t n = code.size();
  if (n == 2 && is(code[0], OpCode::Mul, 2) && is(code[1], OpCode::Addcmul, 3) &&
      input(code[0].args[0]) && input(code[0].args[1]) && code[1].args[0] == t(0) &&
      input(code[1].args[1]) && input(code[1].args[2]))
    return {Line::Moment1, {code[0].args[0], code[0].args[1], code[1].args[1], code[1].args[2]}};
  if (n == 3 && is(code[0], OpCode::Mul, 2) && is(code[1], OpCode::Mul, 2) &&
      is(code[2], OpCode::Addcmul, 3) && input(code[0].args[0]) && input(code[0].args[1]) &&
      input(code[1].args[0]) && input(code[1].args[1]) && code[2].args[0] == t(1) &&
      input(code[2].args[1]) && code[2].args[2] == t(0))
    return {Line::Moment2,
            {code[0].args[0], code[0].args[1], code[1].args[0], code[1].args[1], code[2].args[1]}};
  if (n == 6 && is(code[0], OpCode::Mul, 2) && is(code[1], OpCode::Sqrt, 1) &&
      is(code[2], OpCode::Div, 2) && is(code[3], OpCode::Add, 2) && is(code[4], OpCode::Div, 2) &&
      is(code[5], OpCode::Addcmul, 3) && input(code[0].args[0]) && input(code[0].args[1]) &&
      input(code[1].args[0]) && code[2].args[0] == t(1) && input(code[2].args[1]) &&
      code[3].args[0] == t(2) && input(code[3].args[1]) && input(code[4].args[0]) &&
      code[4].args[1] == t(3) && code[5].args[0] == t(0) && code[5].args[1] == t(4) &&
      input(code[5].args[2]))
    return {Line::AdamParam,
            {code[0].args[0], code[0].args[1], code[1].args[0], code[2].args[1], code[3].args[1],
             code[4].args[0], code[5].args[2]}};
#endif
  return {};
}

#if CSTORCH_AVX512_KERNELS
// GCC 12's masked-load intrinsics start from an undefined vector, which its
// -Wmaybe-uninitialized reports once inlined (a false positive, as in gemm.cpp).
#pragma GCC diagnostic push
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// Line L's value for the 16 elements at j of its argument blocks p (the registers its formula
// names, in order); Full: all 16 are in range, else only those in mask m are read.
template <Line L, bool Full>
inline __m512 line_value(const float* const* p, int64_t j, __mmask16 m) {
  auto ld = [&](int k) {
    if constexpr (Full)
      return _mm512_loadu_ps(p[k] + j);
    else
      return _mm512_maskz_loadu_ps(m, p[k] + j);
  };
  const __m512 xy = _mm512_mul_ps(ld(0), ld(1));
  if constexpr (L == Line::Moment1) {
    return _mm512_fmadd_ps(ld(2), ld(3), xy);
  } else if constexpr (L == Line::Moment2) {
    return _mm512_fmadd_ps(ld(4), xy, _mm512_mul_ps(ld(2), ld(3)));
  } else {
    static_assert(L == Line::AdamParam);
    const __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(ld(2)), ld(3)), ld(4));
    return _mm512_fmadd_ps(_mm512_div_ps(ld(5), den), ld(6), xy);
  }
}

// o[0, len) for arithmetic line L; r holds the registers' blocks, a names the arguments. One
// instantiation per line, so the element loop carries no choice between them. Whole vectors
// use plain loads and only the tail a masked one: on AMD Zen 5 a masked load that misses the
// caches ran the update at a quarter of the memory's speed (the hardware prefetchers do not
// follow masked loads; bench/README.md).
template <Line L>
void run_line(const float* const* r, const uint16_t* a, float* o, int64_t len) {
  const float* p[7];
  for (int k = 0; k < 7; ++k) p[k] = r[a[k]];
  int64_t j = 0;
  for (; j + 16 <= len; j += 16) _mm512_storeu_ps(o + j, line_value<L, true>(p, j, 0));
  if (j < len) {
    const auto m = static_cast<__mmask16>((1u << (len - j)) - 1);
    _mm512_mask_storeu_ps(o + j, m, line_value<L, false>(p, j, m));
  }
}
#pragma GCC diagnostic pop
#endif

// One Fused node's program over blocks of its output, with its registers in caller-given
// scratch (Block floats per register: inputs first, then one per instruction).
template <int64_t Block>
class FusedRunner {
 public:
  FusedRunner(const ir::Node& n, const void* const* in, void* out, float (*scratch)[Block])
      : fa_(n.attr<ir::FusedAttrs>()),
        ni_(static_cast<int>(n.inputs.size())),
        nc_(static_cast<int>(fa_.code.size())),
        out_(out),
        bf16_out_(fa_.out == DType::bf16),
        scratch_(scratch) {
    const int64_t total = n.numel();
    for (int i = 0; i < ni_; ++i) {
      const auto& x = *n.inputs[i];
      ir::FusedOperand fo;
      ir::fused_operand(x.shape, n.shape, fo);  // checked by the shape rule
      Operand& op = ops_[i];
      op.data = in[i];
      op.elem = x.dtype == DType::boolean ? Elem::Bool
                : x.dtype == DType::bf16  ? Elem::Bf16
                                          : Elem::F32;
      op.div = fo.div;
      op.mod = fo.mod;
      const bool same_shape = fo.mod == total && fo.div == 1;
      op.read = fo.mod == 1                           ? Read::Constant
                : same_shape && op.elem == Elem::F32  ? Read::InPlace
                : same_shape && op.elem == Elem::Bf16 ? Read::Widen
                                                      : Read::Expand;
    }
    line_ = straight_line(fa_.code, ni_, bf16_out_);
  }
  int registers() const { return ni_ + nc_; }

  // Asks for the cache lines of elements [s, s + len) of every input read in place or widened
  // (the streams that come from memory), so that they arrive while earlier blocks compute.
  void prefetch(int64_t s, int64_t len) const {
    for (int i = 0; i < ni_; ++i) {
      const Operand& op = ops_[i];
      if (op.read != Read::InPlace && op.read != Read::Widen) continue;
      const int64_t bytes = op.read == Read::InPlace ? 4 : 2;
      const char* p = static_cast<const char*>(op.data) + s * bytes;
      for (int64_t b = 0; b < len * bytes; b += 64) __builtin_prefetch(p + b, 0, 3);
    }
  }

  // Before the blocks of a chunk of `len` elements: single-element inputs fill their registers
  // (only as much as the chunk's blocks read: small tensors are common, biases and norms).
  void start_chunk(int64_t len) {
    for (int i = 0; i < ni_; ++i)
      if (ops_[i].read == Read::Constant) {
        const float v = element(ops_[i], 0);
        const int64_t fill = std::min(Block, len);
        for (int64_t j = 0; j < fill; ++j) scratch_[i][j] = v;
      }
  }

  // Output elements [s, s + len), len <= Block.
  void run_block(int64_t s, int64_t len) {
    for (int i = 0; i < ni_; ++i) {
      const Operand& op = ops_[i];
      reg_[i] = scratch_[i];
      switch (op.read) {
        case Read::InPlace:
          reg_[i] = static_cast<const float*>(op.data) + s;
          break;
        case Read::Constant:
          break;
        case Read::Widen:
          bf16_bits_to_f32(static_cast<const uint16_t*>(op.data) + s, scratch_[i], len);
          break;
        case Read::Expand:
          if (op.elem == Elem::Bool)
            expand(static_cast<const uint8_t*>(op.data), op, s, len, scratch_[i]);
          else if (op.elem == Elem::Bf16)
            expand(static_cast<const bf16_t*>(op.data), op, s, len, scratch_[i]);
          else
            expand(static_cast<const float*>(op.data), op, s, len, scratch_[i]);
          break;
      }
    }
    switch (line_.line) {
      case Line::None:
        break;
      case Line::CopyToBf16:
        f32_to_bf16_bits(reg_[line_.args[0]], static_cast<uint16_t*>(out_) + s, len);
        return;
#if CSTORCH_AVX512_KERNELS
      case Line::Moment1:
        return run_line<Line::Moment1>(reg_, line_.args, static_cast<float*>(out_) + s, len);
      case Line::Moment2:
        return run_line<Line::Moment2>(reg_, line_.args, static_cast<float*>(out_) + s, len);
      case Line::AdamParam:
        return run_line<Line::AdamParam>(reg_, line_.args, static_cast<float*>(out_) + s, len);
#else
      default:
        break;
#endif
    }
    for (int k = 0; k < nc_; ++k) {
      const auto& ins = fa_.code[k];
      float* dst = k == nc_ - 1 && !bf16_out_ ? static_cast<float*>(out_) + s : scratch_[ni_ + k];
      run_instr(ins, reg_[ins.args[0]], ins.nargs > 1 ? reg_[ins.args[1]] : nullptr,
                ins.nargs > 2 ? reg_[ins.args[2]] : nullptr, dst, len);
      reg_[ni_ + k] = dst;
    }
    // Rounded as the Cast kernel rounds (to nearest even; NaNs stay quiet NaNs).
    if (bf16_out_) f32_to_bf16_bits(reg_[ni_ + nc_ - 1], static_cast<uint16_t*>(out_) + s, len);
  }

 private:
  const ir::FusedAttrs& fa_;
  int ni_, nc_;
  void* out_;
  bool bf16_out_;
  LineProgram line_;
  float (*scratch_)[Block];
  Operand ops_[ir::kMaxFusedRegs];
  const float* reg_[ir::kMaxFusedRegs];
};

}  // namespace

const char* cpu_fused_line(const ir::Node& n) {
  const auto& fa = n.attr<ir::FusedAttrs>();
  switch (straight_line(fa.code, static_cast<int>(n.inputs.size()), fa.out == DType::bf16).line) {
    case Line::Moment1:
      return "moment1";
    case Line::Moment2:
      return "moment2";
    case Line::AdamParam:
      return "adam_param";
    case Line::CopyToBf16:
      return "copy_to_bf16";
    case Line::None:
      break;
  }
  return nullptr;
}

void cpu_Fused(const ir::KernelContext&, const ir::Node& n, const void* const* in, void* out) {
  const int64_t total = n.numel();
  if (total == 0) return;
  const int nc = static_cast<int>(n.attr<ir::FusedAttrs>().code.size());
  // Grain: the chain's work per element grows with its length.
  const int64_t grain = std::max<int64_t>(4 * kBlock, kElementwiseGrain / nc);
  parallel_for(total, grain, [&](int64_t b, int64_t e) {
    alignas(64) float scratch[ir::kMaxFusedRegs][kBlock];
    FusedRunner<kBlock> r(n, in, out, scratch);
    r.start_chunk(e - b);
    for (int64_t s = b; s < e; s += kBlock) r.run_block(s, std::min(kBlock, e - s));
  });
}

// The nodes' programs block by block: block b of node 0, then of node 1, ..., so that what one
// node writes and a later one reads (the new first moment AdamW's parameter update uses) is
// still in L1, and every state is read and written once per step. Each element sees the nodes'
// instructions in program order, so the results are bitwise those of running the nodes one
// after another; the caller guarantees that every buffer a node writes is read by the others
// element for element or not at all.
//
// Blocks are kGroupBlock elements, not kBlock: a group's registers (AdamW's three programs use
// 26) must stay in L1 beside the state streams. At 512 elements they take 52 KiB, more than
// Zen 5's 48 KiB L1, and the grouped pass measured slower than the nodes one by one (36.9 ms
// against 28.4 for a [50304, 768] AdamW update at 2 threads); at 128 it is faster
// (bench/README.md).
constexpr int64_t kGroupBlock = 128;
// Each block first asks for the memory streams' lines kPrefetchBlocks blocks ahead: the group
// spends most of a block in its register loops, and the hardware prefetchers, seeing several
// streams advance 512 bytes at a time between bursts, do not keep far enough ahead.
constexpr int64_t kPrefetchBlocks = 4;

void cpu_fused_group(const ir::KernelContext&, const ir::Node* const* nodes,
                     const void* const* const* ins, void* const* outs, int count) {
  const int64_t total = nodes[0]->numel();
  if (total == 0) return;
  int nc = 0;
  for (int k = 0; k < count; ++k)
    nc += static_cast<int>(nodes[k]->attr<ir::FusedAttrs>().code.size());
  const int64_t grain = std::max<int64_t>(4 * kBlock, kElementwiseGrain / nc);
  parallel_for(total, grain, [&](int64_t b, int64_t e) {
    alignas(64) float scratch[ir::kMaxFusedGroupRegs][kGroupBlock];
    std::optional<FusedRunner<kGroupBlock>> r[ir::kMaxFusedGroup];
    int base = 0;
    for (int k = 0; k < count; ++k) {
      r[k].emplace(*nodes[k], ins[k], outs[k], scratch + base);
      base += r[k]->registers();
      r[k]->start_chunk(e - b);
    }
    for (int64_t s = b; s < e; s += kGroupBlock) {
      const int64_t len = std::min(kGroupBlock, e - s);
      const int64_t ahead = s + kPrefetchBlocks * kGroupBlock;
      if (ahead < e)
        for (int k = 0; k < count; ++k) r[k]->prefetch(ahead, std::min(kGroupBlock, e - ahead));
      for (int k = 0; k < count; ++k) r[k]->run_block(s, len);
    }
  });
}

}  // namespace cstorch::cpu
