// CPU kernels for fused scaled-dot-product attention (flash-attention style).
//
// Forward: one task per (batch, head, block of kBq query rows). Keys are visited in tiles of
// up to kBkMax; each tile's scores S = scale * Q K^T (+ bias, masks) live in a per-thread
// scratch tile, an online softmax keeps the row max m and sum l, and the output accumulator is
// rescaled when the max grows. Memory per thread is O(kBq * (kBkMax + Dv)) whatever Tq, Tk.
//
// Backward: one task per (batch, head) (dK and dV of a head are sums over all its query blocks,
// so a head's query blocks run in one task; no atomics). Per query block the softmax
// statistics are recomputed (see src/ops/attention.cpp: when the keys fit one tile, the score
// tile of that pass is kept and reused, so nothing is computed twice), then per key tile:
//   P = exp(S - m) / l, Pd = P * Z (dropout keep mask / (1 - p)),
//   dV += Pd^T dO, dP = dO V^T, dS = P * (dP * Z - Delta) with Delta = rowsum(dO * O),
//   dQ += scale * dS K, dK += scale * dS^T Q, dBias += dS.
// A bias gradient that broadcasts over B or H is summed by the tasks sharing its slice, so
// such tasks are grouped into one.
//
// GEMMs are single-threaded calls on per-thread tiles (sgemm_serial: the own AVX-512 GEMM or
// OpenBLAS). Scratch is the node's planned workspace: one slot per thread of the (capped)
// parallel loop, holding the tiles and the packed B^T panels of the thread's GEMMs.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/blas.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/vec_math.h"
#include "backend/philox.h"
#include "cstorch/core/error.h"

namespace cstorch::cpu {
namespace {

using rng::PhiloxStream;

constexpr int64_t kBq = 64;      // query rows per block
constexpr int64_t kBkMax = 512;  // keys per tile
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// A [.., .., .., ..] input broadcast to [B, H, Tq, Tk]: element strides, 0 where broadcast.
template <class T>
struct Bcast {
  const T* p = nullptr;
  int64_t sb = 0, sh = 0, sq = 0, sk = 0;
  const T* row(int64_t b, int64_t h, int64_t i) const { return p + b * sb + h * sh + i * sq; }
};

template <class T>
Bcast<T> bcast_of(const ir::Node& in, const void* data) {
  Bcast<T> r;
  r.p = static_cast<const T*>(data);
  int64_t d[4] = {1, 1, 1, 1};
  const size_t rank = in.shape.size();
  for (size_t j = 0; j < rank; ++j) d[4 - rank + j] = in.shape[j];
  int64_t s[4], acc = 1;
  for (int j = 3; j >= 0; --j) {
    s[j] = d[j] == 1 ? 0 : acc;
    acc *= d[j];
  }
  r.sb = s[0];
  r.sh = s[1];
  r.sq = s[2];
  r.sk = s[3];
  return r;
}

struct Geo {
  int64_t B, H, Tq, Tk, D, Dv;
  // Row strides (between consecutive positions of one head) and head bases.
  int64_t qrow, krow, vrow, orow;
  bool bthd;
  // Heads stored at each position of the inputs (H, or 3H for a packed q, k, v: AttentionAttrs
  // qkv), and the first head of k and of v there (0, or H and 2H).
  int64_t hs, kh0, vh0;
  int64_t q(int64_t b, int64_t h) const {
    return bthd ? (b * Tq * hs + h) * D : (b * H + h) * Tq * D;
  }
  int64_t k(int64_t b, int64_t h) const {
    return bthd ? (b * Tk * hs + kh0 + h) * D : (b * H + h) * Tk * D;
  }
  int64_t v(int64_t b, int64_t h) const {
    return bthd ? (b * Tk * hs + vh0 + h) * Dv : (b * H + h) * Tk * Dv;
  }
  int64_t o(int64_t b, int64_t h) const {
    return bthd ? (b * Tq * H + h) * Dv : (b * H + h) * Tq * Dv;
  }
};

struct Ctx {
  Geo g;
  ir::AttentionAttrs at;
  // The kernel's workspace: `slots` per-thread scratch areas of `slot_floats` floats, each the
  // tiles then the GEMMs' packed panels (gemm_ws: the same slots, at offset tile_floats).
  float* ws = nullptr;
  size_t slot_floats = 0;
  int slots = 0;
  Scratch gemm_ws;
  float* scratch() const {
    const int t = omp_get_thread_num();
    CS_CHECK(t < slots, "attention: thread {} has no workspace slot ({} planned)", t, slots);
    return ws + static_cast<size_t>(t) * slot_floats;
  }
  const float *Q, *K, *V;
  Bcast<float> bias;
  Bcast<uint8_t> mask;
  PhiloxStream rng{};
  float keep_p = 1, inv_keep = 1;
  // Dropout keep threshold on the 24-bit uniform, as the Bernoulli op draws it.
  bool keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
    const int64_t idx = ((b * g.H + h) * g.Tq + i) * g.Tk + j;
    const float u = static_cast<float>(rng.at(idx).w[0] >> 8) * (1.0f / 16777216.0f);
    return u < keep_p;
  }
  // Keys [0, end) can be visible to query rows [i0, i0 + nr).
  int64_t key_end(int64_t i0, int64_t nr) const {
    if (!at.causal) return g.Tk;
    return std::clamp<int64_t>(i0 + nr + at.causal_offset, 0, g.Tk);
  }
};

Geo geometry(const ir::Node& n) {
  const auto& at = n.attr<ir::AttentionAttrs>();
  const auto& qs = n.inputs[0]->shape;
  const auto& ks = n.inputs[1]->shape;
  const auto& vs = n.inputs[2]->shape;
  const int t = at.bthd ? 1 : 2, h = at.bthd ? 2 : 1;
  Geo g{};
  g.B = qs[0];
  g.hs = qs[h];
  g.H = at.qkv ? g.hs / 3 : g.hs;
  g.Tq = qs[t];
  g.Tk = ks[t];
  g.D = qs[3];
  g.Dv = vs[3];
  g.bthd = at.bthd;
  g.kh0 = at.qkv ? g.H : 0;
  g.vh0 = at.qkv ? 2 * g.H : 0;
  return g;
}

// Floats of one thread's tiles: the forward's score tile, output accumulator and row
// statistics; the backward's three score-sized tiles and row statistics. A 64-byte multiple.
size_t tile_floats(const ir::Node& n) {
  const Geo g = geometry(n);
  const int64_t bk = std::min(g.Tk, kBkMax);
  const int64_t f =
      n.op == ir::OpCode::Attention ? kBq * (bk + g.Dv) + 2 * kBq : 3 * kBq * bk + 3 * kBq;
  return static_cast<size_t>((f + 15) / 16 * 16);
}

// Floats of one thread's GEMM scratch, the most any of its products packs: Q K^T (B^T: N = keys
// of a tile <= bk, K = D) and S V (N = Dv, K = keys); backward also dO V^T (B^T, K = Dv), P^T dO
// (N = Dv, K = query rows <= kBq), dP K (N = D, K = keys) and dP^T Q (N = D, K = query rows).
// Untransposed products pack B too when K spans several blocks. A 64-byte multiple.
size_t gemm_floats(const ir::Node& n) {
  const Geo g = geometry(n);
  const int64_t bk = std::min(g.Tk, kBkMax);
  size_t f = std::max(sgemm_avx512_scratch_floats(bk, g.D, false, true, false),
                      sgemm_avx512_scratch_floats(g.Dv, bk, false, false, false));
  if (n.op == ir::OpCode::AttentionGrad) {
    for (size_t x : {sgemm_avx512_scratch_floats(bk, g.Dv, false, true, false),
                     sgemm_avx512_scratch_floats(g.Dv, kBq, false, false, false),
                     sgemm_avx512_scratch_floats(g.D, bk, false, false, false),
                     sgemm_avx512_scratch_floats(g.D, kBq, false, false, false)})
      f = std::max(f, x);
  }
  return (f + 15) / 16 * 16;
}

size_t slot_floats(const ir::Node& n) {
  return tile_floats(n) + gemm_floats(n);
}

Ctx make_ctx(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in) {
  Ctx c;
  c.at = n.attr<ir::AttentionAttrs>();
  c.slot_floats = slot_floats(n);
  c.ws = static_cast<float*>(ctx.workspace);
  c.slots = static_cast<int>(ctx.workspace_bytes / (c.slot_floats * sizeof(float)));
  CS_CHECK(c.slots >= 1, "{}: the kernel needs a workspace of at least {} bytes, got {}", n.name(),
           c.slot_floats * sizeof(float), ctx.workspace_bytes);
  const size_t tiles = tile_floats(n);
  c.gemm_ws = Scratch{c.ws + tiles, c.slot_floats, c.slot_floats - tiles, c.slots, n.name()};
  Geo& g = c.g;
  g = geometry(n);
  g.qrow = c.at.bthd ? g.hs * g.D : g.D;
  g.krow = g.qrow;
  g.vrow = c.at.bthd ? g.hs * g.Dv : g.Dv;
  g.orow = c.at.bthd ? g.H * g.Dv : g.Dv;
  c.Q = static_cast<const float*>(in[0]);
  c.K = static_cast<const float*>(in[1]);
  c.V = static_cast<const float*>(in[2]);
  size_t i = 3;
  if (c.at.has_bias) {
    c.bias = bcast_of<float>(*n.inputs[i], in[i]);
    ++i;
  }
  if (c.at.has_mask) {
    c.mask = bcast_of<uint8_t>(*n.inputs[i], in[i]);
    ++i;
  }
  if (c.at.dropout_p > 0) {
    c.rng = PhiloxStream::of(in[i]);
    c.keep_p = static_cast<float>(1.0 - c.at.dropout_p);
    c.inv_keep = static_cast<float>(1.0 / (1.0 - c.at.dropout_p));
  }
  return c;
}

// S[r, c] (ld nc) = scale * q_i . k_j + bias, or -inf where masked, for rows i0.. and keys j0..
void scores(const Ctx& c, int64_t b, int64_t h, int64_t i0, int64_t nr, int64_t j0, int64_t nc,
            float* S) {
  const Geo& g = c.g;
  sgemm_serial(false, true, nr, nc, g.D, static_cast<float>(c.at.scale),
               c.Q + g.q(b, h) + i0 * g.qrow, g.qrow, c.K + g.k(b, h) + j0 * g.krow, g.krow, 0.f, S,
               nc, c.gemm_ws);
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t i = i0 + r;
    float* row = S + r * nc;
    if (c.at.has_bias) {
      const float* bp = c.bias.row(b, h, i) + j0 * c.bias.sk;
      if (c.bias.sk) {
#pragma omp simd
        for (int64_t j = 0; j < nc; ++j) row[j] += bp[j];
      } else {
        const float bv = bp[0];
#pragma omp simd
        for (int64_t j = 0; j < nc; ++j) row[j] += bv;
      }
    }
    if (c.at.has_mask) {
      const uint8_t* mp = c.mask.row(b, h, i) + j0 * c.mask.sk;
      if (c.mask.sk) {
#pragma omp simd
        for (int64_t j = 0; j < nc; ++j) row[j] = mp[j] ? row[j] : kNegInf;
      } else if (!mp[0]) {
        for (int64_t j = 0; j < nc; ++j) row[j] = kNegInf;
      }
    }
    if (c.at.causal) {
      const int64_t first = std::max<int64_t>(0, i + c.at.causal_offset + 1 - j0);
      for (int64_t j = first; j < nc; ++j) row[j] = kNegInf;
    }
  }
}

float row_max(const float* x, int64_t n) {
  float m = kNegInf;
#pragma omp simd reduction(max : m)
  for (int64_t j = 0; j < n; ++j) m = x[j] > m ? x[j] : m;
  return m;
}

// x <- exp(x - m) (0 where x = -inf or m = -inf); returns the sum.
float exp_shift(float* x, int64_t n, float m) {
  if (m == kNegInf) {
    std::memset(x, 0, sizeof(float) * n);
    return 0.f;
  }
  vexp_n(x, x, n, m);
  float s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < n; ++j) s += x[j];
  return s;
}

void forward_block(const Ctx& c, int64_t b, int64_t h, int64_t i0, int64_t nr, float* out) {
  const Geo& g = c.g;
  const int64_t bk = std::min(g.Tk, kBkMax);
  float* S = c.scratch();
  float* acc = S + kBq * bk;
  float* m = acc + kBq * g.Dv;
  float* l = m + kBq;
  std::fill(acc, acc + nr * g.Dv, 0.f);
  std::fill(m, m + nr, kNegInf);
  std::fill(l, l + nr, 0.f);
  const int64_t jend = c.key_end(i0, nr);
  for (int64_t j0 = 0; j0 < jend; j0 += bk) {
    const int64_t nc = std::min(bk, jend - j0);
    scores(c, b, h, i0, nr, j0, nc, S);
    for (int64_t r = 0; r < nr; ++r) {
      float* row = S + r * nc;
      const float mnew = std::max(m[r], row_max(row, nc));
      const float sum = exp_shift(row, nc, mnew);
      if (mnew == kNegInf) continue;  // nothing visible yet: acc and l stay 0
      const float alpha = m[r] == kNegInf ? 0.f : vexp(m[r] - mnew);
      l[r] = l[r] * alpha + sum;
      m[r] = mnew;
      if (alpha != 1.f) {
        float* a = acc + r * g.Dv;
#pragma omp simd
        for (int64_t d = 0; d < g.Dv; ++d) a[d] *= alpha;
      }
      if (c.at.dropout_p > 0) {
        for (int64_t j = 0; j < nc; ++j)
          row[j] = c.keep(b, h, i0 + r, j0 + j) ? row[j] * c.inv_keep : 0.f;
      }
    }
    sgemm_serial(false, false, nr, g.Dv, nc, 1.f, S, nc, c.V + g.v(b, h) + j0 * g.vrow, g.vrow, 1.f,
                 acc, g.Dv, c.gemm_ws);
  }
  float* o = out + g.o(b, h) + i0 * g.orow;
  for (int64_t r = 0; r < nr; ++r) {
    const float inv = l[r] > 0 ? 1.f / l[r] : 0.f;
    const float* a = acc + r * g.Dv;
    float* orow = o + r * g.orow;
#pragma omp simd
    for (int64_t d = 0; d < g.Dv; ++d) orow[d] = a[d] * inv;
  }
}

}  // namespace

void cpu_Attention(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                   void* out) {
  const Ctx c = make_ctx(ctx, n, in);
  const Geo& g = c.g;
  const int64_t nqb = (g.Tq + kBq - 1) / kBq;
  const int64_t tasks = g.B * g.H * nqb;
  if (g.Tk == 0) {  // no keys: every row is fully masked
    std::memset(out, 0, n.nbytes());
    return;
  }
  float* o = static_cast<float*>(out);
  parallel_for(
      tasks, 1,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t bh = t / nqb, qb = t % nqb;
          const int64_t i0 = qb * kBq;
          forward_block(c, bh / g.H, bh % g.H, i0, std::min(kBq, g.Tq - i0), o);
        }
      },
      c.slots);
}

namespace {

struct GradOut {
  float *dq, *dk, *dv, *dbias;
  Bcast<float> db;  // dbias with the bias's broadcast strides (writable through const_cast)
};

void zero_rows(float* p, int64_t rows, int64_t stride, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) std::memset(p + r * stride, 0, sizeof(float) * width);
}

void backward_head(const Ctx& c, const float* O, const float* dO, const GradOut& go, int64_t b,
                   int64_t h) {
  const Geo& g = c.g;
  const int64_t bk = std::min(g.Tk, kBkMax);
  const bool drop = c.at.dropout_p > 0;
  float* S = c.scratch();
  float* Pd = S + kBq * bk;
  float* dP = Pd + kBq * bk;
  float* m = dP + kBq * bk;
  float* l = m + kBq;
  float* delta = l + kBq;
  const float scale = static_cast<float>(c.at.scale);
  const float* Qh = c.Q + g.q(b, h);
  const float* Kh = c.K + g.k(b, h);
  const float* Vh = c.V + g.v(b, h);
  const float* Oh = O + g.o(b, h);
  const float* dOh = dO + g.o(b, h);
  float* dQh = go.dq + g.q(b, h);
  float* dKh = go.dk + g.k(b, h);
  float* dVh = go.dv + g.v(b, h);
  zero_rows(dQh, g.Tq, g.qrow, g.D);
  zero_rows(dKh, g.Tk, g.krow, g.D);
  zero_rows(dVh, g.Tk, g.vrow, g.Dv);
  for (int64_t i0 = 0; i0 < g.Tq; i0 += kBq) {
    const int64_t nr = std::min(kBq, g.Tq - i0);
    for (int64_t r = 0; r < nr; ++r) {
      const float* a = Oh + (i0 + r) * g.orow;
      const float* d = dOh + (i0 + r) * g.orow;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < g.Dv; ++j) s += a[j] * d[j];
      delta[r] = s;
    }
    const int64_t jend = c.key_end(i0, nr);
    const int64_t ntiles = (jend + bk - 1) / bk;
    // Pass 1: row max and sum over all visible keys (online over tiles).
    std::fill(m, m + nr, kNegInf);
    std::fill(l, l + nr, 0.f);
    for (int64_t j0 = 0; j0 < jend; j0 += bk) {
      const int64_t nc = std::min(bk, jend - j0);
      scores(c, b, h, i0, nr, j0, nc, S);
      for (int64_t r = 0; r < nr; ++r) {
        float* row = S + r * nc;
        const float mnew = std::max(m[r], row_max(row, nc));
        if (mnew == kNegInf) continue;
        // With one tile the exps are kept (pass 2 normalises them in place); with more, pass 2
        // computes the scores again, so they may be overwritten here.
        const float s = exp_shift(row, nc, mnew);
        l[r] = (m[r] == kNegInf ? 0.f : l[r] * vexp(m[r] - mnew)) + s;
        m[r] = mnew;
      }
    }
    // Pass 2: gradients tile by tile.
    for (int64_t j0 = 0; j0 < jend; j0 += bk) {
      const int64_t nc = std::min(bk, jend - j0);
      if (ntiles > 1) scores(c, b, h, i0, nr, j0, nc, S);
      for (int64_t r = 0; r < nr; ++r) {
        float* row = S + r * nc;
        if (m[r] == kNegInf || !(l[r] > 0)) {
          std::memset(row, 0, sizeof(float) * nc);
          continue;
        }
        const float inv = 1.f / l[r], mr = m[r];
        if (ntiles > 1) vexp_n(row, row, nc, mr);
#pragma omp simd
        for (int64_t j = 0; j < nc; ++j) row[j] *= inv;
      }
      const float* P = S;
      if (drop) {
        for (int64_t r = 0; r < nr; ++r)
          for (int64_t j = 0; j < nc; ++j)
            Pd[r * nc + j] = c.keep(b, h, i0 + r, j0 + j) ? S[r * nc + j] * c.inv_keep : 0.f;
        P = Pd;
      }
      // dV[j0.., :] += Pd^T dO[i0.., :]
      sgemm_serial(true, false, nc, g.Dv, nr, 1.f, P, nc, dOh + i0 * g.orow, g.orow, 1.f,
                   dVh + j0 * g.vrow, g.vrow, c.gemm_ws);
      // dP = dO V^T
      sgemm_serial(false, true, nr, nc, g.Dv, 1.f, dOh + i0 * g.orow, g.orow, Vh + j0 * g.vrow,
                   g.vrow, 0.f, dP, nc, c.gemm_ws);
      for (int64_t r = 0; r < nr; ++r) {
        const float* p = S + r * nc;
        float* dp = dP + r * nc;
        const float dl = delta[r];
        if (drop) {
          const float* pd = Pd + r * nc;
          // dS = P * (dP * Z - Delta), Z = 1 / (1 - p) where kept, 0 where dropped (where
          // P = 0 the value does not matter, so Pd != 0 tells a kept element).
#pragma omp simd
          for (int64_t j = 0; j < nc; ++j) {
            const float z = pd[j] != 0.f ? c.inv_keep : 0.f;
            dp[j] = p[j] * (dp[j] * z - dl);
          }
        } else {
#pragma omp simd
          for (int64_t j = 0; j < nc; ++j) dp[j] = p[j] * (dp[j] - dl);
        }
        if (go.dbias) {
          float* db = const_cast<float*>(go.db.row(b, h, i0 + r)) + j0 * go.db.sk;
          if (go.db.sk) {
#pragma omp simd
            for (int64_t j = 0; j < nc; ++j) db[j] += dp[j];
          } else {
            float s = 0;
            for (int64_t j = 0; j < nc; ++j) s += dp[j];
            db[0] += s;
          }
        }
      }
      // dQ[i0..] += scale * dS K[j0..];  dK[j0..] += scale * dS^T Q[i0..]
      sgemm_serial(false, false, nr, g.D, nc, scale, dP, nc, Kh + j0 * g.krow, g.krow, 1.f,
                   dQh + i0 * g.qrow, g.qrow, c.gemm_ws);
      sgemm_serial(true, false, nc, g.D, nr, scale, dP, nc, Qh + i0 * g.qrow, g.qrow, 1.f,
                   dKh + j0 * g.krow, g.krow, c.gemm_ws);
    }
  }
}

}  // namespace

void cpu_AttentionGrad(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                       void* out) {
  const Ctx c = make_ctx(ctx, n, in);
  const Geo& g = c.g;
  const size_t k = n.inputs.size();
  const float* O = static_cast<const float*>(in[k - 2]);
  const float* dO = static_cast<const float*>(in[k - 1]);
  GradOut go{};
  go.dq = static_cast<float*>(out);
  // A packed q, k, v gets its gradient in its own layout: dq, dk and dv share one base and
  // take their heads' offsets (Geo), as the inputs do.
  go.dk = c.at.qkv ? go.dq : go.dq + n.inputs[0]->numel();
  go.dv = c.at.qkv ? go.dq : go.dk + n.inputs[1]->numel();
  go.dbias = nullptr;
  // Tasks that add into the same bias-gradient slice (bias broadcast over B or H) run in one
  // group, one after another; groups run in parallel.
  int64_t gb = g.B, gh = g.H;
  if (c.at.bias_grad) {
    go.dbias = c.at.qkv ? go.dq + n.inputs[0]->numel() : go.dv + n.inputs[2]->numel();
    std::memset(go.dbias, 0, sizeof(float) * n.inputs[3]->numel());
    go.db = bcast_of<float>(*n.inputs[3], go.dbias);
    if (go.db.sb == 0) gb = 1;
    if (go.db.sh == 0) gh = 1;
  }
  const int64_t per_b = g.B / gb, per_h = g.H / gh;
  parallel_for(
      gb * gh, 1,
      [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t bb = t / gh, hh = t % gh;
          for (int64_t x = 0; x < per_b; ++x)
            for (int64_t y = 0; y < per_h; ++y) {
              const int64_t b = gb == 1 ? x : bb, h = gh == 1 ? y : hh;
              backward_head(c, O, dO, go, b, h);
            }
        }
      },
      c.slots);
}

size_t attention_workspace_bytes(const ir::Node& n, int threads) {
  return static_cast<size_t>(std::max(threads, 1)) * slot_floats(n) * sizeof(float);
}

}  // namespace cstorch::cpu
