// CPU kernels for the fused layer norm (LayerNorm, LayerNormGrad; their rules are in
// src/ops/nn.cpp). A row is normalised in one pass while it is in L1, where the ops layer_norm
// is otherwise built from (mean, var, sub, rsqrt, mul, add and their gradients) each pass over
// the whole tensor. Rows are split over the team; a row's sums are taken in one order, and the
// weight and bias gradients (sums over the rows) are summed over fixed chunks of rows, then the
// chunks in order: results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "cstorch/core/error.h"

namespace cstorch::cpu {
namespace {

struct LnGeo {
  int64_t rows = 0, D = 0;
};
LnGeo ln_geo(const ir::Node& x, int64_t dims) {
  LnGeo g;
  g.D = 1;
  for (size_t i = x.shape.size() - static_cast<size_t>(dims); i < x.shape.size(); ++i)
    g.D *= x.shape[i];
  g.rows = g.D == 0 ? 0 : x.numel() / g.D;
  return g;
}

constexpr int64_t kBlock = 256;  // elements of a row summed in f32 before the double sum
constexpr int kLanes = 16;       // partial sums of a block (see cpu_LayerNormGrad)

// Rows handled together by one chunk of a parallel loop: at least ~16K elements.
int64_t row_grain(int64_t D) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(D, 1));
}

// Rows of one partial sum of LayerNormParamGrad: a function of the row count alone, so the
// sums' order does not depend on the thread count; at most 256 chunks.
int64_t param_chunk_rows(int64_t rows) {
  return std::max<int64_t>(64, (rows + 255) / 256);
}
// How many chunks of param_chunk_rows(rows) rows (the last may be shorter).
int64_t param_chunks(int64_t rows) {
  const int64_t per = param_chunk_rows(rows);
  return (rows + per - 1) / per;
}

// The mean and 1 / sqrt(biased variance + eps) of one row, both sums in double (two passes
// over the row, which is in L1 by then).
void row_stats(const float* x, int64_t D, double eps, float& mean, float& rstd) {
  double s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < D; ++j) s += x[j];
  const double m = s / static_cast<double>(D);
  double q = 0;
#pragma omp simd reduction(+ : q)
  for (int64_t j = 0; j < D; ++j) {
    const double d = static_cast<double>(x[j]) - m;
    q += d * d;
  }
  mean = static_cast<float>(m);
  rstd = static_cast<float>(1.0 / std::sqrt(q / static_cast<double>(D) + eps));
}

}  // namespace

void cpu_LayerNorm(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                   void* out) {
  const auto& at = n.attr<ir::LayerNormAttrs>();
  const LnGeo g = ln_geo(*n.inputs[0], at.dims);
  const float* x = static_cast<const float*>(in[0]);
  const float* w = at.has_weight ? static_cast<const float*>(in[1]) : nullptr;
  const float* b = at.has_bias ? static_cast<const float*>(in[1 + at.has_weight]) : nullptr;
  float* y = static_cast<float*>(out);
  auto rows = [&]<bool kW, bool kB>(int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * g.D;
      float* yr = y + r * g.D;
      float mean, rstd;
      row_stats(xr, g.D, at.eps, mean, rstd);
#pragma omp simd
      for (int64_t j = 0; j < g.D; ++j) {
        float v = (xr[j] - mean) * rstd;
        if constexpr (kW) v = v * w[j];
        if constexpr (kB) v = v + b[j];
        yr[j] = v;
      }
    }
  };
  parallel_for(g.rows, row_grain(g.D), [&](int64_t r0, int64_t r1) {
    if (w && b)
      rows.template operator()<true, true>(r0, r1);
    else if (w)
      rows.template operator()<true, false>(r0, r1);
    else if (b)
      rows.template operator()<false, true>(r0, r1);
    else
      rows.template operator()<false, false>(r0, r1);
  });
}

// With xhat = (x - mean) * rstd and g = dy * weight (dy without a weight):
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), a row at a time.
void cpu_LayerNormGrad(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                       void* out) {
  const auto& at = n.attr<ir::LayerNormAttrs>();
  const LnGeo g = ln_geo(*n.inputs[1], at.dims);
  const float* dy = static_cast<const float*>(in[0]);
  const float* x = static_cast<const float*>(in[1]);
  const float* w = at.has_weight ? static_cast<const float*>(in[2]) : nullptr;
  float* dx = static_cast<float*>(out);
  const double inv_d = 1.0 / static_cast<double>(g.D);
  auto rows = [&]<bool kW>(int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * g.D;
      const float* dyr = dy + r * g.D;
      float* dxr = dx + r * g.D;
      float m, rs;
      row_stats(xr, g.D, at.eps, m, rs);
      // Sums in f32 over blocks of kBlock (GCC 12 does not vectorise a loop that reduces into
      // double while it computes in f32), added up in double. Within a block, kLanes partial
      // sums, lane l taking elements j0 + l, j0 + l + kLanes, ... in order, then the lanes in
      // order: GCC 12 left this loop scalar when written as an omp simd reduction (the gradient
      // took 4x the forward's time), and fixed lanes sum the same way in every variant.
      double sg = 0, sgx = 0;
      for (int64_t j0 = 0; j0 < g.D; j0 += kBlock) {
        const int64_t len = std::min(kBlock, g.D - j0);
        float lg[kLanes] = {}, lgx[kLanes] = {};
        int64_t j = j0;
        for (; j + kLanes <= j0 + len; j += kLanes) {
#pragma omp simd
          for (int l = 0; l < kLanes; ++l) {
            const float xhat = (xr[j + l] - m) * rs;
            const float gj = kW ? dyr[j + l] * w[j + l] : dyr[j + l];
            dxr[j + l] = xhat;  // kept for the second pass
            lg[l] += gj;
            lgx[l] += gj * xhat;
          }
        }
        for (int l = 0; j < j0 + len; ++j, ++l) {
          const float xhat = (xr[j] - m) * rs;
          const float gj = kW ? dyr[j] * w[j] : dyr[j];
          dxr[j] = xhat;
          lg[l] += gj;
          lgx[l] += gj * xhat;
        }
        float bg = 0, bgx = 0;
        for (int l = 0; l < kLanes; ++l) {
          bg += lg[l];
          bgx += lgx[l];
        }
        sg += bg;
        sgx += bgx;
      }
      const float a = static_cast<float>(sg * inv_d), c = static_cast<float>(sgx * inv_d);
#pragma omp simd
      for (int64_t j = 0; j < g.D; ++j) {
        const float gj = kW ? dyr[j] * w[j] : dyr[j];
        dxr[j] = rs * ((gj - a) - dxr[j] * c);
      }
    }
  };
  parallel_for(g.rows, row_grain(g.D), [&](int64_t r0, int64_t r1) {
    if (w)
      rows.template operator()<true>(r0, r1);
    else
      rows.template operator()<false>(r0, r1);
  });
}

// Scratch of a LayerNormParamGrad node: its chunks' column sums (see below).
size_t norm_workspace_bytes(const ir::Node& n, int threads) {
  if (n.op != ir::OpCode::LayerNormParamGrad || n.inputs.size() < 2) return 0;
  const auto& at = n.attr<ir::LayerNormAttrs>();
  const LnGeo g = ln_geo(*n.inputs[1], at.dims);
  const int64_t chunks = param_chunks(g.rows);
  const int64_t sums = static_cast<int64_t>(at.has_weight) + static_cast<int64_t>(at.has_bias);
  return static_cast<size_t>(chunks * sums * g.D) * sizeof(double);
}

// Rows of [n, D]: the weight's gradient, sum over rows of dy * xhat (if has_weight), then the
// bias's, sum over rows of dy (if has_bias). The rows go in chunks of param_chunk_rows(n) (a
// function of n alone): per chunk, each row's statistics and then its terms while the row is
// in L1, into the chunk's column sums (double, rows in order); then each column adds its
// chunks' sums in order. So every sum has one order at any thread count, x and dy are read
// once, and the team splits the rows as layer_norm_grad (run just before, on the same x and dy)
// does, finding its rows in its core's cache. Measured on the Intel Xeon (2 threads, GPT-2
// tiny, CSTORCH_PROFILE=nodes, two runs each): its nine [1024, 256] nodes 1.45-1.49 ms a step
// with the column-split kernel that read x twice, 1.09-1.13 ms so.
void cpu_LayerNormParamGrad(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                            void* out) {
  const auto& at = n.attr<ir::LayerNormAttrs>();
  const LnGeo g = ln_geo(*n.inputs[1], at.dims);
  const float* dy = static_cast<const float*>(in[0]);
  const float* x = static_cast<const float*>(in[1]);
  float* dw = at.has_weight ? static_cast<float*>(out) : nullptr;
  float* db = at.has_bias ? static_cast<float*>(out) + (at.has_weight ? g.D : 0) : nullptr;
  if (g.D == 0) return;
  if (g.rows == 0) {  // no rows: zero sums
    if (dw) std::fill(dw, dw + g.D, 0.f);
    if (db) std::fill(db, db + g.D, 0.f);
    return;
  }
  const size_t need = norm_workspace_bytes(n, 1);
  CS_CHECK(ctx.workspace_bytes >= need,
           "layer_norm_param_grad: the kernel needs a workspace of {} bytes, got {}", need,
           ctx.workspace_bytes);
  const int64_t per = param_chunk_rows(g.rows), chunks = param_chunks(g.rows);
  // Chunk c's sums: weight's at sums + c * stride, bias's after them.
  const int64_t stride = (dw ? g.D : 0) + (db ? g.D : 0);
  double* sums = static_cast<double*>(ctx.workspace);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double* sw = sums + c * stride;
      double* sb = sw + (dw ? g.D : 0);
      if (dw) std::fill(sw, sw + g.D, 0.0);
      if (db) std::fill(sb, sb + g.D, 0.0);
      for (int64_t r = c * per; r < std::min(g.rows, (c + 1) * per); ++r) {
        const float* xr = x + r * g.D;
        const float* dyr = dy + r * g.D;
        if (dw) {
          float m, rs;
          row_stats(xr, g.D, at.eps, m, rs);
#pragma omp simd
          for (int64_t j = 0; j < g.D; ++j)
            sw[j] += static_cast<double>(dyr[j]) * ((xr[j] - m) * rs);
        }
        if (db) {
#pragma omp simd
          for (int64_t j = 0; j < g.D; ++j) sb[j] += dyr[j];
        }
      }
    }
  });
  parallel_for(g.D, 1024, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      double w = 0, b = 0;
      for (int64_t c = 0; c < chunks; ++c) {
        const double* sw = sums + c * stride;
        if (dw) w += sw[j];
        if (db) b += sw[(dw ? g.D : 0) + j];
      }
      if (dw) dw[j] = static_cast<float>(w);
      if (db) db[j] = static_cast<float>(b);
    }
  });
}

}  // namespace cstorch::cpu
