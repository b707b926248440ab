// The CUDA kernels' launch functions: plain types only (no project header), so that the .cu files
// compile as C++17 with any supported nvcc (CUDA 11.8's nvcc has no C++20) while the host code
// that reads nodes (runtime/ops.cpp) is C++20. Every function queues its work on `stream` (a
// cudaStream_t) and returns at once; pointers are device memory; element counts are > 0.
#pragma once
#include <cstdint>

namespace cstorch::cuda::k {

constexpr int kMaxRank = 8;

// Element types the kernels read and write (bool is one byte holding 0 or 1; bf16 and f16 are
// their two-byte patterns, computed in float: kernels/half.cuh).
enum class Ty : int { f32, i32, i64, b8, bf16, f16 };

// A broadcast walk: the output's shape (rank dims, row-major) and, per input, its stride along
// each output dim (0 where the input is broadcast). `contiguous`: every input has the output's
// element count, so element i of each is at i.
struct Bcast {
  int rank = 0;
  bool contiguous = true;
  // Every element index of the output (so of the inputs, which broadcast to it) is below 2^31:
  // the offsets are computed in 32-bit arithmetic, several times cheaper on the GPU than
  // 64-bit division. False (the 64-bit walk) unless the host sets it.
  bool small = false;
  int64_t shape[kMaxRank] = {};
  int64_t strides[3][kMaxRank] = {};
};

enum class Unary : int {
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
  Expm1,
  Gelu,
  GeluTanh,
  Silu,
  Erf,
  Sin,
  Cos,
  Floor,
  Sign
};
// GeluGrad / GeluTanhGrad: (g, x) -> g * gelu'(x), erf and tanh forms.
enum class Binary : int {
  Add,
  Sub,
  Mul,
  Div,
  Maximum,
  Minimum,
  ReluGrad,
  Pow,
  GeluGrad,
  GeluTanhGrad
};
enum class Cmp : int { Eq, Ne, Lt, Le, Gt, Ge };
enum class Logic : int { And, Or, Xor };
enum class Reduce : int { Sum, Mean, Max, Min };
// Two-pass and norm reductions, accumulated in double as the CPU's: var (mean, then squared
// deviations, divided by max(0, r - param)), logsumexp (max, then the sum of exps, the max not
// subtracted when infinite) and the p-norm (param = p; 1 and 2 exactly as |x| sums and
// sqrt of the sum of squares).
enum class Stat : int { Var, LogSumExp, Norm };

// x and y of type t. Every op runs on f32; relu and gelu (both forms) also on bf16 and f16
// (loaded to float, computed as the f32 kernel, the result rounded once). Returns false, having
// queued nothing, for other combinations (the capability table refuses them first).
bool unary(Unary op, Ty t, const void* x, void* y, int64_t n, void* stream);
// x, y and out of type t. Every op runs on f32; mul, relu_grad and gelu's gradients also on bf16
// and f16 (as unary); add and sub also on i64 (wrapping, as the CPU). Pow with
// `scalar_exponent` (y is one element, x has the output's size) takes the exact cheaper forms of
// exponents 2, 3, 1, 0.5, -0.5, -1 and -2, as the CPU does; otherwise powf. Returns false, having
// queued nothing, for other combinations.
bool binary(Binary op, Ty t, const Bcast& b, const void* x, const void* y, void* out, int64_t n,
            void* stream, bool scalar_exponent = false);
void compare(Cmp op, Ty t, const Bcast& b, const void* x, const void* y, bool* out, int64_t n,
             void* stream);
// The truth values (nonzero) of x and y, both of type t, combined into a bool.
void logical(Logic op, Ty t, const Bcast& b, const void* x, const void* y, bool* out, int64_t n,
             void* stream);
// out = cond ? a : b (broadcasting; cond is bool, a and b items of item_bytes 1, 4 or 8, moved
// by their bit pattern).
void where(const Bcast& b, const bool* cond, const void* a, const void* x, void* out,
           int item_bytes, int64_t n, void* stream);
// out = a + b * c (broadcasting).
void addcmul(const Bcast& b, const float* a, const float* x, const float* c, float* out, int64_t n,
             void* stream);
// Any pair of types, as the CPU converts: through float for bf16 and f16 (an integer becomes the
// nearest float, then the nearest 16-bit value), bool as x != 0.
void cast(Ty from, Ty to, const void* x, void* y, int64_t n, void* stream);
// y = isfinite(x) for f32 x; y = !x for bool x (logical_not).
void is_finite(const float* x, bool* y, int64_t n, void* stream);
void logical_not(const bool* x, bool* y, int64_t n, void* stream);
void fill(Ty t, double value, void* y, int64_t n, void* stream);
// y[i] = start + step * i, computed in double and converted as the CPU does.
void arange(Ty t, double start, double step, void* y, int64_t n, void* stream);

// Reductions of x viewed as [outer, r, inner] over r: y is [outer, inner], both of type t.
// Sums accumulate in double (a 16-bit sum is rounded to float, then to t, as the CPU's);
// max/min propagate NaN. Every op runs on f32, sum also on bf16 and f16; returns false, having
// queued nothing, for other combinations.
bool reduce(Reduce op, Ty t, const void* x, void* y, int64_t outer, int64_t r, int64_t inner,
            void* stream);
void reduce_stat(Stat op, double param, const float* x, float* y, int64_t outer, int64_t r,
                 int64_t inner, void* stream);
// The index (first on ties, NaN counts as the largest) of the largest element along r.
void argmax(const float* x, int64_t* y, int64_t outer, int64_t r, int64_t inner, void* stream);

// out[i, j] = y[i, j] + bias[j], rounded once to t (bf16 or f16): a 16-bit linear's bias added
// to its f32 product, as the CPU's 16-bit linear does. y is [m, n] f32, bias [n] and out [m, n]
// of type t.
void bias_round(Ty t, const float* y, const void* bias, void* out, int64_t m, int64_t n,
                void* stream);

// Softmax or log-softmax of x viewed as [outer, c, inner] along c.
void softmax(bool log, const float* x, float* y, int64_t outer, int64_t c, int64_t inner,
             void* stream);
// dx = g - exp(y) * sum_c(g): log_softmax's gradient.
void log_softmax_grad(const float* g, const float* y, float* dx, int64_t outer, int64_t c,
                      int64_t inner, void* stream);

// Negative log-likelihood of log-probabilities lp [outer, c, inner] at targets [outer, inner]
// (int64 when t64, else int32). reduction: 0 none (y has outer * inner values), 1 mean, 2 sum.
// A target outside [0, c) other than ignore_index stores 1 in *error (a mapped host word the
// backend checks when it next synchronizes) and contributes NaN.
void nll_loss(const float* lp, const void* targets, bool t64, float* y, int64_t outer, int64_t c,
              int64_t inner, int64_t ignore_index, int reduction, int* error, void* stream);
// d(lp) for nll_loss: zero except -g (or -g / count for the mean) at each target.
void nll_loss_grad(const float* g, const void* targets, bool t64, float* dx, int64_t outer,
                   int64_t c, int64_t inner, int64_t ignore_index, int reduction, int* error,
                   void* stream);

// cross_entropy_grad: log_softmax_grad(nll_loss_grad(g, targets), y) for log-probs y [rows, c]
// (class dim last) in one pass per row: dx = G - exp(y) * G[t] with G zero but G[t] = -g_i
// (the mean: -g / count). dx may be y itself. Bad targets as nll_loss.
void cross_entropy_grad(const float* y, const float* g, const void* targets, bool t64, float* dx,
                        int64_t rows, int64_t c, int64_t ignore_index, int reduction, int* error,
                        void* stream);

// Codes a kernel stores in the backend's error word (the first one found wins on the host).
constexpr int kErrorTarget = 1;  // nll_loss / cross_entropy: a class index outside [0, classes)
constexpr int kErrorIndex = 2;   // index_select / index_add / gather / scatter_add: out of range

// A strided read: output element i, at index (i_0, ..., i_{rank-1}) of `shape` (row-major), is
// x[offset + sum_d i_d * strides[d]]. Permute, expand (stride 0 along broadcast dims) and slice
// (offset start * stride, stride * step) are each one such read. Items of `item_bytes` (1, 2, 4
// or 8) move by their bit pattern.
struct Strided {
  int rank = 0;
  bool small = false;  // every output index and input offset is below 2^31 (see Bcast::small)
  int64_t offset = 0;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
};
void gather_strided(const Strided& s, int item_bytes, const void* x, void* y, int64_t n,
                    void* stream);

// Tril / triu over the last two dims ([rows, m, n]): element (i, j) of each matrix is kept iff
// j <= i + diagonal (tril) or j >= i + diagonal (triu), else zero bits.
void tri(bool upper, int64_t diagonal, int item_bytes, const void* x, void* y, int64_t rows,
         int64_t m, int64_t n, void* stream);
// Indexing along dim d of x viewed as [outer, size, inner]; indices are i32 or i64 (idx64). An
// index outside [0, size) stores kErrorIndex in *error and its element is skipped (select and
// gather write zero bits there).
// y [outer, m, inner] = x[:, idx, :].
void index_select(const void* x, const void* idx, bool idx64, void* y, int64_t outer, int64_t size,
                  int64_t inner, int64_t m, int item_bytes, int* error, void* stream);
// y[:, idx[j], :] += src[:, j, :] in place, for j in index order (one thread per (outer, inner)
// column, so repeated indices add in the CPU's order: the same bits). t: f32, i32 or i64.
void index_add(Ty t, const void* idx, bool idx64, const void* src, void* y, int64_t outer,
               int64_t size, int64_t inner, int64_t m, int* error, void* stream);
// Gather and scatter_add along `dim` over the index positions: `w` has the index's shape, and per
// dim the data's stride (strides[0], 0 along `dim`: the index supplies that coordinate) and, for
// scatter_add, the source's (strides[1]). The index itself is contiguous.
struct IndexWalk {
  int rank = 0;
  int64_t shape[kMaxRank] = {};
  int64_t strides[2][kMaxRank] = {};
};
// y[i] = x[walk(i) + idx[i] * dstride].
void gather(const IndexWalk& w, const void* x, const void* idx, bool idx64, void* y, int64_t n,
            int64_t dstride, int64_t size, int item_bytes, int* error, void* stream);
// y[walk(i) + idx[i] * dstride] += src[walk_src(i)] in place for every index position i. Only
// positions that differ along `dim` can share a destination, so one thread owns each line along
// `dim` and adds in index order, as the CPU does: the same bits. t: f32, i32 or i64.
void scatter_add(Ty t, const IndexWalk& w, int dim, const void* idx, bool idx64, const void* src,
                 void* y, int64_t dstride, int64_t size, int* error, void* stream);

}  // namespace cstorch::cuda::k
