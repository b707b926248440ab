// CPU kernels for softmax, log_softmax, nll_loss and its gradient. Softmax runs over any dim by
// viewing the input as [outer, C, inner]; both subtract the max so exp never overflows.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backend/cpu/dtype_dispatch.h"
#include "backend/cpu/elementwise_math.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/vec_math.h"
#include "cstorch/core/error.h"

namespace cstorch::cpu {
namespace {

constexpr int kTile = 64;  // inner columns processed together when the dim is not last

struct OCI {
  int64_t outer = 1, C = 1, inner = 1;
};
OCI view_dim(const Shape& s, int64_t dim) {
  OCI v;
  if (s.empty()) return v;  // 0-d: one element, one class
  for (int64_t i = 0; i < dim; ++i) v.outer *= s[i];
  v.C = s[dim];
  for (size_t i = dim + 1; i < s.size(); ++i) v.inner *= s[i];
  return v;
}

constexpr int64_t kExpChunk = 512;  // exps computed together into a stack buffer (2 KB)

// Calls f(j0, e, len) for the chunks of a row x of n floats, e[j] = vexp(x[j0 + j] - shift) for
// j < len (vexp_n: the vector exp where the variant has one). The exps go to out + j0 where out
// is given (a row that keeps them), else to a stack buffer.
template <class F>
void exp_chunks(const float* x, int64_t n, float shift, float* out, F&& f) {
  alignas(64) float buf[kExpChunk];
  for (int64_t j0 = 0; j0 < n; j0 += kExpChunk) {
    const int64_t len = std::min(kExpChunk, n - j0);
    float* e = out ? out + j0 : buf;
    vexp_n(x + j0, e, len, shift);
    f(j0, static_cast<const float*>(e), len);
  }
}

// Softmax (kLog = false) or log-softmax of one contiguous row. The max skips NaN; a NaN
// still reaches every output through the sum. The sum of exps is accumulated in double. f32
// rows take their exps kExpChunk at a time (exp_chunks), then sum them in a loop of their own:
// the same values as one loop of vexp and a double sum, which GCC vectorises less well (a row of
// 50304 on one Zen 4 core: 0.64 -> 0.51 ns an element; the gradients' rows, whose exps shared a
// loop with a bf16 rounding, 0.52 -> 0.42).
template <bool kLog, class T>
void softmax_row(const T* x, T* y, int64_t C) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < C; ++j) {
    float v = load(x[j]);
    m = v > m ? v : m;
  }
  double s = 0;
  if constexpr (std::is_same_v<T, float>) {
    // Softmax keeps its exps in the output (normalised below).
    exp_chunks(x, C, m, kLog ? nullptr : y, [&](int64_t, const float* e, int64_t len) {
      double cs = 0;
#pragma omp simd reduction(+ : cs)
      for (int64_t j = 0; j < len; ++j) cs += e[j];
      s += cs;
    });
    if constexpr (kLog) {
      const float ls = static_cast<float>(std::log(s));
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) y[j] = (x[j] - m) - ls;
    } else {
      const float inv = static_cast<float>(1.0 / s);
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) y[j] *= inv;
    }
  } else {
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < C; ++j) s += vexp(static_cast<float>(load(x[j])) - m);
    if constexpr (kLog) {
      const float ls = static_cast<float>(std::log(s));
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) y[j] = store<T>((static_cast<float>(load(x[j])) - m) - ls);
    } else {
      const float inv = static_cast<float>(1.0 / s);
#pragma omp simd
      for (int64_t j = 0; j < C; ++j)
        y[j] = store<T>(vexp(static_cast<float>(load(x[j])) - m) * inv);
    }
  }
}

#if CSTORCH_AVX512_KERNELS
// Rows of at most 16 classes (a classifier's logits), f32: one masked vector per row instead of
// three short scalar-tailed loops (measured: [128, 10] log_softmax 18 us -> 2 us). The sum of
// at most 16 exps is accumulated in float (relative error below 1e-6).
// (GCC 12 reports the reduce intrinsics' _mm512_undefined_ps() as uninitialised: a false
// positive, silenced for this function only.)
CSTORCH_INTRINSICS_BEGIN
template <bool kLog>
void softmax_rows16(const float* x, float* y, int64_t rows, int64_t C) {
  const __mmask16 mk = static_cast<__mmask16>((1u << C) - 1);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  alignas(64) float d[16], e[16];
  for (int64_t o = 0; o < rows; ++o) {
    const __m512 v = _mm512_mask_loadu_ps(ninf, mk, x + o * C);
    const __m512 dv = _mm512_sub_ps(v, _mm512_set1_ps(_mm512_reduce_max_ps(v)));
    _mm512_store_ps(d, dv);
#pragma omp simd aligned(d, e : 64)
    for (int j = 0; j < 16; ++j) e[j] = vexp(d[j]);  // masked lanes: exp(-inf) = 0
    const float s = _mm512_reduce_add_ps(_mm512_load_ps(e));
    const __m512 r = kLog ? _mm512_sub_ps(dv, _mm512_set1_ps(std::log(s)))
                          : _mm512_mul_ps(_mm512_load_ps(e), _mm512_set1_ps(1.f / s));
    _mm512_mask_storeu_ps(y + o * C, mk, r);
  }
}
CSTORCH_INTRINSICS_END
#endif

// The same over `w` columns with stride `inner` (the softmax dim is not the last).
template <bool kLog, class T>
void softmax_cols(const T* x, T* y, int64_t C, int64_t inner, int w) {
  float m[kTile];
  double s[kTile];
  for (int j = 0; j < w; ++j) {
    m[j] = -std::numeric_limits<float>::infinity();
    s[j] = 0;
  }
  for (int64_t c = 0; c < C; ++c) {
    const T* row = x + c * inner;
#pragma omp simd
    for (int j = 0; j < w; ++j) {
      float v = load(row[j]);
      m[j] = v > m[j] ? v : m[j];
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    const T* row = x + c * inner;
#pragma omp simd
    for (int j = 0; j < w; ++j) s[j] += vexp(static_cast<float>(load(row[j])) - m[j]);
  }
  float f[kTile];
  for (int j = 0; j < w; ++j)
    f[j] = kLog ? static_cast<float>(std::log(s[j])) : static_cast<float>(1.0 / s[j]);
  for (int64_t c = 0; c < C; ++c) {
    const T* row = x + c * inner;
    T* out = y + c * inner;
#pragma omp simd
    for (int j = 0; j < w; ++j) {
      float d = static_cast<float>(load(row[j])) - m[j];
      out[j] = store<T>(kLog ? d - f[j] : vexp(d) * f[j]);
    }
  }
}

// x and y may be one buffer: log_softmax is written over its input where the planner allows
// (kInPlaceInput0). Every path reads a whole row (or tile of columns) before it writes it, and
// writes element j only from element j.
template <bool kLog>
void softmax_kernel(const ir::Node& n, const void* const* in, void* out, const char* op) {
  const auto& x = *n.inputs[0];
  OCI v = view_dim(x.shape, n.attr<ir::DimAttrs>().dim);
  if (x.numel() == 0) return;
  dispatch_float(x.dtype, op, [&]<class T>(T*) {
    const T* xp = static_cast<const T*>(in[0]);
    T* yp = static_cast<T*>(out);
#if CSTORCH_AVX512_KERNELS
    if constexpr (std::is_same_v<T, float>) {
      if (v.inner == 1 && v.C <= 16) {
        parallel_for(v.outer, 1024, [&](int64_t b, int64_t e) {
          softmax_rows16<kLog>(xp + b * v.C, yp + b * v.C, e - b, v.C);
        });
        return;
      }
    }
#endif
    if (v.inner == 1) {
      parallel_for(v.outer, std::max<int64_t>(1, 4096 / v.C), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) softmax_row<kLog>(xp + o * v.C, yp + o * v.C, v.C);
      });
      return;
    }
    const int64_t tiles = (v.inner + kTile - 1) / kTile;
    parallel_for(v.outer * tiles, std::max<int64_t>(1, 4096 / (v.C * kTile)),
                 [&](int64_t b, int64_t e) {
                   for (int64_t t = b; t < e; ++t) {
                     int64_t o = t / tiles, j0 = (t % tiles) * kTile;
                     int w = static_cast<int>(std::min<int64_t>(kTile, v.inner - j0));
                     int64_t off = o * v.C * v.inner + j0;
                     softmax_cols<kLog>(xp + off, yp + off, v.C, v.inner, w);
                   }
                 });
  });
}

// Reads target i as int64 (i32 or i64 storage).
struct Targets {
  const void* p;
  bool i64;
  int64_t operator[](int64_t i) const {
    return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
  }
};

[[noreturn]] void bad_target(const char* op, int64_t t, int64_t C, int64_t ignore) {
  fail("{}: target value {} is out of range for {} classes (expected 0 to {}, or ignore_index {})",
       op, t, C, C - 1, ignore);
}

// log_probs [N, C, inner] (a 1-d input is N = inner = 1); targets [N, inner].
OCI loss_view(const Shape& lp) {
  OCI v;
  if (lp.size() == 1) {
    v.C = lp[0];
    return v;
  }
  v.outer = lp[0];
  v.C = lp[1];
  for (size_t i = 2; i < lp.size(); ++i) v.inner *= lp[i];
  return v;
}

}  // namespace

void cpu_Softmax(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                 void* out) {
  softmax_kernel<false>(n, in, out, "softmax");
}
void cpu_LogSoftmax(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                    void* out) {
  softmax_kernel<true>(n, in, out, "log_softmax");
}

// Sequential on purpose: it is O(N) gathers, and a bad target must throw on this thread (an
// exception cannot leave an OpenMP region).
void cpu_NllLoss(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                 void* out) {
  const auto& at = n.attr<ir::LossAttrs>();
  const auto& lp = *n.inputs[0];
  const OCI v = loss_view(lp.shape);
  const Targets tg{in[1], n.inputs[1]->dtype == DType::i64};
  dispatch_float(lp.dtype, "nll_loss", [&]<class T>(T*) {
    const T* x = static_cast<const T*>(in[0]);
    T* y = static_cast<T*>(out);
    double total = 0;
    int64_t count = 0;
    for (int64_t i = 0; i < v.outer; ++i)
      for (int64_t j = 0; j < v.inner; ++j) {
        const int64_t k = i * v.inner + j, t = tg[k];
        double val = 0;
        if (t != at.ignore_index) {
          if (t < 0 || t >= v.C) bad_target("nll_loss", t, v.C, at.ignore_index);
          val = -static_cast<double>(load(x[(i * v.C + t) * v.inner + j]));
          ++count;
        }
        if (at.reduction == ir::Reduction::None)
          y[k] = store<T>(static_cast<compute_t<T>>(val));
        else
          total += val;
      }
    if (at.reduction == ir::Reduction::Sum)
      y[0] = store<T>(static_cast<compute_t<T>>(total));
    else if (at.reduction == ir::Reduction::Mean)  // no valid target: 0/0 = NaN, as torch
      y[0] = store<T>(static_cast<compute_t<T>>(total / static_cast<double>(count)));
  });
}

// d(log_probs)[i, t_i, j] = -g (scaled by 1/count for the mean); zero elsewhere.
void cpu_NllLossGrad(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                     void* out) {
  const auto& at = n.attr<ir::LossAttrs>();
  const OCI v = loss_view(n.shape);
  const Targets tg{in[1], n.inputs[1]->dtype == DType::i64};
  dispatch_float(n.dtype, "nll_loss_grad", [&]<class T>(T*) {
    const T* g = static_cast<const T*>(in[0]);
    T* y = static_cast<T*>(out);
    std::memset(static_cast<void*>(y), 0, n.nbytes());
    const int64_t total = v.outer * v.inner;
    int64_t count = 0;
    for (int64_t k = 0; k < total; ++k) {
      const int64_t t = tg[k];
      if (t == at.ignore_index) continue;
      if (t < 0 || t >= v.C) bad_target("nll_loss_grad", t, v.C, at.ignore_index);
      ++count;
    }
    double scale = at.reduction == ir::Reduction::None ? 0.0 : static_cast<double>(load(g[0]));
    if (at.reduction == ir::Reduction::Mean) scale /= static_cast<double>(count);
    for (int64_t i = 0; i < v.outer; ++i)
      for (int64_t j = 0; j < v.inner; ++j) {
        const int64_t k = i * v.inner + j, t = tg[k];
        if (t == at.ignore_index) continue;
        double gv = at.reduction == ir::Reduction::None ? static_cast<double>(load(g[k])) : scale;
        y[(i * v.C + t) * v.inner + j] = store<T>(static_cast<compute_t<T>>(-gv));
      }
  });
}

}  // namespace cstorch::cpu

namespace cstorch::cpu {

// log_softmax's gradient: dx = g - exp(y) * sum(g) along the dim, one task per row (or per
// tile of columns when the dim is not last). The row sum is accumulated in double; exp is
// vexp, as in the softmax kernels.
void cpu_LogSoftmaxGrad(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                        void* out) {
  OCI v = view_dim(n.shape, n.attr<ir::DimAttrs>().dim);
  if (n.numel() == 0) return;
  dispatch_float(n.dtype, "log_softmax_grad", [&]<class T>(T*) {
    const T* g = static_cast<const T*>(in[0]);
    const T* y = static_cast<const T*>(in[1]);
    T* dx = static_cast<T*>(out);
    if (v.inner == 1) {
      parallel_for(v.outer, std::max<int64_t>(1, 4096 / v.C), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          const T* gr = g + o * v.C;
          const T* yr = y + o * v.C;
          T* dr = dx + o * v.C;
          double s = 0;
#pragma omp simd reduction(+ : s)
          for (int64_t j = 0; j < v.C; ++j) s += static_cast<float>(load(gr[j]));
          const float sf = static_cast<float>(s);
          if constexpr (std::is_same_v<T, float>) {
            exp_chunks(yr, v.C, 0.0f, nullptr, [&](int64_t j0, const float* ex, int64_t len) {
#pragma omp simd
              for (int64_t j = 0; j < len; ++j) dr[j0 + j] = gr[j0 + j] - ex[j] * sf;
            });
            continue;
          }
#pragma omp simd
          for (int64_t j = 0; j < v.C; ++j)
            dr[j] = store<T>(static_cast<float>(load(gr[j])) -
                             vexp(static_cast<float>(load(yr[j]))) * sf);
        }
      });
      return;
    }
    parallel_for(v.outer * v.inner, std::max<int64_t>(1, 4096 / v.C), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const int64_t o = t / v.inner, j = t % v.inner;
        const int64_t base = o * v.C * v.inner + j;
        double s = 0;
        for (int64_t c = 0; c < v.C; ++c) s += static_cast<float>(load(g[base + c * v.inner]));
        const float sf = static_cast<float>(s);
        for (int64_t c = 0; c < v.C; ++c) {
          const int64_t k = base + c * v.inner;
          dx[k] =
              store<T>(static_cast<float>(load(g[k])) - vexp(static_cast<float>(load(y[k]))) * sf);
        }
      }
    });
  });
}

// cross_entropy_grad(log_probs y, grad, target) = log_softmax_grad(nll_loss_grad(grad, target), y)
// with the class dim last, without writing the sparse G = nll_loss_grad(...): row i of G is
// zero save G[t_i] = -g_i (g scaled by 1/count for the mean), so its row sum is G[t_i] and
// dx = G - exp(y) * G[t_i]. Every step rounds as the two kernels do (the same double row sum,
// the same vexp and expression), so the result is bitwise theirs. In place over y is safe:
// y[t_i] is read before the row is written, every other element only by its own output. With
// LossAttrs::bf16_out (f32 log-probs), each f32 value is stored rounded to bf16, bitwise the
// f32 kernel followed by a cast (never in place: the planner needs equal sizes).
void cpu_CrossEntropyGrad(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                          void* out) {
  const auto& at = n.attr<ir::LossAttrs>();
  const OCI v = loss_view(n.shape);
  const Targets tg{in[2], n.inputs[2]->dtype == DType::i64};
  if (n.numel() == 0) return;
  // Targets checked here, on the calling thread (an exception cannot leave a parallel region).
  int64_t count = 0;
  for (int64_t k = 0; k < v.outer; ++k) {
    const int64_t t = tg[k];
    if (t == at.ignore_index) continue;
    if (t < 0 || t >= v.C) bad_target("cross_entropy_grad", t, v.C, at.ignore_index);
    ++count;
  }
  // Rows of dx, each element put(f32 value): store<T> for a gradient of the log-probs' dtype, or
  // the f32 value rounded to bf16 as the Cast kernel rounds it (LossAttrs::bf16_out, from f32).
  auto rows = [&]<class T, class O>(const T* y, const T* g, O* dx, auto put) {
    double scale = at.reduction == ir::Reduction::None ? 0.0 : static_cast<double>(load(g[0]));
    if (at.reduction == ir::Reduction::Mean) scale /= static_cast<double>(count);
    parallel_for(v.outer, std::max<int64_t>(1, 4096 / v.C), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        const int64_t t = tg[o];
        const bool valid = t != at.ignore_index;
        const double gv =
            at.reduction == ir::Reduction::None ? static_cast<double>(load(g[o])) : scale;
        // G[t] as nll_loss_grad stores it, and the row sum log_softmax_grad forms from it: a sum
        // of zeros and G[t], exact, save that a -0 sums to +0 (hence the + 0.0f).
        const float gt =
            valid ? static_cast<float>(load(store<T>(static_cast<compute_t<T>>(-gv)))) : 0.0f;
        const float sf = gt + 0.0f;
        const T* yr = y + o * v.C;
        O* dr = dx + o * v.C;
        const float yt = valid ? static_cast<float>(load(yr[t])) : 0.0f;
        if constexpr (std::is_same_v<T, float>) {
          exp_chunks(yr, v.C, 0.0f, nullptr, [&](int64_t j0, const float* ex, int64_t len) {
#pragma omp simd
            for (int64_t j = 0; j < len; ++j) dr[j0 + j] = put(0.0f - ex[j] * sf);
          });
        } else {
#pragma omp simd
          for (int64_t j = 0; j < v.C; ++j)
            dr[j] = put(0.0f - vexp(static_cast<float>(load(yr[j]))) * sf);
        }
        if (valid) dr[t] = put(gt - vexp(yt) * sf);
      }
    });
  };
  dispatch_float(n.inputs[0]->dtype, "cross_entropy_grad", [&]<class T>(T*) {
    const T* y = static_cast<const T*>(in[0]);
    const T* g = static_cast<const T*>(in[1]);
    if constexpr (std::is_same_v<T, float>) {
      if (at.bf16_out) {
        rows(y, g, static_cast<uint16_t*>(out),
             [](float x) { return bf16_bits_of(std::bit_cast<uint32_t>(x)); });
        return;
      }
    }
    rows(y, g, static_cast<T*>(out), [](float x) { return store<T>(x); });
  });
}

}  // namespace cstorch::cpu
