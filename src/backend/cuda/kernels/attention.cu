// CUDA kernels for fused scaled-dot-product attention (fp32), with the semantics of the CPU
// kernels (backend/cpu/attention.cpp): the same scores (scale * q.k, plus bias, -inf where the
// mask or causality hides a key), the same online softmax, the same dropout mask (Philox, see
// backend/philox.h) and the same treatment of rows with no visible key (output 0, gradients 0).
//
// No Tq x Tk matrix is ever stored. Every kernel works on tiles of kBq query rows by kBk keys
// held in shared memory, one block of 128 threads per tile row or column:
//   forward   one block per (b, h, query tile): key tiles in turn, online softmax (running max m
//             and sum l per row), the output accumulator rescaled when the max grows.
//   backward  (1) stats: the forward's m and l again, and Delta = rowsum(dO * O), per query row
//             into the scratch buffer; (2) dK, dV: one block per (b, h, key tile) looping over
//             the query tiles; (3) dQ: one block per (b, h, query tile) looping over the key
//             tiles; (4) the bias gradient: one block per tile of dbias, looping over the
//             (b, h, query tile, key tile) that broadcast onto it, in order. Each recomputes
//             P = exp(S - m) / l and dS = P * (dP * Z - Delta) for its tiles, so every sum is
//             owned by one block and runs in a fixed order: no atomics, the results do not
//             depend on scheduling.
// Register tiles: in a 32 x 32 score tile a thread owns rows ty + 8a (a < 4) and columns
// tx + 16b (b < 2). In an accumulator (32 rows by the head size) it owns columns kC * tx + c
// (c < kC, so kC * 16 >= the head size), and rows ty + 8a (forward, dQ) or 4 * ty + a (dK, dV).
// Every tile's rows are a multiple of 4 floats apart and 16-byte aligned, so the products read
// 4 consecutive floats with one shared load: along a row of q, k, dO, v, P or dS (the sums'
// index), or across the accumulator's columns. The q, k, v and dO tiles' strides are also an
// odd number of 16-byte words (ld_of), so 8 threads reading 8 rows hit distinct banks.
#include <cmath>
#include <cstdint>

#include "backend/cuda/kernels/attention_launch.h"
#include "backend/cuda/kernels/common.cuh"
#include "backend/philox.h"

namespace cstorch::cuda::k {

using rng::PhiloxStream;

namespace {

constexpr int kTx = 16, kTy = 8;
constexpr int kAttThreads = kTx * kTy;          // 128
constexpr int kBq = 4 * kTy;                    // query rows per tile
constexpr int kBk = 2 * kTx;                    // keys per tile
constexpr int kLdS = kBk + 4;                   // row stride of the score-sized tiles (see below)
constexpr int kRowThreads = kAttThreads / kBq;  // threads sharing a row in the softmax (4)
static_assert(kRowThreads == 4 && kBk % kRowThreads == 0, "softmax row groups are 4 lanes");
static_assert(kBq == kAttentionTile && kBk == kAttentionTile, "the tile of attention_launch.h");
static_assert(kAttentionMaxHeadDim <= 8 * kTx, "accumulators cover the largest head size");

__host__ __device__ inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__host__ __device__ inline int64_t clamp64(int64_t x, int64_t lo, int64_t hi) {
  return x < lo ? lo : x > hi ? hi : x;
}
// Row strides of the q, k, v and dO tiles (see the header comment): a multiple of 4 floats, so
// rows are read 16 bytes at a time, and an odd number of 16-byte words, so the 8 threads of one
// phase of a 16-byte shared load, reading 8 consecutive rows, hit distinct banks.
__host__ __device__ inline int ld_of(int64_t d) {
  const int ld = (static_cast<int>(d) + 3) & ~3;
  return (ld / 4) % 2 ? ld : ld + 4;
}

// Shared memory of one block: tiles of q (kBq rows), dO (kBq), k (kBk), v (kBk), the score-sized
// tiles p and ds, and three per-row vectors (forward: m, l, the rescale factor; backward: m, l,
// Delta). Absent tiles take no space.
struct Tiles {
  float *q, *o, *k, *v, *p, *ds, *m, *l, *x;
  int ldq, ldv;
};
__host__ __device__ inline size_t carve(float* base, int64_t D, int64_t Dv, bool with_o,
                                        bool with_v, bool with_ds, Tiles* t) {
  const int ldq = ld_of(D), ldv = ld_of(Dv);
  size_t off[9], at = 0;
  const size_t sizes[9] = {static_cast<size_t>(kBq) * ldq,
                           with_o ? static_cast<size_t>(kBq) * ldv : 0,
                           static_cast<size_t>(kBk) * ldq,
                           with_v ? static_cast<size_t>(kBk) * ldv : 0,
                           static_cast<size_t>(kBq) * kLdS,
                           with_ds ? static_cast<size_t>(kBq) * kLdS : 0,
                           kBq,
                           kBq,
                           kBq};
  for (int i = 0; i < 9; ++i) {
    off[i] = at;
    at += sizes[i];
  }
  if (t) {
    float** ptrs[9] = {&t->q, &t->o, &t->k, &t->v, &t->p, &t->ds, &t->m, &t->l, &t->x};
    for (int i = 0; i < 9; ++i) *ptrs[i] = base + off[i];
    t->ldq = ldq;
    t->ldv = ldv;
  }
  return at;
}

// Element offsets of head (b, h)'s first row, and the stride between its rows.
__device__ inline int64_t head_of(const Attention& a, int64_t b, int64_t h, int64_t T, int64_t d) {
  return a.bthd ? (b * T * a.H + h) * d : (b * a.H + h) * T * d;
}
__device__ inline int64_t row_stride(const Attention& a, int64_t d) {
  return a.bthd ? a.H * d : d;
}

// Keys [0, end) can be visible to query rows [i0, i0 + nr).
__device__ inline int64_t key_end(const Attention& a, int64_t i0, int64_t nr) {
  if (!a.causal) return a.Tk;
  return clamp64(i0 + nr + a.causal_offset, 0, a.Tk);
}

// Dropout: whether score (b, h, i, j) is kept, from the same 24-bit uniform as the CPU's.
__device__ inline bool kept(const Attention& a, const PhiloxStream& rng, int64_t b, int64_t h,
                            int64_t i, int64_t j) {
  const int64_t idx = ((b * a.H + h) * a.Tq + i) * a.Tk + j;
  const float u = static_cast<float>(rng.at(idx).w[0] >> 8) * (1.0f / 16777216.0f);
  return u < a.keep_p;
}

__device__ inline PhiloxStream stream_of(const Attention& a) {
  return a.rng_state ? PhiloxStream::of(a.rng_state) : PhiloxStream{0, 0, 0, 0};
}

// dst[r * ld + c] = src[r * stride + c] for rows r < valid, 0 for rows valid <= r < rows;
// columns c < width. Consecutive threads read consecutive columns.
__device__ inline void load_rows(float* dst, int ld, const float* __restrict__ src, int64_t stride,
                                 int valid, int rows, int64_t width) {
  const int w = static_cast<int>(width);
  if ((w & 3) == 0 && (stride & 3) == 0 && (reinterpret_cast<uintptr_t>(src) & 15) == 0 &&
      w / 4 <= kAttThreads) {
    // 16 bytes at a time (the shared rows are 16-byte aligned, see ld_of): thread t copies
    // 4-float column t % w4 of rows t / w4, t / w4 + step, ...; one division per thread, not
    // one per element.
    const int w4 = w / 4, step = kAttThreads / w4, c4 = threadIdx.x % w4;
    for (int r = threadIdx.x / w4; r < rows && threadIdx.x < step * w4; r += step) {
      const float4 v = r < valid ? *reinterpret_cast<const float4*>(src + r * stride + 4 * c4)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
      *reinterpret_cast<float4*>(dst + r * ld + 4 * c4) = v;
    }
    return;
  }
  for (int e = threadIdx.x; e < rows * w; e += kAttThreads) {
    const int r = e / w, c = e - r * w;
    dst[r * ld + c] = r < valid ? src[r * stride + c] : 0.f;
  }
}

// An operand of the register-tile products whose lines are rows of a shared tile with row
// stride ld: line i is row first + every * i, and at(i, k) is its k-th element. The index
// expressions stay 32-bit.
struct Rows {
  const float* tile;
  int ld, first, every;
  __device__ float at(int i, int k) const { return tile[(first + every * i) * ld + k]; }
};

// The products below add A(x, k) * B(y, k) into acc[x][y] for k = 0, 1, ..., n - 1 in turn, so
// every accumulator sums in a fixed order.
//
// Both operands' lines are rows (q.k and dO.v over the head size): the same sums, with each
// line read 4 floats at a time by 16-byte shared loads (ld_of's strides keep the rows aligned
// and the loads free of bank conflicts). Every accumulator still adds k = 0, 1, ... in turn,
// so the results are those of the scalar loop bit for bit; it does only the loads' work in a
// quarter of the instructions, which bound this product.
template <int kM, int kN>
__device__ inline void tile_product(float (&acc)[kM][kN], const Rows& a, const Rows& b, int n) {
  const int n4 = n & ~3;
  for (int k = 0; k < n4; k += 4) {
    float4 av[kM], bv[kN];
#pragma unroll
    for (int x = 0; x < kM; ++x)
      av[x] = *reinterpret_cast<const float4*>(a.tile + (a.first + a.every * x) * a.ld + k);
#pragma unroll
    for (int y = 0; y < kN; ++y)
      bv[y] = *reinterpret_cast<const float4*>(b.tile + (b.first + b.every * y) * b.ld + k);
#pragma unroll
    for (int x = 0; x < kM; ++x)
#pragma unroll
      for (int y = 0; y < kN; ++y) acc[x][y] += av[x].x * bv[y].x;
#pragma unroll
    for (int x = 0; x < kM; ++x)
#pragma unroll
      for (int y = 0; y < kN; ++y) acc[x][y] += av[x].y * bv[y].y;
#pragma unroll
    for (int x = 0; x < kM; ++x)
#pragma unroll
      for (int y = 0; y < kN; ++y) acc[x][y] += av[x].z * bv[y].z;
#pragma unroll
    for (int x = 0; x < kM; ++x)
#pragma unroll
      for (int y = 0; y < kN; ++y) acc[x][y] += av[x].w * bv[y].w;
  }
  for (int k = n4; k < n; ++k) {
#pragma unroll
    for (int x = 0; x < kM; ++x)
#pragma unroll
      for (int y = 0; y < kN; ++y) acc[x][y] += a.at(x, k) * b.at(y, k);
  }
}
// acc[x][c] += A(x, k) * b[k * ldb + col0 + c] for k = 0, 1, ..., n - 1 in turn: A's lines are
// rows (P or dS, along the keys), b's columns col0 + c are the accumulator's (kN a multiple of
// 4, col0 too; a group of 4 columns from width on is skipped: past the head size).
template <int kM, int kN>
__device__ inline void tile_product(float (&acc)[kM][kN], const Rows& a, const float* b, int ldb,
                                    int col0, int n, int width) {
  static_assert(kN % 4 == 0, "accumulator columns come 4 at a time");
  // Adds a(x) * b's row k into the accumulators.
  auto add_row = [&](const float (&ax)[kM], int k) {
#pragma unroll
    for (int g = 0; g < kN / 4; ++g) {
      if (col0 + 4 * g >= width) continue;
      const float4 bv = *reinterpret_cast<const float4*>(b + k * ldb + col0 + 4 * g);
#pragma unroll
      for (int x = 0; x < kM; ++x) {
        acc[x][4 * g] += ax[x] * bv.x;
        acc[x][4 * g + 1] += ax[x] * bv.y;
        acc[x][4 * g + 2] += ax[x] * bv.z;
        acc[x][4 * g + 3] += ax[x] * bv.w;
      }
    }
  };
  const int n4 = n & ~3;
  for (int k = 0; k < n4; k += 4) {
    float4 av[kM];
#pragma unroll
    for (int x = 0; x < kM; ++x)
      av[x] = *reinterpret_cast<const float4*>(a.tile + (a.first + a.every * x) * a.ld + k);
    float ax[kM];
#pragma unroll
    for (int x = 0; x < kM; ++x) ax[x] = av[x].x;
    add_row(ax, k);
#pragma unroll
    for (int x = 0; x < kM; ++x) ax[x] = av[x].y;
    add_row(ax, k + 1);
#pragma unroll
    for (int x = 0; x < kM; ++x) ax[x] = av[x].z;
    add_row(ax, k + 2);
#pragma unroll
    for (int x = 0; x < kM; ++x) ax[x] = av[x].w;
    add_row(ax, k + 3);
  }
  for (int k = n4; k < n; ++k) {
    float ax[kM];
#pragma unroll
    for (int x = 0; x < kM; ++x) ax[x] = a.at(x, k);
    add_row(ax, k);
  }
}

// acc[x][c] += a[k * lda + row0 + x] * b[k * ldb + col0 + c] for k = 0, 1, ..., n - 1 in turn:
// both operands' lines are columns (dV += P^T dO, dK += dS^T q, k over the query rows); the 4
// accumulator rows row0 .. row0 + 3 and the columns come 4 at a time.
template <int kN>
__device__ inline void tile_product(float (&acc)[4][kN], const float* a, int lda, int row0,
                                    const float* b, int ldb, int col0, int n, int width) {
  static_assert(kN % 4 == 0, "accumulator columns come 4 at a time");
  for (int k = 0; k < n; ++k) {
    const float4 av = *reinterpret_cast<const float4*>(a + k * lda + row0);
#pragma unroll
    for (int g = 0; g < kN / 4; ++g) {
      if (col0 + 4 * g >= width) continue;
      const float4 bv = *reinterpret_cast<const float4*>(b + k * ldb + col0 + 4 * g);
      const float ax[4] = {av.x, av.y, av.z, av.w};
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        acc[x][4 * g] += ax[x] * bv.x;
        acc[x][4 * g + 1] += ax[x] * bv.y;
        acc[x][4 * g + 2] += ax[x] * bv.z;
        acc[x][4 * g + 3] += ax[x] * bv.w;
      }
    }
  }
}

// This thread's scores of the tile (rows i0 + ty + 8a, keys j0 + tx + 16b), exactly as the CPU's
// `scores`: scale * q.k, + bias, -inf where the mask is false or the key is after the causal
// limit. Out-of-range rows and keys are -inf. Reads the q and k tiles.
__device__ inline void score_tile(const Attention& a, const Tiles& s, int64_t b, int64_t h,
                                  int64_t i0, int nr, int64_t j0, int nc, int tx, int ty,
                                  float sc[4][2]) {
  float acc[4][2] = {};
  tile_product(acc, Rows{s.q, s.ldq, ty, kTy}, Rows{s.k, s.ldq, tx, kTx}, static_cast<int>(a.D));
#pragma unroll
  for (int x = 0; x < 4; ++x) {
#pragma unroll
    for (int y = 0; y < 2; ++y) {
      const int r = ty + kTy * x, c = tx + kTx * y;
      float v = -INFINITY;
      if (r < nr && c < nc) {
        const int64_t i = i0 + r, j = j0 + c;
        v = acc[x][y] * a.scale;
        if (a.bias) {
          const int64_t* st = a.bias_strides;
          v += a.bias[b * st[0] + h * st[1] + i * st[2] + j * st[3]];
        }
        if (a.mask) {
          const int64_t* st = a.mask_strides;
          if (!a.mask[b * st[0] + h * st[1] + i * st[2] + j * st[3]]) v = -INFINITY;
        }
        if (a.causal && j > i + a.causal_offset) v = -INFINITY;
      }
      sc[x][y] = v;
    }
  }
}

// The online softmax step for one key tile, scores in s.p: row r = threadIdx.x / 4 is shared by
// four consecutive lanes, each taking columns part, part + 4, ... The new max, the sum of
// exp(score - max) and the rescale factor of the previous sum follow the CPU step by step (a
// row with nothing visible yet keeps m = -inf, l = 0 and contributes zeros). Leaves the
// probabilities (dropped and scaled when kDropout) in s.p, the new m and l, and the rescale
// factor of the row's accumulator in s.x.
template <bool kDropout>
__device__ inline void softmax_step(const Attention& a, const PhiloxStream& rng, const Tiles& s,
                                    int64_t b, int64_t h, int64_t i0, int nr, int64_t j0, int nc) {
  const int r = threadIdx.x / kRowThreads, part = threadIdx.x % kRowThreads;
  constexpr int kPer = kBk / kRowThreads;
  float* row = s.p + r * kLdS;
  float e[kPer];
  float mx = -INFINITY;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    e[q] = row[part + kRowThreads * q];
    mx = e[q] > mx ? e[q] : mx;  // as the CPU's row max: NaN never wins
  }
#pragma unroll
  for (int o = 1; o < kRowThreads; o <<= 1) {
    const float y = __shfl_xor_sync(0xffffffffu, mx, o);
    mx = y > mx ? y : mx;
  }
  const float mold = s.m[r];
  const float mnew = mold < mx ? mx : mold;
  const bool live = mnew != -INFINITY;
  float sum = 0.f;
#pragma unroll
  for (int q = 0; q < kPer; ++q) {
    e[q] = live ? expf(e[q] - mnew) : 0.f;
    sum += e[q];
  }
#pragma unroll
  for (int o = 1; o < kRowThreads; o <<= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (kDropout && live && r < nr) {
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int c = part + kRowThreads * q;
      if (c < nc) e[q] = kept(a, rng, b, h, i0 + r, j0 + c) ? e[q] * a.inv_keep : 0.f;
    }
  }
#pragma unroll
  for (int q = 0; q < kPer; ++q) row[part + kRowThreads * q] = e[q];
  __syncwarp();  // every lane of the row has read the old m before lane 0 replaces it
  if (part == 0) {
    if (live) {
      const float alpha = mold == -INFINITY ? 0.f : expf(mold - mnew);
      s.l[r] = s.l[r] * alpha + sum;
      s.m[r] = mnew;
      s.x[r] = alpha;
    } else {
      s.x[r] = 1.f;
    }
  }
}

// Forward (kStats false): O for one (b, h, query tile). kStats: the backward's first pass, the
// same m and l (no v, no accumulator) and Delta = rowsum(dO * O), into `stats` as three
// [B * H * Tq] vectors.
template <int kC, bool kStats>
__global__ void __launch_bounds__(kAttThreads)
    attention_forward_kernel(Attention a, float* __restrict__ out, const float* __restrict__ o,
                             const float* __restrict__ dout, float* __restrict__ stats) {
  extern __shared__ __align__(16) float att_smem[];
  Tiles s;
  carve(att_smem, a.D, a.Dv, false, !kStats, false, &s);
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const int64_t nqt = (a.Tq + kBq - 1) / kBq;
  const int64_t bh = blockIdx.x / nqt, b = bh / a.H, h = bh % a.H;
  const int64_t i0 = (blockIdx.x % nqt) * kBq;
  const int nr = static_cast<int>(min64(kBq, a.Tq - i0));
  const int64_t qrow = row_stride(a, a.D), vrow = row_stride(a, a.Dv);
  const float* Qh = a.q + head_of(a, b, h, a.Tq, a.D);
  const float* Kh = a.k + head_of(a, b, h, a.Tk, a.D);
  const float* Vh = a.v + head_of(a, b, h, a.Tk, a.Dv);
  const PhiloxStream rng = stream_of(a);
  load_rows(s.q, s.ldq, Qh + i0 * qrow, qrow, nr, kBq, a.D);
  if (threadIdx.x < kBq) {
    s.m[threadIdx.x] = -INFINITY;
    s.l[threadIdx.x] = 0.f;
  }
  float acc[4][kC];
#pragma unroll
  for (int x = 0; x < 4; ++x)
#pragma unroll
    for (int c = 0; c < kC; ++c) acc[x][c] = 0.f;
  const int Dv = static_cast<int>(a.Dv);
  const int64_t jend = key_end(a, i0, nr);
  for (int64_t j0 = 0; j0 < jend; j0 += kBk) {
    const int nc = static_cast<int>(min64(kBk, jend - j0));
    __syncthreads();  // the previous tile's k, v and p are no longer read
    load_rows(s.k, s.ldq, Kh + j0 * qrow, qrow, nc, kBk, a.D);
    if (!kStats) load_rows(s.v, s.ldv, Vh + j0 * vrow, vrow, nc, kBk, a.Dv);
    __syncthreads();
    float sc[4][2];
    score_tile(a, s, b, h, i0, nr, j0, nc, tx, ty, sc);
#pragma unroll
    for (int x = 0; x < 4; ++x)
#pragma unroll
      for (int y = 0; y < 2; ++y) s.p[(ty + kTy * x) * kLdS + tx + kTx * y] = sc[x][y];
    __syncthreads();
    if (!kStats && a.rng_state)
      softmax_step<true>(a, rng, s, b, h, i0, nr, j0, nc);
    else
      softmax_step<false>(a, rng, s, b, h, i0, nr, j0, nc);
    __syncthreads();
    if (!kStats) {
      // acc = acc * alpha + P V (P already dropped and scaled).
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const float al = s.x[ty + kTy * x];
#pragma unroll
        for (int c = 0; c < kC; ++c) acc[x][c] *= al;
      }
      tile_product(acc, Rows{s.p, kLdS, ty, kTy}, s.v, s.ldv, kC * tx, nc, Dv);
    }
  }
  __syncthreads();  // m and l of every row are final
  if (kStats) {
    // Delta of row r, split over the row's four lanes as in the softmax step.
    const int r = threadIdx.x / kRowThreads, part = threadIdx.x % kRowThreads;
    float d = 0.f;
    if (r < nr) {
      const int64_t base = head_of(a, b, h, a.Tq, a.Dv) + (i0 + r) * vrow;
      for (int c = part; c < Dv; c += kRowThreads) d += o[base + c] * dout[base + c];
    }
#pragma unroll
    for (int off = 1; off < kRowThreads; off <<= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
    if (part == 0 && r < nr) {
      const int64_t n = a.B * a.H * a.Tq, at = bh * a.Tq + i0 + r;
      stats[at] = s.m[r];
      stats[n + at] = s.l[r];
      stats[2 * n + at] = d;
    }
  } else {
    float* Oh = out + head_of(a, b, h, a.Tq, a.Dv);
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int r = ty + kTy * x;
      if (r >= nr) continue;
      const float l = s.l[r];
      const float inv = l > 0 ? 1.f / l : 0.f;
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const int col = kC * tx + c;
        if (col < Dv) Oh[(i0 + r) * vrow + col] = acc[x][c] * inv;
      }
    }
  }
}

// Loads the backward's per-row state of query tile i0: q and dO rows, and m, l, Delta from the
// stats pass (rows past the end: m = -inf, so they contribute nothing).
__device__ inline void load_query_tile(const Attention& a, const Tiles& s, const float* dout,
                                       const float* stats, int64_t b, int64_t h, int64_t i0,
                                       int nr) {
  const int64_t qrow = row_stride(a, a.D), vrow = row_stride(a, a.Dv);
  load_rows(s.q, s.ldq, a.q + head_of(a, b, h, a.Tq, a.D) + i0 * qrow, qrow, nr, kBq, a.D);
  load_rows(s.o, s.ldv, dout + head_of(a, b, h, a.Tq, a.Dv) + i0 * vrow, vrow, nr, kBq, a.Dv);
  const int t = threadIdx.x;
  if (t < kBq) {
    const int64_t n = a.B * a.H * a.Tq, at = (b * a.H + h) * a.Tq + i0 + t;
    s.m[t] = t < nr ? stats[at] : -INFINITY;
    s.l[t] = t < nr ? stats[n + at] : 0.f;
    s.x[t] = t < nr ? stats[2 * n + at] : 0.f;
  }
}

__device__ inline void load_key_tile(const Attention& a, const Tiles& s, int64_t b, int64_t h,
                                     int64_t j0, int nc) {
  const int64_t krow = row_stride(a, a.D), vrow = row_stride(a, a.Dv);
  load_rows(s.k, s.ldq, a.k + head_of(a, b, h, a.Tk, a.D) + j0 * krow, krow, nc, kBk, a.D);
  load_rows(s.v, s.ldv, a.v + head_of(a, b, h, a.Tk, a.Dv) + j0 * vrow, vrow, nc, kBk, a.Dv);
}

// This thread's elements of the tile's Pd (dropped, scaled probabilities) and dS, from the
// loaded q, dO, k, v tiles and row state, as the CPU's pass 2: P = exp(S - m) * (1 / l) (0 on a
// row with nothing visible), Pd = P / (1 - p) where kept else 0, dP = dO . v,
// dS = P * (dP * Z - Delta) with Z = 1 / (1 - p) where Pd != 0 else 0. Padding elements are 0.
__device__ inline void grad_tile(const Attention& a, const PhiloxStream& rng, const Tiles& s,
                                 int64_t b, int64_t h, int64_t i0, int nr, int64_t j0, int nc,
                                 int tx, int ty, float pd[4][2], float ds[4][2]) {
  float sc[4][2];
  score_tile(a, s, b, h, i0, nr, j0, nc, tx, ty, sc);
  float dp[4][2] = {};
  tile_product(dp, Rows{s.o, s.ldv, ty, kTy}, Rows{s.v, s.ldv, tx, kTx}, static_cast<int>(a.Dv));
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    const int r = ty + kTy * x;
    const float m = s.m[r], l = s.l[r], dl = s.x[r];
    const bool dead = m == -INFINITY || !(l > 0);
    const float inv = dead ? 0.f : 1.f / l;
#pragma unroll
    for (int y = 0; y < 2; ++y) {
      const int c = tx + kTx * y;
      if (r >= nr || c >= nc) {
        pd[x][y] = 0.f;
        ds[x][y] = 0.f;
        continue;
      }
      const float p = dead ? 0.f : expf(sc[x][y] - m) * inv;
      if (a.rng_state) {
        // Where P = 0, Pd = 0 whether kept or not: the draw is needed only where P != 0.
        const float d = p != 0.f && kept(a, rng, b, h, i0 + r, j0 + c) ? p * a.inv_keep : 0.f;
        const float z = d != 0.f ? a.inv_keep : 0.f;
        pd[x][y] = d;
        ds[x][y] = p * (dp[x][y] * z - dl);
      } else {
        pd[x][y] = p;
        ds[x][y] = p * (dp[x][y] - dl);
      }
    }
  }
}

// dK and dV for one (b, h, key tile): every query tile that can see the keys, in order.
template <int kC>
__global__ void __launch_bounds__(kAttThreads)
    attention_dkdv_kernel(Attention a, const float* __restrict__ dout,
                          const float* __restrict__ stats, float* __restrict__ dk,
                          float* __restrict__ dv) {
  extern __shared__ __align__(16) float att_smem[];
  Tiles s;
  carve(att_smem, a.D, a.Dv, true, true, true, &s);
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const int64_t nkt = (a.Tk + kBk - 1) / kBk;
  const int64_t bh = blockIdx.x / nkt, b = bh / a.H, h = bh % a.H;
  const int64_t j0 = (blockIdx.x % nkt) * kBk;
  const int nc = static_cast<int>(min64(kBk, a.Tk - j0));
  const PhiloxStream rng = stream_of(a);
  const int D = static_cast<int>(a.D), Dv = static_cast<int>(a.Dv);
  load_key_tile(a, s, b, h, j0, nc);
  float gk[4][kC], gv[4][kC];
#pragma unroll
  for (int x = 0; x < 4; ++x)
#pragma unroll
    for (int c = 0; c < kC; ++c) gk[x][c] = gv[x][c] = 0.f;
  // The first query that can see key j0 is j0 - causal_offset.
  const int64_t ifirst = a.causal ? clamp64(j0 - a.causal_offset, 0, a.Tq) / kBq * kBq : 0;
  for (int64_t i0 = ifirst; i0 < a.Tq; i0 += kBq) {
    const int nr = static_cast<int>(min64(kBq, a.Tq - i0));
    __syncthreads();  // the previous query tile is no longer read
    load_query_tile(a, s, dout, stats, b, h, i0, nr);
    __syncthreads();
    float pd[4][2], ds[4][2];
    grad_tile(a, rng, s, b, h, i0, nr, j0, nc, tx, ty, pd, ds);
#pragma unroll
    for (int x = 0; x < 4; ++x)
#pragma unroll
      for (int y = 0; y < 2; ++y) {
        const int e = (ty + kTy * x) * kLdS + tx + kTx * y;
        s.p[e] = pd[x][y];
        s.ds[e] = ds[x][y];
      }
    __syncthreads();
    // dV[j] += sum_r Pd[r, j] dO[r];  dK[j] += sum_r dS[r, j] q[r] (scaled at the end).
    tile_product(gv, s.p, kLdS, 4 * ty, s.o, s.ldv, kC * tx, nr, Dv);
    tile_product(gk, s.ds, kLdS, 4 * ty, s.q, s.ldq, kC * tx, nr, D);
  }
  const int64_t krow = row_stride(a, a.D), vrow = row_stride(a, a.Dv);
  float* dKh = dk + head_of(a, b, h, a.Tk, a.D);
  float* dVh = dv + head_of(a, b, h, a.Tk, a.Dv);
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    const int r = 4 * ty + x;
    if (r >= nc) continue;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int col = kC * tx + c;
      if (col < D) dKh[(j0 + r) * krow + col] = gk[x][c] * a.scale;
      if (col < Dv) dVh[(j0 + r) * vrow + col] = gv[x][c];
    }
  }
}

// dQ for one (b, h, query tile): every key tile it can see, in order.
template <int kC>
__global__ void __launch_bounds__(kAttThreads)
    attention_dq_kernel(Attention a, const float* __restrict__ dout,
                        const float* __restrict__ stats, float* __restrict__ dq) {
  extern __shared__ __align__(16) float att_smem[];
  Tiles s;
  carve(att_smem, a.D, a.Dv, true, true, true, &s);
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const int64_t nqt = (a.Tq + kBq - 1) / kBq;
  const int64_t bh = blockIdx.x / nqt, b = bh / a.H, h = bh % a.H;
  const int64_t i0 = (blockIdx.x % nqt) * kBq;
  const int nr = static_cast<int>(min64(kBq, a.Tq - i0));
  const PhiloxStream rng = stream_of(a);
  const int D = static_cast<int>(a.D);
  load_query_tile(a, s, dout, stats, b, h, i0, nr);
  float gq[4][kC];
#pragma unroll
  for (int x = 0; x < 4; ++x)
#pragma unroll
    for (int c = 0; c < kC; ++c) gq[x][c] = 0.f;
  const int64_t jend = key_end(a, i0, nr);
  for (int64_t j0 = 0; j0 < jend; j0 += kBk) {
    const int nc = static_cast<int>(min64(kBk, jend - j0));
    __syncthreads();  // the previous key tile and ds are no longer read
    load_key_tile(a, s, b, h, j0, nc);
    __syncthreads();
    float pd[4][2], ds[4][2];
    grad_tile(a, rng, s, b, h, i0, nr, j0, nc, tx, ty, pd, ds);
#pragma unroll
    for (int x = 0; x < 4; ++x)
#pragma unroll
      for (int y = 0; y < 2; ++y) s.ds[(ty + kTy * x) * kLdS + tx + kTx * y] = ds[x][y];
    __syncthreads();
    // dQ[r] += sum_j dS[r, j] k[j] (scaled at the end).
    tile_product(gq, Rows{s.ds, kLdS, ty, kTy}, s.k, s.ldq, kC * tx, nc, D);
  }
  const int64_t qrow = row_stride(a, a.D);
  float* dQh = dq + head_of(a, b, h, a.Tq, a.D);
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    const int r = ty + kTy * x;
    if (r >= nr) continue;
#pragma unroll
    for (int c = 0; c < kC; ++c) {
      const int col = kC * tx + c;
      if (col < D) dQh[(i0 + r) * qrow + col] = gq[x][c] * a.scale;
    }
  }
}

// The bias gradient: dS summed over the dims where the bias broadcasts. One block owns one tile
// of dbias: a (b, h) or, along a broadcast B or H, all of them; a query tile or, when the bias
// broadcasts over queries, all of them; likewise for keys. It visits its (b, h, query tile,
// key tile) in order and adds each tile's dS into its elements: one element per score (no
// broadcast over queries or keys), row sums (broadcast over keys), column sums (over queries),
// or the tile's total.
__global__ void __launch_bounds__(kAttThreads)
    attention_dbias_kernel(Attention a, const float* __restrict__ dout,
                           const float* __restrict__ stats, float* __restrict__ dbias) {
  extern __shared__ __align__(16) float att_smem[];
  Tiles s;
  carve(att_smem, a.D, a.Dv, true, true, true, &s);
  const int t = threadIdx.x, tx = t % kTx, ty = t / kTx;
  const int64_t* st = a.bias_strides;
  const bool per_b = st[0] != 0, per_h = st[1] != 0, per_q = st[2] != 0, per_k = st[3] != 0;
  const int64_t nqt = (a.Tq + kBq - 1) / kBq, nkt = (a.Tk + kBk - 1) / kBk;
  const int64_t nqo = per_q ? nqt : 1, nko = per_k ? nkt : 1, nho = per_h ? a.H : 1;
  int64_t rest = blockIdx.x;
  const int64_t ko = rest % nko;
  rest /= nko;
  const int64_t qo = rest % nqo;
  rest /= nqo;
  const int64_t ho = rest % nho, bo = rest / nho;
  const PhiloxStream rng = stream_of(a);
  constexpr int kPer = kBq * kBk / kAttThreads;  // elements per thread of a full tile (8)
  float acc[kPer] = {};
  for (int64_t b = per_b ? bo : 0; b < (per_b ? bo + 1 : a.B); ++b)
    for (int64_t h = per_h ? ho : 0; h < (per_h ? ho + 1 : a.H); ++h)
      for (int64_t it = per_q ? qo : 0; it < (per_q ? qo + 1 : nqt); ++it)
        for (int64_t jt = per_k ? ko : 0; jt < (per_k ? ko + 1 : nkt); ++jt) {
          const int64_t i0 = it * kBq, j0 = jt * kBk;
          const int nr = static_cast<int>(min64(kBq, a.Tq - i0));
          if (j0 >= key_end(a, i0, nr)) continue;  // every score hidden: dS = 0
          const int nc = static_cast<int>(min64(kBk, a.Tk - j0));
          __syncthreads();  // the previous tiles are no longer read
          load_query_tile(a, s, dout, stats, b, h, i0, nr);
          load_key_tile(a, s, b, h, j0, nc);
          __syncthreads();
          float pd[4][2], ds[4][2];
          grad_tile(a, rng, s, b, h, i0, nr, j0, nc, tx, ty, pd, ds);
#pragma unroll
          for (int x = 0; x < 4; ++x)
#pragma unroll
            for (int y = 0; y < 2; ++y) s.ds[(ty + kTy * x) * kLdS + tx + kTx * y] = ds[x][y];
          __syncthreads();
          // Padding elements of ds are 0, so whole rows and columns are summed.
          if (per_q && per_k) {
#pragma unroll
            for (int q = 0; q < kPer; ++q) {
              const int e = t + kAttThreads * q;
              acc[q] += s.ds[(e / kBk) * kLdS + e % kBk];
            }
          } else if (per_q) {
            if (t < kBq) {
              float r = 0.f;
              for (int c = 0; c < kBk; ++c) r += s.ds[t * kLdS + c];
              acc[0] += r;
            }
          } else if (per_k) {
            if (t < kBk) {
              float c = 0.f;
              for (int r = 0; r < kBq; ++r) c += s.ds[r * kLdS + t];
              acc[0] += c;
            }
          } else if (t < 32) {  // warp 0: row sums, then a fixed shuffle tree
            float r = 0.f;
            for (int c = 0; c < kBk; ++c) r += s.ds[t * kLdS + c];
            for (int o = 16; o > 0; o >>= 1) r += __shfl_down_sync(0xffffffffu, r, o);
            acc[0] += r;
          }
        }
  float* base = dbias + bo * st[0] + ho * st[1];
  if (per_q && per_k) {
#pragma unroll
    for (int q = 0; q < kPer; ++q) {
      const int e = t + kAttThreads * q;
      const int64_t i = qo * kBq + e / kBk, j = ko * kBk + e % kBk;
      if (i < a.Tq && j < a.Tk) base[i * st[2] + j * st[3]] = acc[q];
    }
  } else if (per_q) {
    const int64_t i = qo * kBq + t;
    if (t < kBq && i < a.Tq) base[i * st[2]] = acc[0];
  } else if (per_k) {
    const int64_t j = ko * kBk + t;
    if (t < kBk && j < a.Tk) base[j * st[3]] = acc[0];
  } else if (t == 0) {
    base[0] = acc[0];
  }
}

// Queues kernel on the stream with `smem` bytes of dynamic shared memory (opting in above the
// default 48 KB); nothing for an empty grid.
template <class... P, class... A>
void launch(void (*kernel)(P...), int64_t blocks, size_t smem, void* stream, A... args) {
  if (blocks <= 0) return;
  if (smem > 48 * 1024)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         static_cast<int>(smem));
  kernel<<<static_cast<unsigned>(blocks), kAttThreads, smem, as_stream(stream)>>>(args...);
}

size_t smem_bytes(const Attention& a, bool with_o, bool with_v, bool with_ds) {
  return carve(nullptr, a.D, a.Dv, with_o, with_v, with_ds, nullptr) * sizeof(float);
}

bool small_heads(const Attention& a) {
  return a.D <= 4 * kTx && a.Dv <= 4 * kTx;
}

template <int kC>
void forward(const Attention& a, float* out, void* stream) {
  launch(attention_forward_kernel<kC, false>, a.B * a.H * ((a.Tq + kBq - 1) / kBq),
         smem_bytes(a, false, true, false), stream, a, out, static_cast<const float*>(nullptr),
         static_cast<const float*>(nullptr), static_cast<float*>(nullptr));
}

template <int kC>
void backward(const Attention& a, const float* o, const float* dout, float* dq, float* dk,
              float* dv, float* stats, void* stream) {
  const int64_t qblocks = a.B * a.H * ((a.Tq + kBq - 1) / kBq);
  const int64_t kblocks = a.B * a.H * ((a.Tk + kBk - 1) / kBk);
  launch(attention_forward_kernel<kC, true>, qblocks, smem_bytes(a, false, false, false), stream, a,
         static_cast<float*>(nullptr), o, dout, stats);
  const size_t smem = smem_bytes(a, true, true, true);
  launch(attention_dkdv_kernel<kC>, kblocks, smem, stream, a, dout,
         static_cast<const float*>(stats), dk, dv);
  launch(attention_dq_kernel<kC>, qblocks, smem, stream, a, dout, static_cast<const float*>(stats),
         dq);
}

}  // namespace

void attention_forward(const Attention& a, float* out, void* stream) {
  if (small_heads(a))
    forward<4>(a, out, stream);
  else
    forward<8>(a, out, stream);
}

void attention_backward(const Attention& a, const float* o, const float* dout, float* dq, float* dk,
                        float* dv, float* dbias, float* stats, void* stream) {
  if (small_heads(a))
    backward<4>(a, o, dout, dq, dk, dv, stats, stream);
  else
    backward<8>(a, o, dout, dq, dk, dv, stats, stream);
  if (dbias) {
    const int64_t* st = a.bias_strides;
    const int64_t nqt = (a.Tq + kBq - 1) / kBq, nkt = (a.Tk + kBk - 1) / kBk;
    const int64_t blocks =
        (st[0] ? a.B : 1) * (st[1] ? a.H : 1) * (st[2] ? nqt : 1) * (st[3] ? nkt : 1);
    launch(attention_dbias_kernel, blocks, smem_bytes(a, true, true, true), stream, a, dout,
           static_cast<const float*>(stats), dbias);
  }
}

}  // namespace cstorch::cuda::k
