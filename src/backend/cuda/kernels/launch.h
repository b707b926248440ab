// The CUDA kernels' launch functions: plain types only (no project header), so that the .cu files
// compile as C++17 with any supported nvcc (CUDA 11.8's nvcc has no C++20) while the host code
// that reads nodes (runtime/ops.cpp) is C++20. Every function queues its work on `stream` (a
// cudaStream_t) and returns at once; pointers are device memory; element counts are > 0.
#pragma once
#include <cstdint>

namespace cstorch::cuda::k {

constexpr int kMaxRank = 8;

// Element types the kernels read and write (bool is one byte holding 0 or 1).
enum class Ty : int { f32, i32, i64, b8 };

// A broadcast walk: the output's shape (rank dims, row-major) and, per input, its stride along
// each output dim (0 where the input is broadcast). `contiguous`: every input has the output's
// element count, so element i of each is at i.
struct Bcast {
  int rank = 0;
  bool contiguous = true;
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
enum class Binary : int { Add, Sub, Mul, Div, Maximum, Minimum, ReluGrad };
enum class Cmp : int { Eq, Ne, Lt, Le, Gt, Ge };
enum class Reduce : int { Sum, Mean, Max, Min };

void unary(Unary op, const float* x, float* y, int64_t n, void* stream);
void binary(Binary op, const Bcast& b, const float* x, const float* y, float* out, int64_t n,
            void* stream);
void compare(Cmp op, Ty t, const Bcast& b, const void* x, const void* y, bool* out, int64_t n,
             void* stream);
// out = a + b * c (broadcasting).
void addcmul(const Bcast& b, const float* a, const float* x, const float* c, float* out, int64_t n,
             void* stream);
void cast(Ty from, Ty to, const void* x, void* y, int64_t n, void* stream);
// y = isfinite(x) for f32 x; y = !x for bool x (logical_not).
void is_finite(const float* x, bool* y, int64_t n, void* stream);
void logical_not(const bool* x, bool* y, int64_t n, void* stream);
void fill(Ty t, double value, void* y, int64_t n, void* stream);

// Reductions of x viewed as [outer, r, inner] over r: y is [outer, inner]. Sums accumulate in
// double; max/min propagate NaN.
void reduce(Reduce op, const float* x, float* y, int64_t outer, int64_t r, int64_t inner,
            void* stream);
// The index (first on ties, NaN counts as the largest) of the largest element along r.
void argmax(const float* x, int64_t* y, int64_t outer, int64_t r, int64_t inner, void* stream);

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

// A strided read: output element i, at index (i_0, ..., i_{rank-1}) of `shape` (row-major), is
// x[offset + sum_d i_d * strides[d]]. Permute, expand (stride 0 along broadcast dims) and slice
// (offset start * stride, stride * step) are each one such read. Items of `item_bytes` (1, 2, 4
// or 8) move by their bit pattern.
struct Strided {
  int rank = 0;
  int64_t offset = 0;
  int64_t shape[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
};
void gather_strided(const Strided& s, int item_bytes, const void* x, void* y, int64_t n,
                    void* stream);

}  // namespace cstorch::cuda::k
