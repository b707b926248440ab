// CUDA reductions over one contiguous run of dims (x viewed as [outer, r, inner]): sums, means,
// extrema, var, logsumexp and norms, argmax; softmax / log-softmax and its gradient, and the
// negative log-likelihood loss with its gradient and the fused cross-entropy gradient.
// Sums accumulate in double, as the CPU kernels do, so results agree to float rounding.
// Sums also read and write bf16 and f16 (autocast's bias gradients), through kernels/half.cuh.
#include <cmath>
#include <type_traits>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/half.cuh"

namespace cstorch::cuda::k {

namespace {

// inner == 1: one block per row of r contiguous values.
// T: the element type of x and y (float; bf16 / f16 for sums). A sum is rounded to float, then
// to T, as the CPU's 16-bit sum stores its double.
template <Reduce op, class T>
__global__ void reduce_rows(const T* __restrict__ x, T* y, int64_t r) {
  __shared__ double dscratch[32];
  __shared__ float fscratch[32];
  const T* row = x + static_cast<int64_t>(blockIdx.x) * r;
  if constexpr (op == Reduce::Sum || op == Reduce::Mean) {
    double s = 0;
    for (int64_t j = threadIdx.x; j < r; j += blockDim.x) s += load(row[j]);
    s = block_reduce(s, SumOp{}, dscratch);
    if (threadIdx.x == 0)
      y[blockIdx.x] =
          store<T>(static_cast<float>(op == Reduce::Mean ? s / static_cast<double>(r) : s));
  } else {
    float m = load(row[0]);
    for (int64_t j = threadIdx.x; j < r; j += blockDim.x)
      m = op == Reduce::Max ? max_nan(m, load(row[j])) : min_nan(m, load(row[j]));
    if constexpr (op == Reduce::Max)
      m = block_reduce(m, MaxNanOp{}, fscratch);
    else
      m = block_reduce(m, MinNanOp{}, fscratch);
    if (threadIdx.x == 0) y[blockIdx.x] = store<T>(m);
  }
}

// inner > 1: one thread per output, walking r with stride inner (neighbouring threads read
// neighbouring addresses).
template <Reduce op, class T>
__global__ void reduce_cols(const T* __restrict__ x, T* y, int64_t outer, int64_t r,
                            int64_t inner) {
  CS_GRID_STRIDE(t, outer * inner) {
    const int64_t o = t / inner, j = t % inner;
    const T* p = x + o * r * inner + j;
    if constexpr (op == Reduce::Sum || op == Reduce::Mean) {
      double s = 0;
      for (int64_t i = 0; i < r; ++i) s += load(p[i * inner]);
      y[t] = store<T>(static_cast<float>(op == Reduce::Mean ? s / static_cast<double>(r) : s));
    } else {
      float m = load(p[0]);
      for (int64_t i = 1; i < r; ++i)
        m = op == Reduce::Max ? max_nan(m, load(p[i * inner])) : min_nan(m, load(p[i * inner]));
      y[t] = store<T>(m);
    }
  }
}

// inner > 1 with few outputs and a long reduced run (a bias gradient: [tokens, features] summed
// over the tokens): one thread per output leaves the device idle and walks r serially, so a
// block of kColTile columns x kColLanes lanes takes kColTile outputs, lane l reading rows
// l, l + kColLanes, ... . The lanes' partial results are combined in lane order in shared
// memory: a fixed order whatever the scheduling, and sums in double, so results are the CPU's
// to float rounding as before. Grid: (column tiles, outer).
constexpr int kColTile = 32, kColLanes = 32;

template <Reduce op, class T>
__global__ void reduce_cols_split(const T* __restrict__ x, T* y, int64_t r, int64_t inner) {
  using Acc = std::conditional_t<op == Reduce::Sum || op == Reduce::Mean, double, float>;
  __shared__ Acc part[kColLanes][kColTile + 1];
  const int tx = threadIdx.x % kColTile, lane = threadIdx.x / kColTile;
  const int64_t o = blockIdx.y, j = static_cast<int64_t>(blockIdx.x) * kColTile + tx;
  const T* p = x + o * r * inner + j;
  Acc a;
  if (j < inner) {
    if constexpr (op == Reduce::Sum || op == Reduce::Mean) {
      a = 0;
      for (int64_t i = lane; i < r; i += kColLanes) a += load(p[i * inner]);
    } else {
      a = load(p[0]);  // r >= 1: every lane starts from row 0, which changes no extremum
      for (int64_t i = lane; i < r; i += kColLanes)
        a = op == Reduce::Max ? max_nan(a, load(p[i * inner])) : min_nan(a, load(p[i * inner]));
    }
    part[lane][tx] = a;
  }
  __syncthreads();
  if (lane != 0 || j >= inner) return;
  a = part[0][tx];
  for (int l = 1; l < kColLanes; ++l) {
    if constexpr (op == Reduce::Sum || op == Reduce::Mean)
      a += part[l][tx];
    else
      a = op == Reduce::Max ? max_nan(a, part[l][tx]) : min_nan(a, part[l][tx]);
  }
  if constexpr (op == Reduce::Mean) a /= static_cast<double>(r);
  y[o * inner + j] = store<T>(static_cast<float>(a));
}

// Whether the split kernel serves [outer, r, inner]: few outputs (under ~16K threads' worth) and
// a reduced run long enough to share out.
inline bool split_cols(int64_t outer, int64_t r, int64_t inner) {
  return r >= 4 * kColLanes && outer * inner < 16384 && outer < 65535;
}

// The per-element terms and finishing steps of var, logsumexp and the p-norm, in double as the
// CPU's reducers. Pass 0 sums x (var) or takes the max (logsumexp); pass 1 sums the terms
// around that first result.
struct StatR {
  Stat op;
  double param;
  __device__ double mid(double a, int64_t r) const {
    if (op == Stat::Var) return a / static_cast<double>(r);
    return isinf(a) ? 0.0 : a;  // an infinite max is not subtracted (inf - inf is NaN)
  }
  __device__ double term(float v, double prev) const {
    if (op == Stat::Var) {
      const double d = static_cast<double>(v) - prev;
      return d * d;
    }
    if (op == Stat::LogSumExp) return expf(static_cast<float>(static_cast<double>(v) - prev));
    const double d = fabs(static_cast<double>(v));
    return param == 2.0 ? d * d : param == 1.0 ? d : pow(d, param);
  }
  __device__ float finish(double a, double prev, int64_t r) const {
    if (op == Stat::Var) {
      const double dof = fmax(0.0, static_cast<double>(r) - param);
      return static_cast<float>(a / dof);
    }
    if (op == Stat::LogSumExp) return static_cast<float>(log(a) + prev);
    return static_cast<float>(param == 2.0 ? sqrt(a) : param == 1.0 ? a : pow(a, 1.0 / param));
  }
  // Whether a first pass (the mean, the max) comes before the sum of terms.
  __device__ bool two_pass() const { return op != Stat::Norm; }
};

struct MaxDoubleNanOp {
  __device__ double operator()(double a, double b) const { return (b > a || b != b) ? b : a; }
};

__global__ void stat_rows(StatR st, const float* __restrict__ x, float* y, int64_t r) {
  __shared__ double dscratch[32];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * r;
  double prev = 0;
  if (st.two_pass()) {
    double a;
    if (st.op == Stat::Var) {
      a = 0;
      for (int64_t j = threadIdx.x; j < r; j += blockDim.x) a += row[j];
      a = block_reduce(a, SumOp{}, dscratch);
    } else {
      a = -INFINITY;
      for (int64_t j = threadIdx.x; j < r; j += blockDim.x) a = MaxDoubleNanOp{}(a, row[j]);
      a = block_reduce(a, MaxDoubleNanOp{}, dscratch);
    }
    prev = st.mid(a, r);
  }
  double s = 0;
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) s += st.term(row[j], prev);
  s = block_reduce(s, SumOp{}, dscratch);
  if (threadIdx.x == 0) y[blockIdx.x] = st.finish(s, prev, r);
}

__global__ void stat_cols(StatR st, const float* __restrict__ x, float* y, int64_t outer, int64_t r,
                          int64_t inner) {
  CS_GRID_STRIDE(t, outer * inner) {
    const int64_t o = t / inner, j = t % inner;
    const float* p = x + o * r * inner + j;
    double prev = 0;
    if (st.two_pass()) {
      double a = st.op == Stat::Var ? 0.0 : -INFINITY;
      for (int64_t i = 0; i < r; ++i)
        a = st.op == Stat::Var ? a + p[i * inner] : MaxDoubleNanOp{}(a, p[i * inner]);
      prev = st.mid(a, r);
    }
    double s = 0;
    for (int64_t i = 0; i < r; ++i) s += st.term(p[i * inner], prev);
    y[t] = st.finish(s, prev, r);
  }
}

template <class T>
__global__ void fill_value(T* y, int64_t n, float v) {
  CS_GRID_STRIDE(i, n) y[i] = store<T>(v);
}

// Whether (v, i) comes before (w, j) as the argmax: larger, NaN largest, first index on ties.
__device__ inline bool arg_better(float v, int64_t i, float w, int64_t j) {
  const bool vn = v != v, wn = w != w;
  if (vn || wn) return vn && (!wn || i < j);
  return v > w || (v == w && i < j);
}

__global__ void argmax_kernel(const float* __restrict__ x, int64_t* y, int64_t outer, int64_t r,
                              int64_t inner) {
  CS_GRID_STRIDE(t, outer * inner) {
    const int64_t o = t / inner, j = t % inner;
    const float* p = x + o * r * inner + j;
    float best = p[0];
    int64_t bi = 0;
    for (int64_t i = 1; i < r; ++i)
      if (arg_better(p[i * inner], i, best, bi)) best = p[i * inner], bi = i;
    y[t] = bi;
  }
}

// One block per row (inner == 1): max, then the sum of exps in double, then the outputs.
template <bool kLog>
__global__ void softmax_rows(const float* x, float* y, int64_t c) {  // y may be x (in place)
  __shared__ double dscratch[32];
  __shared__ float fscratch[32];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * c;
  float* out = y + static_cast<int64_t>(blockIdx.x) * c;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) m = row[j] > m ? row[j] : m;  // skips NaN
  m = block_reduce(m, MaxNanOp{}, fscratch);
  double s = 0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += expf(row[j] - m);
  s = block_reduce(s, SumOp{}, dscratch);
  if (kLog) {
    const float ls = static_cast<float>(log(s));
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) out[j] = (row[j] - m) - ls;
  } else {
    const float inv = static_cast<float>(1.0 / s);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) out[j] = expf(row[j] - m) * inv;
  }
}

// inner > 1: one thread per (outer, inner) column.
template <bool kLog>
__global__ void softmax_cols(const float* x, float* y, int64_t outer, int64_t c,  // y may be x
                             int64_t inner) {
  CS_GRID_STRIDE(t, outer * inner) {
    const int64_t o = t / inner, j = t % inner, base = o * c * inner + j;
    float m = -INFINITY;
    for (int64_t i = 0; i < c; ++i) {
      const float v = x[base + i * inner];
      m = v > m ? v : m;
    }
    double s = 0;
    for (int64_t i = 0; i < c; ++i) s += expf(x[base + i * inner] - m);
    const float ls = static_cast<float>(log(s)), inv = static_cast<float>(1.0 / s);
    for (int64_t i = 0; i < c; ++i) {
      const float v = x[base + i * inner] - m;
      y[base + i * inner] = kLog ? v - ls : expf(v) * inv;
    }
  }
}

__global__ void log_softmax_grad_rows(const float* __restrict__ g, const float* __restrict__ y,
                                      float* dx, int64_t c) {
  __shared__ double dscratch[32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * c;
  double s = 0;
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) s += g[base + j];
  const float sf = static_cast<float>(block_reduce(s, SumOp{}, dscratch));
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
    dx[base + j] = g[base + j] - expf(y[base + j]) * sf;
}

__global__ void log_softmax_grad_cols(const float* __restrict__ g, const float* __restrict__ y,
                                      float* dx, int64_t outer, int64_t c, int64_t inner) {
  CS_GRID_STRIDE(t, outer * inner) {
    const int64_t o = t / inner, j = t % inner, base = o * c * inner + j;
    double s = 0;
    for (int64_t i = 0; i < c; ++i) s += g[base + i * inner];
    const float sf = static_cast<float>(s);
    for (int64_t i = 0; i < c; ++i) {
      const int64_t q = base + i * inner;
      dx[q] = g[q] - expf(y[q]) * sf;
    }
  }
}

__device__ inline int64_t target_at(const void* t, bool t64, int64_t k) {
  return t64 ? static_cast<const int64_t*>(t)[k] : static_cast<const int32_t*>(t)[k];
}

__global__ void nll_none(const float* __restrict__ lp, const void* t, bool t64, float* y,
                         int64_t outer, int64_t c, int64_t inner, int64_t ignore, int* error) {
  CS_GRID_STRIDE(k, outer * inner) {
    const int64_t i = k / inner, j = k % inner, tk = target_at(t, t64, k);
    float v = 0.0f;
    if (tk != ignore) {
      if (tk < 0 || tk >= c) {
        report(error, kErrorTarget);
        v = NAN;
      } else {
        v = -lp[(i * c + tk) * inner + j];
      }
    }
    y[k] = v;
  }
}

// One block: the sum over every target (and their count, for the mean).
__global__ void nll_reduce(const float* __restrict__ lp, const void* t, bool t64, float* y,
                           int64_t outer, int64_t c, int64_t inner, int64_t ignore, bool mean,
                           int* error) {
  __shared__ double dscratch[32];
  double s = 0, count = 0;
  for (int64_t k = threadIdx.x; k < outer * inner; k += blockDim.x) {
    const int64_t i = k / inner, j = k % inner, tk = target_at(t, t64, k);
    if (tk == ignore) continue;
    if (tk < 0 || tk >= c) {
      report(error, kErrorTarget);
      s += NAN;
    } else {
      s -= static_cast<double>(lp[(i * c + tk) * inner + j]);
    }
    count += 1;
  }
  s = block_reduce(s, SumOp{}, dscratch);
  count = block_reduce(count, SumOp{}, dscratch);
  if (threadIdx.x == 0) y[0] = static_cast<float>(mean ? s / count : s);  // no target: NaN
}

// One block: counts the targets (for the mean), then writes -g (scaled) at each.
__global__ void nll_grad_kernel(const float* __restrict__ g, const void* t, bool t64, float* dx,
                                int64_t outer, int64_t c, int64_t inner, int64_t ignore,
                                int reduction, int* error) {
  __shared__ double dscratch[32];
  const int64_t total = outer * inner;
  double count = 0;
  for (int64_t k = threadIdx.x; k < total; k += blockDim.x) {
    const int64_t tk = target_at(t, t64, k);
    if (tk == ignore) continue;
    if (tk < 0 || tk >= c) report(error, kErrorTarget);
    count += 1;
  }
  count = block_reduce(count, SumOp{}, dscratch);
  double scale = reduction == 0 ? 0.0 : static_cast<double>(g[0]);
  if (reduction == 1) scale /= count;
  for (int64_t k = threadIdx.x; k < total; k += blockDim.x) {
    const int64_t i = k / inner, j = k % inner, tk = target_at(t, t64, k);
    if (tk == ignore || tk < 0 || tk >= c) continue;
    const double gv = reduction == 0 ? static_cast<double>(g[k]) : scale;
    dx[(i * c + tk) * inner + j] = static_cast<float>(-gv);
  }
}

// One block per row: the targets counted (for the mean; every block counts the same way), then
// dx = G - exp(y) * G[t] with G[t] = -g_i and every other G zero. y[t] is read before the row is
// written, so dx may be y.
__global__ void cross_entropy_grad_rows(const float* y, const float* __restrict__ g, const void* t,
                                        bool t64, float* dx, int64_t rows, int64_t c,
                                        int64_t ignore, int reduction, int* error) {
  __shared__ double dscratch[32];
  const int64_t row = blockIdx.x;
  double scale = 0;
  if (reduction != 0) {
    scale = static_cast<double>(g[0]);
    if (reduction == 1) {
      double count = 0;
      for (int64_t k = threadIdx.x; k < rows; k += blockDim.x) {
        const int64_t tk = target_at(t, t64, k);
        if (tk != ignore) count += 1;
      }
      scale /= block_reduce(count, SumOp{}, dscratch);
    }
  }
  const int64_t tk = target_at(t, t64, row);
  bool valid = tk != ignore;
  if (valid && (tk < 0 || tk >= c)) {
    if (threadIdx.x == 0) report(error, kErrorTarget);
    valid = false;
  }
  const double gv = reduction == 0 ? static_cast<double>(g[row]) : scale;
  // G[t] as nll_loss_grad stores it (a float), and the row sum log_softmax_grad forms from it
  // (a sum of zeros and G[t]: exact, but -0 sums to +0).
  const float gt = valid ? static_cast<float>(-gv) : 0.0f;
  const float sf = gt + 0.0f;
  const float* yr = y + row * c;
  float* dr = dx + row * c;
  const float yt = valid ? yr[tk] : 0.0f;
  __syncthreads();  // every thread has read y[t] before any writes the row
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float v = (valid && j == tk ? gt : 0.0f) - expf(j == tk ? yt : yr[j]) * sf;
    dr[j] = v;
  }
}

// Threads per row-block: a multiple of 32 covering short rows without idle warps.
unsigned row_threads(int64_t c) {
  int64_t t = 32;
  while (t < c && t < 1024) t *= 2;
  return static_cast<unsigned>(t < kThreads ? t : kThreads);
}

}  // namespace

bool reduce(Reduce op, Ty t, const void* x, void* y, int64_t outer, int64_t r, int64_t inner,
            void* stream) {
  cudaStream_t s = as_stream(stream);
  const int64_t n = outer * inner;
  auto run = [&](auto* tag, auto rows_kernel, auto cols_kernel, auto split_kernel) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xt = static_cast<const T*>(x);
    T* yt = static_cast<T*>(y);
    if (r == 0)  // an empty reduction: sum 0, mean 0/0 (max/min of nothing is refused earlier)
      fill_value<T><<<blocks_for(n), kThreads, 0, s>>>(yt, n, op == Reduce::Mean ? NAN : 0.0f);
    else if (inner == 1)
      rows_kernel<<<static_cast<unsigned>(outer), row_threads(r), 0, s>>>(xt, yt, r);
    else if (split_cols(outer, r, inner))
      split_kernel<<<dim3(static_cast<unsigned>((inner + kColTile - 1) / kColTile),
                          static_cast<unsigned>(outer)),
                     kColTile * kColLanes, 0, s>>>(xt, yt, r, inner);
    else
      cols_kernel<<<blocks_for(n), kThreads, 0, s>>>(xt, yt, outer, r, inner);
    return true;
  };
  if (t == Ty::bf16 || t == Ty::f16) {
    if (op != Reduce::Sum) return false;
    if (t == Ty::bf16)
      return run(static_cast<bf16*>(nullptr), reduce_rows<Reduce::Sum, bf16>,
                 reduce_cols<Reduce::Sum, bf16>, reduce_cols_split<Reduce::Sum, bf16>);
    return run(static_cast<f16*>(nullptr), reduce_rows<Reduce::Sum, f16>,
               reduce_cols<Reduce::Sum, f16>, reduce_cols_split<Reduce::Sum, f16>);
  }
  if (t != Ty::f32) return false;
  switch (op) {
#define CS_REDUCE(Name)                                                        \
  case Reduce::Name:                                                           \
    return run(static_cast<float*>(nullptr), reduce_rows<Reduce::Name, float>, \
               reduce_cols<Reduce::Name, float>, reduce_cols_split<Reduce::Name, float>);
    CS_REDUCE(Sum)
    CS_REDUCE(Mean)
    CS_REDUCE(Max)
    CS_REDUCE(Min)
#undef CS_REDUCE
  }
  return false;
}

void reduce_stat(Stat op, double param, const float* x, float* y, int64_t outer, int64_t r,
                 int64_t inner, void* stream) {
  cudaStream_t s = as_stream(stream);
  const int64_t n = outer * inner;
  const StatR st{op, param};
  if (r == 0) {
    // Nothing reduced: var 0 / max(0, -correction) (NaN, as the CPU's 0 / 0), logsumexp
    // log(0) = -inf, a norm 0.
    const float v = op == Stat::Var ? NAN : op == Stat::LogSumExp ? -INFINITY : 0.0f;
    fill_value<float><<<blocks_for(n), kThreads, 0, s>>>(y, n, v);
    return;
  }
  if (inner == 1)
    stat_rows<<<static_cast<unsigned>(outer), row_threads(r), 0, s>>>(st, x, y, r);
  else
    stat_cols<<<blocks_for(n), kThreads, 0, s>>>(st, x, y, outer, r, inner);
}

void cross_entropy_grad(const float* y, const float* g, const void* targets, bool t64, float* dx,
                        int64_t rows, int64_t c, int64_t ignore_index, int reduction, int* error,
                        void* stream) {
  cross_entropy_grad_rows<<<static_cast<unsigned>(rows), row_threads(c), 0, as_stream(stream)>>>(
      y, g, targets, t64, dx, rows, c, ignore_index, reduction, error);
}

void argmax(const float* x, int64_t* y, int64_t outer, int64_t r, int64_t inner, void* stream) {
  argmax_kernel<<<blocks_for(outer * inner), kThreads, 0, as_stream(stream)>>>(x, y, outer, r,
                                                                               inner);
}

void softmax(bool log, const float* x, float* y, int64_t outer, int64_t c, int64_t inner,
             void* stream) {
  cudaStream_t s = as_stream(stream);
  if (inner == 1) {
    const unsigned blocks = static_cast<unsigned>(outer), t = row_threads(c);
    if (log)
      softmax_rows<true><<<blocks, t, 0, s>>>(x, y, c);
    else
      softmax_rows<false><<<blocks, t, 0, s>>>(x, y, c);
  } else if (log) {
    softmax_cols<true><<<blocks_for(outer * inner), kThreads, 0, s>>>(x, y, outer, c, inner);
  } else {
    softmax_cols<false><<<blocks_for(outer * inner), kThreads, 0, s>>>(x, y, outer, c, inner);
  }
}

void log_softmax_grad(const float* g, const float* y, float* dx, int64_t outer, int64_t c,
                      int64_t inner, void* stream) {
  cudaStream_t s = as_stream(stream);
  if (inner == 1)
    log_softmax_grad_rows<<<static_cast<unsigned>(outer), row_threads(c), 0, s>>>(g, y, dx, c);
  else
    log_softmax_grad_cols<<<blocks_for(outer * inner), kThreads, 0, s>>>(g, y, dx, outer, c, inner);
}

void nll_loss(const float* lp, const void* targets, bool t64, float* y, int64_t outer, int64_t c,
              int64_t inner, int64_t ignore_index, int reduction, int* error, void* stream) {
  cudaStream_t s = as_stream(stream);
  if (reduction == 0)
    nll_none<<<blocks_for(outer * inner), kThreads, 0, s>>>(lp, targets, t64, y, outer, c, inner,
                                                            ignore_index, error);
  else
    nll_reduce<<<1, 1024, 0, s>>>(lp, targets, t64, y, outer, c, inner, ignore_index,
                                  reduction == 1, error);
}

void nll_loss_grad(const float* g, const void* targets, bool t64, float* dx, int64_t outer,
                   int64_t c, int64_t inner, int64_t ignore_index, int reduction, int* error,
                   void* stream) {
  cudaStream_t s = as_stream(stream);
  cudaMemsetAsync(dx, 0, static_cast<size_t>(outer * c * inner) * sizeof(float), s);
  nll_grad_kernel<<<1, 1024, 0, s>>>(g, targets, t64, dx, outer, c, inner, ignore_index, reduction,
                                     error);
}

}  // namespace cstorch::cuda::k
