// CUDA reductions over one contiguous run of dims (x viewed as [outer, r, inner]), argmax,
// softmax / log-softmax and its gradient, and the negative log-likelihood loss with its gradient.
// Sums accumulate in double, as the CPU kernels do, so results agree to float rounding.
#include <cmath>

#include "backend/cuda/kernels/common.cuh"

namespace cstorch::cuda::k {

namespace {

// inner == 1: one block per row of r contiguous values.
template <Reduce op>
__global__ void reduce_rows(const float* __restrict__ x, float* y, int64_t r) {
  __shared__ double dscratch[32];
  __shared__ float fscratch[32];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * r;
  if constexpr (op == Reduce::Sum || op == Reduce::Mean) {
    double s = 0;
    for (int64_t j = threadIdx.x; j < r; j += blockDim.x) s += row[j];
    s = block_reduce(s, SumOp{}, dscratch);
    if (threadIdx.x == 0)
      y[blockIdx.x] = static_cast<float>(op == Reduce::Mean ? s / static_cast<double>(r) : s);
  } else {
    float m = row[0];
    for (int64_t j = threadIdx.x; j < r; j += blockDim.x)
      m = op == Reduce::Max ? max_nan(m, row[j]) : min_nan(m, row[j]);
    if constexpr (op == Reduce::Max)
      m = block_reduce(m, MaxNanOp{}, fscratch);
    else
      m = block_reduce(m, MinNanOp{}, fscratch);
    if (threadIdx.x == 0) y[blockIdx.x] = m;
  }
}

// inner > 1: one thread per output, walking r with stride inner (neighbouring threads read
// neighbouring addresses).
template <Reduce op>
__global__ void reduce_cols(const float* __restrict__ x, float* y, int64_t outer, int64_t r,
                            int64_t inner) {
  CS_GRID_STRIDE(t, outer * inner) {
    const int64_t o = t / inner, j = t % inner;
    const float* p = x + o * r * inner + j;
    if constexpr (op == Reduce::Sum || op == Reduce::Mean) {
      double s = 0;
      for (int64_t i = 0; i < r; ++i) s += p[i * inner];
      y[t] = static_cast<float>(op == Reduce::Mean ? s / static_cast<double>(r) : s);
    } else {
      float m = p[0];
      for (int64_t i = 1; i < r; ++i)
        m = op == Reduce::Max ? max_nan(m, p[i * inner]) : min_nan(m, p[i * inner]);
      y[t] = m;
    }
  }
}

__global__ void fill_value(float* y, int64_t n, float v) {
  CS_GRID_STRIDE(i, n) y[i] = v;
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
__global__ void softmax_rows(const float* __restrict__ x, float* y, int64_t c) {
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
__global__ void softmax_cols(const float* __restrict__ x, float* y, int64_t outer, int64_t c,
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

__device__ inline void report(int* error) {
  *static_cast<volatile int*>(error) = 1;
}

__global__ void nll_none(const float* __restrict__ lp, const void* t, bool t64, float* y,
                         int64_t outer, int64_t c, int64_t inner, int64_t ignore, int* error) {
  CS_GRID_STRIDE(k, outer * inner) {
    const int64_t i = k / inner, j = k % inner, tk = target_at(t, t64, k);
    float v = 0.0f;
    if (tk != ignore) {
      if (tk < 0 || tk >= c) {
        report(error);
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
      report(error);
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
    if (tk < 0 || tk >= c) report(error);
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

// Threads per row-block: a multiple of 32 covering short rows without idle warps.
unsigned row_threads(int64_t c) {
  int64_t t = 32;
  while (t < c && t < 1024) t *= 2;
  return static_cast<unsigned>(t < kThreads ? t : kThreads);
}

}  // namespace

void reduce(Reduce op, const float* x, float* y, int64_t outer, int64_t r, int64_t inner,
            void* stream) {
  cudaStream_t s = as_stream(stream);
  const int64_t n = outer * inner;
  if (r == 0) {  // an empty reduction: sum 0, mean 0/0 (max/min of nothing is refused earlier)
    fill_value<<<blocks_for(n), kThreads, 0, s>>>(y, n, op == Reduce::Mean ? NAN : 0.0f);
    return;
  }
  switch (op) {
#define CS_REDUCE(Name)                                                                           \
  case Reduce::Name:                                                                              \
    if (inner == 1)                                                                               \
      reduce_rows<Reduce::Name><<<static_cast<unsigned>(outer), row_threads(r), 0, s>>>(x, y, r); \
    else                                                                                          \
      reduce_cols<Reduce::Name><<<blocks_for(n), kThreads, 0, s>>>(x, y, outer, r, inner);        \
    break;
    CS_REDUCE(Sum)
    CS_REDUCE(Mean)
    CS_REDUCE(Max)
    CS_REDUCE(Min)
#undef CS_REDUCE
  }
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
