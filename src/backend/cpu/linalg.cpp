// CPU kernels for matmul (batched, broadcasting, transpose flags), linear and the fused Gemm,
// through gemm.cpp's own GEMM or OpenBLAS sgemm. Their scratch memory is the node's planned
// workspace (workspace_bytes below): the f32 copies of 16-bit operands, then one area per thread
// for the packed B panels of the own GEMM (or the product buffer of an OpenBLAS product whose
// output is its addend's storage).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "backend/cpu/blas.h"
#include "backend/cpu/dtype_dispatch.h"
#include "backend/cpu/elementwise_math.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "cstorch/core/error.h"

namespace cstorch::cpu {
namespace {

// bf16 goes through the vectorised whole-array casts: bf16_t's per-element conversion has a
// branch for NaNs that keeps the loop scalar, and a 16-bit product's result passes here.
template <class T>
void widen(const T* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    cast_bf16_to_f32(reinterpret_cast<const uint16_t*>(src), dst, n);
  } else {
    parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = static_cast<float>(src[i]);
    });
  }
}
template <class T>
void narrow(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, bf16_t>) {
    cast_f32_to_bf16(src, reinterpret_cast<uint16_t*>(dst), n);
  } else {
    parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) dst[i] = T(src[i]);
    });
  }
}

// One single-threaded cblas_sgemm. OpenBLAS's OpenMP build threads a call whenever the
// caller's OpenMP thread count is above 1 and it is not inside a parallel region; its own
// threading allocates a job table per call and runs a second team next to ours. So outside a
// parallel region the thread count is set to 1 for the call (a store to the calling thread's
// OpenMP state) and restored after.
void sgemm1(CBLAS_TRANSPOSE TA, CBLAS_TRANSPOSE TB, int64_t M, int64_t N, int64_t K, const float* A,
            int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
            float alpha = 1.f) {
  const bool outside = !omp_in_parallel();
  const int saved = outside ? omp_get_max_threads() : 1;
  if (outside && saved != 1) omp_set_num_threads(1);
  cblas_sgemm(CblasRowMajor, TA, TB, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
              alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta, C,
              static_cast<int>(ldc));
  if (outside && saved != 1) omp_set_num_threads(saved);
}

// Below this many multiply-adds a product runs on one thread: a fork/join costs more.
constexpr double kParallelMinMacs = static_cast<double>(1 << 20);

double macs_of(int64_t M, int64_t N, int64_t K) {
  return static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
}

// Threads for one product: the whole team, or 1 below kParallelMinMacs or inside a parallel
// region.
int gemm_threads(double macs) {
  const int threads = omp_get_max_threads();
  return threads <= 1 || macs < kParallelMinMacs || omp_in_parallel() ? 1 : threads;
}

// The scratch of one gemm() call below, from the product alone: the floats of one thread's area
// (the own GEMM's packed B panels; on the OpenBLAS path with an addend, the product buffer P,
// ldc = N) and the areas it uses when called outside a parallel region by a team of `threads`
// (gemm_threads; P is the calling thread's alone).
struct GemmNeed {
  size_t floats = 0;
  int slots = 0;
};
GemmNeed gemm_need(bool ta, bool tb, int64_t M, int64_t N, int64_t K, bool addend, int threads) {
  if (M <= 0 || N <= 0) return {};
  if (own_gemm_applies(M, N, K, tb)) {
    const size_t f = sgemm_avx512_scratch_floats(N, K, ta, tb, addend);
    if (f == 0) return {};
    return {f, macs_of(M, N, K) < kParallelMinMacs ? 1 : std::max(1, threads)};
  }
  if (addend) return {static_cast<size_t>(M * N), 1};
  return {};
}

// The row (or column) blocks an OpenBLAS product is computed in: one single-threaded sgemm
// each. OpenBLAS rounds an element differently depending on where its micro-tile falls inside
// the call (0.3.21's Zen kernels: 1024 x 128 x 128 computed as two 512-row calls differs from
// one call in 5951 of its 131072 elements), so the blocks never follow the team: a product gives
// the same bits on any number of threads. Products below kParallelMinMacs, or with both sides
// under 32, are one call; larger ones as many blocks as the machine has processors (a power of
// two from 2 to 8, fixed for the process), on boundaries that are multiples of 16. Measured on
// GPT-2 124M (2 threads, AMD EPYC Zen 1): blocks of about 2^26 multiply-adds, up to 8 a
// product, made the step 3-4% slower than 2 blocks (more calls, each packing the shared
// operand again).
struct BlasBlocks {
  bool by_rows = true;
  int64_t len = 0;  // rows (or columns) split
  int64_t count = 1;
  int64_t begin(int64_t c) const { return c == 0 ? 0 : (len * c / count) / 16 * 16; }
  int64_t end(int64_t c) const { return c + 1 == count ? len : begin(c + 1); }
};
int64_t machine_blocks() {
  static const int64_t blocks = [] {
    int64_t b = 2;
    while (b < 8 && 2 * b <= omp_get_num_procs()) b *= 2;
    return b;
  }();
  return blocks;
}
BlasBlocks blas_blocks(bool ta, int64_t M, int64_t N, int64_t K) {
  BlasBlocks b;
  // The longer side is split, except that a transposed A (weight gradients g^T @ x) with
  // enough rows is split by rows: measured on the FC shapes (2 threads), 256 x 784 x 128 takes
  // 250 us by rows vs 315 us by columns.
  b.by_rows = M >= N || (ta && M >= 64);
  b.len = b.by_rows ? M : N;
  if (macs_of(M, N, K) < kParallelMinMacs || (M < 32 && N < 32)) return b;
  b.count = std::max<int64_t>(1, std::min(machine_blocks(), b.len / 16));
  return b;
}

// C = op(A) @ op(B) + beta * C through OpenBLAS, its blocks (blas_blocks) shared by `threads`
// threads of our team (or run in turn on the calling thread). K = 0 scales C by beta (BLAS
// rejects a leading dimension of 0).
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads) {
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.f ? 0.f : beta * C[i * ldc + j];
    return;
  }
  const auto TA = ta ? CblasTrans : CblasNoTrans, TB = tb ? CblasTrans : CblasNoTrans;
  const BlasBlocks bl = blas_blocks(ta, M, N, K);
  auto block = [&](int64_t c) {
    const int64_t b = bl.begin(c), e = bl.end(c);
    if (e <= b) return;
    if (bl.by_rows) {
      sgemm1(TA, TB, e - b, N, K, ta ? A + b : A + b * lda, lda, B, ldb, beta, C + b * ldc, ldc);
    } else {
      sgemm1(TA, TB, M, e - b, K, A, lda, tb ? B + b * ldb : B + b, ldb, beta, C + b, ldc);
    }
  };
  const int team = static_cast<int>(std::min<int64_t>(threads, bl.count));
  if (team <= 1) {
    for (int64_t c = 0; c < bl.count; ++c) block(c);
    return;
  }
#pragma omp parallel for num_threads(team) schedule(static)
  for (int64_t c = 0; c < bl.count; ++c) block(c);
}

// The epilogue of an OpenBLAS product, as one pass over the finished product P (into C; P is C
// unless C is the addend's storage). The bias was accumulated into P already. Same formulas as
// the separate kernels: x + addend * s (contracted to one FMA, as addcmul), relu, relu_grad
// or gelu_grad, then the update p + x * r.
void epilogue_pass(int64_t M, int64_t N, const float* P, float* C, int64_t ldc,
                   const GemmEpilogue& ep) {
  parallel_for(M, std::max<int64_t>(1, kElementwiseGrain / N), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      float* row = C + i * ldc;  // may be prod or the addend: same-index reads only
      const float* prod = P + i * ldc;
      if (ep.addend) {
        const float* add = ep.addend + i * ep.ld_addend;
        const float s = ep.addend_scale;
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) row[j] = prod[j] + add[j] * s;
        prod = row;
      }
      if (ep.relu) {
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) row[j] = prod[j] < 0.f ? 0.f : prod[j];
        prod = row;
      }
      if (ep.gate) {
        const float* y = ep.gate + i * ep.ld_gate;
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) row[j] = relu_grad_f(prod[j], y[j]);
      }
      if (ep.gelu_x)  // the GeluGrad kernel's functions (prod is row: no addend or relu)
        gelu_grad_n(ep.gelu_tanh, prod, ep.gelu_x + i * ep.ld_gelu_x, row, N);
      if (ep.update) {
        float* p = ep.update + i * ep.ld_update;
        const float r = ep.update_scale;
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) p[j] = p[j] + row[j] * r;
      }
    }
  });
}

// C = epilogue(op(A) @ op(B) + beta * C) on the shared pool. Products own_gemm_applies accepts
// run through gemm.cpp on the whole team, the epilogue inside. Those with a short side that
// sgemm_small takes run there. Others run on OpenBLAS: a bias is
// copied into C first and accumulated onto (beta 1; beta must then be 0), large products are
// split into row (or column) blocks, one single-threaded sgemm per thread, and the rest of the
// epilogue follows in one pass. K = 0 gives beta * C (+ epilogue).
// Scratch: `ws` (gemm_need's areas; the own GEMM's team is capped at ws.slots, a call on one
// thread uses area omp_get_thread_num()).
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const Scratch& ws,
          const GemmEpilogue& ep = {}) {
  if (M == 0 || N == 0) return;
  const int threads = gemm_threads(macs_of(M, N, K));
  if (own_gemm_applies(M, N, K, tb) &&
      sgemm_avx512(ta, tb, M, N, K, 1.f, A, lda, B, ldb, beta, C, ldc, threads, ws, ep))
    return;
  // C may be the addend's storage (an in-place state write): the product goes to the calling
  // thread's scratch area first.
  float* P = ep.addend == C ? ws.slot(omp_get_thread_num(), static_cast<size_t>(M * ldc)) : C;
  if (ep.bias) {
    parallel_for(M, std::max<int64_t>(1, kElementwiseGrain / N), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) std::memcpy(P + i * ldc, ep.bias, sizeof(float) * N);
    });
    beta = 1.f;
  }
  if (!sgemm_small(ta, tb, M, N, K, A, lda, B, ldb, beta, P, ldc, threads))
    blas_gemm(ta, tb, M, N, K, A, lda, B, ldb, beta, P, ldc, threads);
  if (ep.addend || ep.relu || ep.gate || ep.gelu_x || ep.update) epilogue_pass(M, N, P, C, ldc, ep);
}

struct MatmulGeom {
  int64_t m, n, k;
  bool ta, tb;
  int64_t nbatch;
  int64_t a_batch, b_batch;  // number of distinct batch matrices in A and B
  // A shared B and an untransposed, unbroadcast A: the batch folds into one tall GEMM.
  bool folds() const { return b_batch == 1 && !ta && a_batch == nbatch; }
  // Many small products: one GEMM per task of a parallel loop. Large products: one after
  // another, each split over the pool.
  bool in_tasks() const { return nbatch > 1 && m * n * k < (1 << 18); }
};

MatmulGeom matmul_geom(const ir::Node& n) {
  const auto& at = n.attr<ir::MatmulAttrs>();
  const Shape& sa = n.inputs[0]->shape;
  const Shape& sb = n.inputs[1]->shape;
  const size_t ra = sa.size(), rb = sb.size();
  MatmulGeom g;
  g.ta = at.trans_a;
  g.tb = at.trans_b;
  g.m = at.trans_a ? sa[ra - 1] : sa[ra - 2];
  g.k = at.trans_a ? sa[ra - 2] : sa[ra - 1];
  g.n = at.trans_b ? sb[rb - 2] : sb[rb - 1];
  g.nbatch = numel(n.shape, 0, n.shape.size() - 2);
  g.a_batch = numel(sa, 0, ra - 2);
  g.b_batch = numel(sb, 0, rb - 2);
  return g;
}

// A kernel's workspace: `shared` floats (the f32 copies of 16-bit operands), then `slots` areas
// of `floats` floats for its gemm() calls. Both parts are 64-byte multiples.
struct Layout {
  size_t shared = 0;
  GemmNeed gemm;
  size_t bytes() const {
    return (shared + gemm.floats * static_cast<size_t>(gemm.slots)) * sizeof(float);
  }
};

size_t round16(size_t floats) {
  return (floats + 15) / 16 * 16;
}

Layout layout_of(size_t shared, GemmNeed g) {
  g.floats = round16(g.floats);
  if (g.floats == 0) g.slots = 0;
  return {round16(shared), g};
}

// bf16 products on sgemm_bf16 (gemm_bf16.cpp) where they are not widened: the f32 result (and a
// Linear's widened bias) in the shared part, the GEMM's packing areas per thread.
// A Matmul whose f32 result holds the bf16 product's value (MatmulAttrs::f32_out).
bool f32_out(const ir::Node& n) {
  return n.op == ir::OpCode::Matmul && n.attr<ir::MatmulAttrs>().f32_out;
}
bool bf16_direct(const ir::Node& n) {
  return (n.dtype == DType::bf16 || f32_out(n)) && n.inputs[0]->dtype == DType::bf16 &&
         n.inputs[1]->dtype == DType::bf16 && !bf16_gemm_widened(-1);
}
Layout bf16_layout(size_t shared, double macs, int threads) {
  const int slots = macs < kParallelMinMacs ? 1 : std::max(1, threads);
  return layout_of(shared, {sgemm_bf16_scratch_floats(), slots});
}
const uint16_t* bits(const void* p) {
  return static_cast<const uint16_t*>(p);
}

Layout matmul_layout(const ir::Node& n, int threads) {
  const MatmulGeom g = matmul_geom(n);
  // f32_out: the output is the GEMM's f32 C, so no result scratch.
  const bool fo = f32_out(n);
  if (bf16_direct(n) && (g.nbatch == 1 || g.folds()))
    return bf16_layout(fo ? 0 : n.numel(), macs_of(g.nbatch * g.m, g.n, g.k), threads);
  const size_t shared = n.inputs[0]->dtype == DType::f32
                            ? 0
                            : n.inputs[0]->numel() + n.inputs[1]->numel() + (fo ? 0 : n.numel());
  if (g.k == 0) return layout_of(shared, {});
  if (g.folds())
    return layout_of(shared, gemm_need(g.ta, g.tb, g.nbatch * g.m, g.n, g.k, false, threads));
  GemmNeed need = gemm_need(g.ta, g.tb, g.m, g.n, g.k, false, threads);
  // One task per product: at most one area per thread of the (capped) loop.
  if (g.in_tasks() && need.floats)
    need.slots = static_cast<int>(std::min<int64_t>(std::max(1, threads), g.nbatch));
  return layout_of(shared, need);
}

Layout linear_layout(const ir::Node& n, int threads) {
  const Shape& sx = n.inputs[0]->shape;
  const int64_t N = n.inputs[1]->shape[0], K = n.inputs[1]->shape[1];
  const int64_t M = numel(sx, 0, sx.size() - 1);
  if (bf16_direct(n))
    return bf16_layout(n.numel() + (n.inputs.size() > 2 ? N : 0), macs_of(M, N, K), threads);
  const size_t shared = n.dtype == DType::f32 ? 0
                                              : n.inputs[0]->numel() + n.inputs[1]->numel() +
                                                    (n.inputs.size() > 2 ? N : 0) + n.numel();
  return layout_of(shared, gemm_need(false, true, M, N, K, false, threads));
}

struct GemmGeom {
  int64_t M, N, K;
};
GemmGeom gemm_geom(const ir::Node& n) {
  const auto& at = n.attr<ir::GemmAttrs>();
  const Shape& sa = n.inputs[0]->shape;
  const int64_t N = n.shape.back(), M = n.numel() / std::max<int64_t>(N, 1);
  return {M, N, at.trans_a ? sa[0] : sa.back()};
}

Layout gemm_layout(const ir::Node& n, int threads) {
  const auto& at = n.attr<ir::GemmAttrs>();
  const GemmGeom g = gemm_geom(n);
  return layout_of(0, gemm_need(at.trans_a, at.trans_b, g.M, g.N, g.K, at.addend, threads));
}

// The kernel's view of its workspace (laid out as `l`, for any team): the shared floats and as
// many per-thread areas as the workspace holds. An error naming the op and the sizes when it
// holds less than the shared part and one area.
struct Bound {
  float* shared = nullptr;
  Scratch ws;
};
Bound bind_workspace(const ir::KernelContext& ctx, const ir::Node& n, const Layout& l) {
  const size_t need = (l.shared + l.gemm.floats) * sizeof(float);
  CS_CHECK(ctx.workspace_bytes >= need && (need == 0 || ctx.workspace),
           "{}: the kernel needs a workspace of at least {} bytes ({} floats of f32 operand "
           "copies, then {} floats per thread), got {}",
           n.name(), need, l.shared, l.gemm.floats, ctx.workspace_bytes);
  Bound b;
  b.shared = static_cast<float*>(ctx.workspace);
  b.ws.op = n.name();
  if (l.gemm.floats) {
    b.ws.base = b.shared + l.shared;
    b.ws.stride = b.ws.floats = l.gemm.floats;
    b.ws.slots = static_cast<int>(std::min<size_t>(
        (ctx.workspace_bytes / sizeof(float) - l.shared) / l.gemm.floats, 1 << 20));
  }
  return b;
}

// C[batch, m, n] = op(A)[batch, m, k] @ op(B)[batch, k, n] in f32; batch dims broadcast.
void matmul_f32(const ir::Node& node, const MatmulGeom& g, const float* A, const float* B, float* C,
                const Scratch& ws) {
  const int64_t m = g.m, n = g.n, k = g.k;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::memset(C, 0, sizeof(float) * g.nbatch * m * n);
    return;
  }
  const int lda = static_cast<int>(g.ta ? m : k), ldb = static_cast<int>(g.tb ? k : n);
  if (g.folds()) {
    gemm(g.ta, g.tb, g.nbatch * m, n, k, A, lda, B, ldb, 0.f, C, n, ws);
    return;
  }
  const Shape& sa = node.inputs[0]->shape;
  const Shape& sb = node.inputs[1]->shape;
  const Shape& sc = node.shape;
  const int nbd = static_cast<int>(sc.size()) - 2;
  const int oa = static_cast<int>(sa.size()) - 2 - nbd, ob = static_cast<int>(sb.size()) - 2 - nbd;
  const int64_t amat = m * k, bmat = k * n, cmat = m * n;
  auto gemm_batch = [&](int64_t bi) {
    // Batch offsets of A and B from the output batch index: walk dims from the last, with 0
    // stride where that input broadcasts (size 1 or missing).
    int64_t rem = bi, offa = 0, offb = 0, stra = amat, strb = bmat;
    for (int d = nbd - 1; d >= 0; --d) {
      int64_t i = rem % sc[d];
      rem /= sc[d];
      int64_t da = d + oa >= 0 ? sa[d + oa] : 1, db = d + ob >= 0 ? sb[d + ob] : 1;
      if (da != 1) offa += i * stra;
      if (db != 1) offb += i * strb;
      stra *= da;
      strb *= db;
    }
    gemm(g.ta, g.tb, m, n, k, A + offa, lda, B + offb, ldb, 0.f, C + bi * cmat, n, ws);
  };
  if (g.in_tasks()) {
    // Each task's product uses its thread's area of ws: the loop has at most ws.slots threads.
    parallel_for(
        g.nbatch, std::max<int64_t>(1, (1 << 18) / (m * n * k)),
        [&](int64_t b, int64_t e) {
          for (int64_t bi = b; bi < e; ++bi) gemm_batch(bi);
        },
        ws.floats ? std::max(1, ws.slots) : 0);
  } else {
    for (int64_t bi = 0; bi < g.nbatch; ++bi) gemm_batch(bi);
  }
}

// y[M, N] = x[M, K] @ W[N, K]^T (+ b[N]), the bias as gemm's epilogue.
void linear_f32(int64_t M, int64_t N, int64_t K, const float* x, const float* w, const float* bias,
                float* y, const Scratch& ws) {
  gemm(false, true, M, N, K, x, K, w, K, 0.f, y, N, ws, GemmEpilogue{.bias = bias});
}

}  // namespace

void cpu_Matmul(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const MatmulGeom g = matmul_geom(n);
  const Bound ws = bind_workspace(ctx, n, matmul_layout(n, 1));
  const bool fo = f32_out(n);
  if (n.dtype == DType::f32 && !fo) {
    matmul_f32(n, g, static_cast<const float*>(in[0]), static_cast<const float*>(in[1]),
               static_cast<float*>(out), ws.ws);
    return;
  }
  if (bf16_direct(n) && (g.nbatch == 1 || g.folds())) {
    const int64_t M = g.nbatch * g.m;
    if (fo) {  // the GEMM's C is the output, rounded in the last K block's store
      sgemm_bf16(g.ta, g.tb, M, g.n, g.k, bits(in[0]), g.ta ? g.m : g.k, bits(in[1]),
                 g.tb ? g.k : g.n, static_cast<float*>(out), g.n,
                 gemm_threads(macs_of(M, g.n, g.k)), ws.ws, {.round_c = true});
      return;
    }
    float* c = ws.shared;
    // Rounded to bf16 as the GEMM stores it (c holds the partial sums of a long K).
    sgemm_bf16(g.ta, g.tb, M, g.n, g.k, bits(in[0]), g.ta ? g.m : g.k, bits(in[1]),
               g.tb ? g.k : g.n, c, g.n, gemm_threads(macs_of(M, g.n, g.k)), ws.ws,
               {static_cast<uint16_t*>(out), nullptr});
    return;
  }
  dispatch_float(n.inputs[0]->dtype, "matmul", [&]<class T>(T*) {
    if constexpr (!std::is_same_v<T, float>) {
      const int64_t na = n.inputs[0]->numel(), nb = n.inputs[1]->numel(), nc = n.numel();
      float* a = ws.shared;
      float* b = a + na;
      float* c = fo ? static_cast<float*>(out) : b + nb;
      widen(static_cast<const T*>(in[0]), a, na);
      widen(static_cast<const T*>(in[1]), b, nb);
      matmul_f32(n, g, a, b, c, ws.ws);
      if (fo)
        round_f32_to_bf16(c, nc);
      else
        narrow(c, static_cast<T*>(out), nc);
    }
  });
}

void cpu_Linear(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const Shape& sw = n.inputs[1]->shape;
  const int64_t N = sw[0], K = sw[1];
  const Shape& sx = n.inputs[0]->shape;
  const int64_t M = numel(sx, 0, sx.size() - 1);
  const bool has_bias = n.inputs.size() > 2;
  const Bound ws = bind_workspace(ctx, n, linear_layout(n, 1));
  if (n.dtype == DType::f32) {
    linear_f32(M, N, K, static_cast<const float*>(in[0]), static_cast<const float*>(in[1]),
               has_bias ? static_cast<const float*>(in[2]) : nullptr, static_cast<float*>(out),
               ws.ws);
    return;
  }
  if (bf16_direct(n)) {
    // The bias is added in f32 and the sum rounded once, as the GEMM stores the result (y holds
    // the partial sums of a long K).
    float* y = ws.shared;
    float* b = y + M * N;
    if (has_bias) widen(static_cast<const bf16_t*>(in[2]), b, N);
    sgemm_bf16(false, true, M, N, K, bits(in[0]), K, bits(in[1]), K, y, N,
               gemm_threads(macs_of(M, N, K)), ws.ws,
               {static_cast<uint16_t*>(out), has_bias ? b : nullptr});
    return;
  }
  dispatch_float(n.dtype, "linear", [&]<class T>(T*) {
    if constexpr (!std::is_same_v<T, float>) {
      const int64_t nx = M * K, nw = N * K, nb = has_bias ? N : 0, ny = M * N;
      float* x = ws.shared;
      float* w = x + nx;
      float* b = w + nw;
      float* y = b + nb;
      widen(static_cast<const T*>(in[0]), x, nx);
      widen(static_cast<const T*>(in[1]), w, nw);
      if (has_bias) widen(static_cast<const T*>(in[2]), b, nb);
      linear_f32(M, N, K, x, w, has_bias ? b : nullptr, y, ws.ws);
      narrow(y, static_cast<T*>(out), ny);
    }
  });
}

// Gemm (the compiler's fused product, GemmAttrs): out = op(A) @ op(B) [+ bias] [+ C * s], then
// [relu], then [relu_grad by y | gelu_grad at x], then [P += out * r in place]: gemm with its
// epilogue.
void cpu_Gemm(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const auto& at = n.attr<ir::GemmAttrs>();
  const auto [M, N, K] = gemm_geom(n);
  const Bound ws = bind_workspace(ctx, n, gemm_layout(n, 1));
  GemmEpilogue ep;
  if (at.bias) ep.bias = static_cast<const float*>(in[2]);
  if (at.addend) {
    ep.addend = static_cast<const float*>(in[at.addend_index()]);
    ep.ld_addend = N;
    ep.addend_scale = *static_cast<const float*>(in[at.addend_index() + 1]);
  }
  ep.relu = at.relu;
  if (at.relu_grad) {
    ep.gate = static_cast<const float*>(in[at.update_index() - 1]);
    ep.ld_gate = N;
  }
  if (at.gelu_grad) {
    ep.gelu_x = static_cast<const float*>(in[at.update_index() - 1]);
    ep.ld_gelu_x = N;
    ep.gelu_tanh = at.gelu_tanh;
  }
  if (at.update) {
    // The one kernel that writes an input: the planner's After node makes this buffer the
    // tensor's new value, and the fusion pass checks that nothing reads the old value later.
    ep.update = static_cast<float*>(const_cast<void*>(in[at.update_index()]));
    ep.ld_update = N;
    ep.update_scale = *static_cast<const float*>(in[at.update_index() + 1]);
  }
  gemm(at.trans_a, at.trans_b, M, N, K, static_cast<const float*>(in[0]), at.trans_a ? M : K,
       static_cast<const float*>(in[1]), n.inputs[1]->shape[1], 0.f, static_cast<float*>(out), N,
       ws.ws, ep);
}

void sgemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                  const Scratch& ws) {
  if (own_gemm_applies(M, N, K, tb) &&
      sgemm_avx512(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, ws))
    return;
  sgemm1(ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K, A, lda, B, ldb,
         beta, C, ldc, alpha);
}

// Matmul, Linear and Gemm: the workspace of their layouts for a team of `threads` (device.cpp's
// workspace_bytes).
size_t linalg_workspace_bytes(const ir::Node& n, int threads) {
  switch (n.op) {
    case ir::OpCode::Matmul:
      return matmul_layout(n, threads).bytes();
    case ir::OpCode::Linear:
      return linear_layout(n, threads).bytes();
    case ir::OpCode::Gemm:
      return gemm_layout(n, threads).bytes();
    default:
      return 0;
  }
}

}  // namespace cstorch::cpu
