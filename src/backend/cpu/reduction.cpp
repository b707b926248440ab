// CPU kernels for reductions (sum, mean, amax/amin, argmax, var, logsumexp, norm). The input is
// viewed as [outer, R, inner] when the reduced dims coalesce into one block, else walked with
// strides. Results are deterministic: how work is split depends only on the shape.
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backend/cpu/dtype_dispatch.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/vec_math.h"
#include "cstorch/core/error.h"

namespace cstorch::cpu {
namespace {

// Iteration geometry of one reduction. `simple`: [outer, R, inner] (row-major); otherwise the
// kept and reduced dims (coalesced) with their input strides.
struct Geom {
  bool simple = true;
  int64_t outer = 1, R = 1, inner = 1;
  int nk = 0, nr = 0;
  int64_t ksize[kMaxDims], kstride[kMaxDims], rsize[kMaxDims], rstride[kMaxDims];
  int64_t nout = 1, nred = 1;
};

Geom make_geom(const Shape& s, const ir::Dims& dims, const char* op) {
  const int nd = static_cast<int>(s.size());
  auto is_red = [&](int d) {
    if (dims.empty()) return true;  // empty = all dims
    for (auto x : dims)
      if (x == d) return true;
    return false;
  };
  Geom g;
  int64_t total = 1;
  for (int d = 0; d < nd; ++d) {
    total *= s[d];
    if (is_red(d))
      g.nred *= s[d];
    else
      g.nout *= s[d];
  }
  if (total == 0) {  // nothing to read: every output is the reduction of an empty set
    g.outer = g.nout;
    g.R = g.nred;
    return g;
  }
  // Coalesce: drop size-1 dims, merge neighbours of the same kind.
  int64_t gsize[2 * kMaxDims];
  bool gred[2 * kMaxDims];
  int ng = 0;
  for (int d = 0; d < nd; ++d) {
    if (s[d] == 1) continue;
    bool r = is_red(d);
    if (ng > 0 && gred[ng - 1] == r) {
      gsize[ng - 1] *= s[d];
    } else {
      CS_CHECK(ng < 2 * kMaxDims, "{}: input shape {} has too many alternating reduced dims", op,
               shape_str(s));
      gsize[ng] = s[d];
      gred[ng] = r;
      ++ng;
    }
  }
  int nred_groups = 0;
  for (int i = 0; i < ng; ++i) nred_groups += gred[i];
  if (nred_groups <= 1) {
    int i = 0;
    for (; i < ng && !gred[i]; ++i) g.outer *= gsize[i];
    if (i < ng) g.R = gsize[i++];
    for (; i < ng; ++i) g.inner *= gsize[i];
    return g;
  }
  g.simple = false;
  int64_t stride = 1;
  int64_t st[2 * kMaxDims];
  for (int i = ng - 1; i >= 0; --i) {
    st[i] = stride;
    stride *= gsize[i];
  }
  for (int i = 0; i < ng; ++i) {
    if (gred[i]) {
      g.rsize[g.nr] = gsize[i];
      g.rstride[g.nr++] = st[i];
    } else {
      CS_CHECK(g.nk < kMaxDims, "{}: input shape {} has too many kept dims", op, shape_str(s));
      g.ksize[g.nk] = gsize[i];
      g.kstride[g.nk++] = st[i];
    }
  }
  CS_CHECK(g.nr <= kMaxDims, "{}: input shape {} has too many reduced dims", op, shape_str(s));
  return g;
}

// ---- reducers ------------------------------------------------------------------------------
// A reducer runs kPasses passes over each output's elements; pass 1 sees mid(pass-0 result)
// as `prev` (the mean for var, the max for logsumexp). Accumulators are double for floats so
// long sums keep ~1e-9 relative accuracy.

template <class T>
using facc_t = std::conditional_t<std::is_floating_point_v<compute_t<T>>, double, int64_t>;

template <class T, class OutT>
struct SumR {
  using acc_t = facc_t<T>;
  static constexpr int kPasses = 1;
  template <int P>
  acc_t init() const {
    return 0;
  }
  template <int P>
  void step(acc_t& a, compute_t<T> v, double) const {
    a += static_cast<acc_t>(v);
  }
  template <int P>
  void combine(acc_t& a, acc_t b) const {
    a += b;
  }
  double mid(acc_t, int64_t) const { return 0; }
  OutT finish(acc_t a, double, int64_t) const {
    return store<OutT>(static_cast<compute_t<OutT>>(a));
  }
};

template <class T>
struct MeanR {
  using acc_t = double;
  static constexpr int kPasses = 1;
  template <int P>
  acc_t init() const {
    return 0;
  }
  template <int P>
  void step(acc_t& a, compute_t<T> v, double) const {
    a += v;
  }
  template <int P>
  void combine(acc_t& a, acc_t b) const {
    a += b;
  }
  double mid(acc_t, int64_t) const { return 0; }
  T finish(acc_t a, double, int64_t n) const {
    return store<T>(static_cast<compute_t<T>>(a / static_cast<double>(n)));
  }
};

// amax / amin: NaN propagates (once the accumulator is NaN nothing replaces it).
template <class T, bool kMax>
struct ExtremumR {
  using acc_t = compute_t<T>;
  static constexpr int kPasses = 1;
  template <int P>
  acc_t init() const {
    if constexpr (std::is_same_v<acc_t, bool>)
      return !kMax;
    else if constexpr (std::is_floating_point_v<acc_t>)
      return kMax ? -std::numeric_limits<acc_t>::infinity()
                  : std::numeric_limits<acc_t>::infinity();
    else
      return kMax ? std::numeric_limits<acc_t>::lowest() : std::numeric_limits<acc_t>::max();
  }
  template <int P>
  void step(acc_t& a, acc_t v, double) const {
    bool better = kMax ? v > a : v < a;
    if constexpr (std::is_floating_point_v<acc_t>) better = better || v != v;
    a = better ? v : a;
  }
  template <int P>
  void combine(acc_t& a, acc_t b) const {
    step<P>(a, b, 0);
  }
  double mid(acc_t, int64_t) const { return 0; }
  T finish(acc_t a, double, int64_t) const { return store<T>(a); }
};

// Two-pass variance: the mean first, then squared deviations from it. The one-pass
// E[x^2] - E[x]^2 form cancels catastrophically when the mean is large against the spread.
template <class T>
struct VarR {
  using acc_t = double;
  static constexpr int kPasses = 2;
  double correction;
  template <int P>
  acc_t init() const {
    return 0;
  }
  template <int P>
  void step(acc_t& a, compute_t<T> v, double prev) const {
    if constexpr (P == 0) {
      a += v;
    } else {
      double d = static_cast<double>(v) - prev;
      a += d * d;
    }
  }
  template <int P>
  void combine(acc_t& a, acc_t b) const {
    a += b;
  }
  double mid(acc_t a, int64_t n) const { return a / static_cast<double>(n); }
  T finish(acc_t a, double, int64_t n) const {
    double dof = std::max(0.0, static_cast<double>(n) - correction);
    return store<T>(static_cast<compute_t<T>>(a / dof));
  }
};

// log(sum(exp(x))) = m + log(sum(exp(x - m))) with m the max, so exp never overflows; an
// infinite max is not subtracted (inf - inf would give NaN where torch gives +-inf).
template <class T>
struct LseR {
  using acc_t = double;
  static constexpr int kPasses = 2;
  template <int P>
  acc_t init() const {
    return P == 0 ? -std::numeric_limits<double>::infinity() : 0.0;
  }
  template <int P>
  void step(acc_t& a, compute_t<T> v, double prev) const {
    if constexpr (P == 0) {
      double d = v;
      a = (d > a || d != d) ? d : a;
    } else {
      a += vexp(static_cast<float>(static_cast<double>(v) - prev));
    }
  }
  template <int P>
  void combine(acc_t& a, acc_t b) const {
    if constexpr (P == 0)
      a = (b > a || b != b) ? b : a;
    else
      a += b;
  }
  double mid(acc_t a, int64_t) const { return std::isinf(a) ? 0.0 : a; }
  T finish(acc_t a, double prev, int64_t) const {
    return store<T>(static_cast<compute_t<T>>(std::log(a) + prev));
  }
};

// kMode: 1 = L1, 2 = L2, 0 = general p.
template <class T, int kMode>
struct NormR {
  using acc_t = double;
  static constexpr int kPasses = 1;
  double p;
  template <int P>
  acc_t init() const {
    return 0;
  }
  template <int P>
  void step(acc_t& a, compute_t<T> v, double) const {
    double d = v;
    if constexpr (kMode == 2)
      a += d * d;
    else if constexpr (kMode == 1)
      a += std::fabs(d);
    else
      a += std::pow(std::fabs(d), p);
  }
  template <int P>
  void combine(acc_t& a, acc_t b) const {
    a += b;
  }
  double mid(acc_t, int64_t) const { return 0; }
  T finish(acc_t a, double, int64_t) const {
    double r = kMode == 2 ? std::sqrt(a) : kMode == 1 ? a : std::pow(a, 1.0 / p);
    return store<T>(static_cast<compute_t<T>>(r));
  }
};

// ---- traversal -------------------------------------------------------------------------------

constexpr int64_t kGrain = 16384;  // elements of work per parallel task
constexpr int64_t kChunk = 16384;  // elements per partial sum when one row is split
constexpr int kMaxChunks = 64;
constexpr int kTile = 1024;       // inner columns reduced together (4 KiB of each f32 row)
constexpr int kMaxColChunks = 8;  // row chunks of a split column block (stack: 8 x kTile)

// One contiguous row; 8 independent lanes let the compiler vectorise the accumulation.
template <int P, class T, class R>
typename R::acc_t row_pass(const T* x, int64_t n, const R& r, double prev) {
  using A = typename R::acc_t;
  constexpr int L = 8;
  A lane[L];
  for (int k = 0; k < L; ++k) lane[k] = r.template init<P>();
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int k = 0; k < L; ++k) r.template step<P>(lane[k], load(x[i + k]), prev);
  for (int k = 0; i < n; ++i, ++k) r.template step<P>(lane[k], load(x[i]), prev);
  for (int k = 1; k < L; ++k) r.template combine<P>(lane[0], lane[k]);
  return lane[0];
}

// One row, split into fixed chunks reduced in parallel (for few, long rows).
template <int P, class T, class R>
typename R::acc_t row_pass_split(const T* x, int64_t n, const R& r, double prev) {
  using A = typename R::acc_t;
  int chunks = static_cast<int>(std::min<int64_t>(kMaxChunks, n / kChunk));
  if (chunks < 2) return row_pass<P>(x, n, r, prev);
  A part[kMaxChunks];
  parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      int64_t s = n * c / chunks, t = n * (c + 1) / chunks;
      part[c] = row_pass<P>(x + s, t - s, r, prev);
    }
  });
  for (int c = 1; c < chunks; ++c) r.template combine<P>(part[0], part[c]);
  return part[0];
}

template <class T, class OutT, class R, bool kSplit>
OutT reduce_row(const T* x, int64_t n, const R& r) {
  auto pass = [&]<int P>(double prev) {
    if constexpr (kSplit)
      return row_pass_split<P>(x, n, r, prev);
    else
      return row_pass<P>(x, n, r, prev);
  };
  auto a = pass.template operator()<0>(0.0);
  double prev = 0;
  if constexpr (R::kPasses == 2) {
    prev = r.mid(a, n);
    a = pass.template operator()<1>(prev);
  }
  return r.finish(a, prev, n);
}

// `w` adjacent columns (stride `inner`) over rows [0, nrows).
template <int P, class T, class R>
void cols_pass(const T* x, int64_t nrows, int64_t inner, int w, typename R::acc_t* acc,
               const double* prev, const R& r) {
  for (int j = 0; j < w; ++j) acc[j] = r.template init<P>();
  for (int64_t i = 0; i < nrows; ++i) {
    const T* row = x + i * inner;
#pragma omp simd
    for (int j = 0; j < w; ++j) r.template step<P>(acc[j], load(row[j]), prev[j]);
  }
}

// The same, rows split into `chunks` reduced in parallel and combined in order. Kept out of
// line so the partial sums (64 KiB) take stack space only on this path.
template <int P, class T, class R>
[[gnu::noinline]] void cols_pass_split(const T* x, int64_t nrows, int64_t inner, int w, int chunks,
                                       typename R::acc_t* acc, const double* prev, const R& r) {
  typename R::acc_t part[kMaxColChunks][kTile];
  parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c) {
      int64_t s = nrows * c / chunks, t = nrows * (c + 1) / chunks;
      cols_pass<P>(x + s * inner, t - s, inner, w, part[c], prev, r);
    }
  });
  for (int j = 0; j < w; ++j) {
    acc[j] = part[0][j];
    for (int c = 1; c < chunks; ++c) r.template combine<P>(acc[j], part[c][j]);
  }
}

// Columns [0, w) of one [R_, inner] block; split over rows when `split` (few, tall blocks).
template <class T, class OutT, class R>
void reduce_cols(const T* x, int64_t R_, int64_t inner, int w, OutT* y, const R& r, bool split) {
  double prev[kTile] = {};
  typename R::acc_t acc[kTile];
  int chunks = split ? static_cast<int>(std::min<int64_t>(kMaxColChunks, R_ * w / kChunk)) : 1;
  if (chunks > R_) chunks = static_cast<int>(R_);
  auto pass = [&]<int P>() {
    if (chunks < 2)
      cols_pass<P>(x, R_, inner, w, acc, prev, r);
    else
      cols_pass_split<P>(x, R_, inner, w, chunks, acc, prev, r);
  };
  pass.template operator()<0>();
  if constexpr (R::kPasses == 2) {
    for (int j = 0; j < w; ++j) prev[j] = r.mid(acc[j], R_);
    pass.template operator()<1>();
  }
  for (int j = 0; j < w; ++j) y[j] = r.finish(acc[j], prev[j], R_);
}

// Strided walk over the reduced dims of one output (base = its first input element).
template <int P, class T, class R>
typename R::acc_t general_pass(const T* x, const Geom& g, int64_t base, const R& r, double prev) {
  auto a = r.template init<P>();
  const int last = g.nr - 1;
  const int64_t n_last = g.rsize[last], s_last = g.rstride[last];
  const int64_t rows = g.nred / n_last;
  int64_t idx[kMaxDims] = {};
  int64_t off = base;
  for (int64_t c = 0; c < rows; ++c) {
    const T* p = x + off;
    // Long contiguous runs: the vectorised lanes; short ones are bound by the strided walk.
    if (s_last == 1 && n_last >= 256)
      r.template combine<P>(a, row_pass<P>(p, n_last, r, prev));
    else
      for (int64_t i = 0; i < n_last; ++i) r.template step<P>(a, load(p[i * s_last]), prev);
    for (int d = last - 1; d >= 0; --d) {
      if (++idx[d] < g.rsize[d]) {
        off += g.rstride[d];
        break;
      }
      off -= (g.rsize[d] - 1) * g.rstride[d];
      idx[d] = 0;
    }
  }
  return a;
}

template <class T, class OutT, class R>
void run_reduce(const Geom& g, const T* x, OutT* y, const R& r) {
  if (g.nout == 0) return;
  if (g.simple) {
    const int64_t outer = g.outer, R_ = g.R, inner = g.inner;
    if (R_ == 0 || inner == 1) {
      // Few long rows: split each row; otherwise one task per group of rows.
      if (outer < 16 && R_ >= 2 * kChunk) {
        for (int64_t o = 0; o < outer; ++o) y[o] = reduce_row<T, OutT, R, true>(x + o * R_, R_, r);
        return;
      }
      int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(R_, 1));
      parallel_for(outer, grain, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) y[o] = reduce_row<T, OutT, R, false>(x + o * R_, R_, r);
      });
      return;
    }
    const int64_t tiles = (inner + kTile - 1) / kTile;
    const int64_t tasks = outer * tiles;
    // Splitting rows over the team pays only for large blocks: below 8 chunks of work the
    // fork/join and pulling half the rows from the other core's cache cost more than the sum
    // (measured on 2 cores: a [128, 256] column sum, 12-16 us split vs 4 us on one thread).
    const bool split = tasks < 16 && R_ * std::min<int64_t>(inner, kTile) >= 8 * kChunk;
    auto task = [&](int64_t t) {
      int64_t o = t / tiles, j0 = (t % tiles) * kTile;
      int w = static_cast<int>(std::min<int64_t>(kTile, inner - j0));
      reduce_cols(x + o * R_ * inner + j0, R_, inner, w, y + o * inner + j0, r, split);
    };
    if (split) {
      for (int64_t t = 0; t < tasks; ++t) task(t);
      return;
    }
    int64_t grain =
        std::max<int64_t>(1, kGrain / std::max<int64_t>(1, R_ * std::min<int64_t>(inner, kTile)));
    parallel_for(tasks, grain, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) task(t);
    });
    return;
  }
  int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(g.nred, 1));
  parallel_for(g.nout, grain, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      int64_t base = 0, rem = o;
      for (int d = g.nk - 1; d >= 0; --d) {
        base += (rem % g.ksize[d]) * g.kstride[d];
        rem /= g.ksize[d];
      }
      auto a = general_pass<0>(x, g, base, r, 0.0);
      double prev = 0;
      if constexpr (R::kPasses == 2) {
        prev = r.mid(a, g.nred);
        a = general_pass<1>(x, g, base, r, prev);
      }
      y[o] = r.finish(a, prev, g.nred);
    }
  });
}

const ir::Node& input0(const ir::Node& n) {
  return *n.inputs[0];
}

template <class A>
Geom geom_of(const ir::Node& n) {
  return make_geom(input0(n).shape, n.attr<A>().dims, n.name());
}

}  // namespace

void cpu_Sum(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  Geom g = geom_of<ir::AxesAttrs>(n);
  dispatch_all(input0(n).dtype, [&]<class T>(T*) {
    if constexpr (std::is_floating_point_v<compute_t<T>>)
      run_reduce(g, static_cast<const T*>(in[0]), static_cast<T*>(out), SumR<T, T>{});
    else
      run_reduce(g, static_cast<const T*>(in[0]), static_cast<int64_t*>(out), SumR<T, int64_t>{});
  });
}

void cpu_Mean(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  Geom g = geom_of<ir::AxesAttrs>(n);
  dispatch_float(input0(n).dtype, "mean", [&]<class T>(T*) {
    run_reduce(g, static_cast<const T*>(in[0]), static_cast<T*>(out), MeanR<T>{});
  });
}

void cpu_Max(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  Geom g = geom_of<ir::AxesAttrs>(n);
  dispatch_all(input0(n).dtype, [&]<class T>(T*) {
    run_reduce(g, static_cast<const T*>(in[0]), static_cast<T*>(out), ExtremumR<T, true>{});
  });
}

void cpu_Min(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  Geom g = geom_of<ir::AxesAttrs>(n);
  dispatch_all(input0(n).dtype, [&]<class T>(T*) {
    run_reduce(g, static_cast<const T*>(in[0]), static_cast<T*>(out), ExtremumR<T, false>{});
  });
}

void cpu_Var(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  Geom g = geom_of<ir::VarAttrs>(n);
  double c = n.attr<ir::VarAttrs>().correction;
  dispatch_float(input0(n).dtype, "var", [&]<class T>(T*) {
    run_reduce(g, static_cast<const T*>(in[0]), static_cast<T*>(out), VarR<T>{c});
  });
}

void cpu_LogSumExp(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                   void* out) {
  Geom g = geom_of<ir::AxesAttrs>(n);
  dispatch_float(input0(n).dtype, "logsumexp", [&]<class T>(T*) {
    run_reduce(g, static_cast<const T*>(in[0]), static_cast<T*>(out), LseR<T>{});
  });
}

void cpu_Norm(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  Geom g = geom_of<ir::NormAttrs>(n);
  double p = n.attr<ir::NormAttrs>().p;
  dispatch_float(input0(n).dtype, "norm", [&]<class T>(T*) {
    const T* x = static_cast<const T*>(in[0]);
    T* y = static_cast<T*>(out);
    if (p == 2)
      run_reduce(g, x, y, NormR<T, 2>{p});
    else if (p == 1)
      run_reduce(g, x, y, NormR<T, 1>{p});
    else
      run_reduce(g, x, y, NormR<T, 0>{p});
  });
}

// First index of the maximum along one dim (or the flattened tensor); NaN counts as the
// maximum, as in torch.
void cpu_Argmax(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  Geom g = geom_of<ir::AxesAttrs>(n);
  CS_CHECK(g.simple, "internal: argmax over more than one dim");
  int64_t* y = static_cast<int64_t*>(out);
  dispatch_all(input0(n).dtype, [&]<class T>(T*) {
    using C = compute_t<T>;
    const T* x = static_cast<const T*>(in[0]);
    const int64_t outer = g.outer, R_ = g.R, inner = g.inner;
    auto better = [](C v, C best) {
      if constexpr (std::is_floating_point_v<C>)
        return best == best && (v > best || v != v);
      else
        return v > best;
    };
    if (inner == 1) {
      int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(R_, 1));
      parallel_for(outer, grain, [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) {
          const T* row = x + o * R_;
          C best = load(row[0]);
          int64_t bi = 0;
          for (int64_t i = 1; i < R_; ++i) {
            C v = load(row[i]);
            if (better(v, best)) {
              best = v;
              bi = i;
            }
          }
          y[o] = bi;
        }
      });
      return;
    }
    const int64_t tiles = (inner + kTile - 1) / kTile;
    int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, R_ * kTile));
    parallel_for(outer * tiles, grain, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / tiles, j0 = (t % tiles) * kTile;
        int w = static_cast<int>(std::min<int64_t>(kTile, inner - j0));
        const T* base = x + o * R_ * inner + j0;
        C best[kTile];
        int64_t bi[kTile] = {};
        for (int j = 0; j < w; ++j) best[j] = load(base[j]);
        for (int64_t i = 1; i < R_; ++i)
#pragma omp simd
          for (int j = 0; j < w; ++j) {
            C v = load(base[i * inner + j]);
            if (better(v, best[j])) {
              best[j] = v;
              bi[j] = i;
            }
          }
        for (int j = 0; j < w; ++j) y[o * inner + j0 + j] = bi[j];
      }
    });
  });
}

}  // namespace cstorch::cpu
