// cstorch's own f32 GEMM for AVX-512 machines: packed panels, a 12 x 32 register-blocked
// micro-kernel, and one packing of each operand shared by the whole thread team.
//
// Why not only OpenBLAS: on the machines this project is measured on (Sapphire Rapids, 2 cores),
// Debian's OpenBLAS 0.3.21 runs its SkylakeX sgemm at 100-127 GFLOP/s per core, about 55% of
// the 230 GFLOP/s an AVX-512 FMA loop reaches; Debian's BLIS 0.9 only ships its Haswell kernels
// (70-78 GFLOP/s). The small and medium products of training steps (K of 128-1024) spend a large
// share of their time packing, so the packing here is vectorised and done once per team instead
// of once per thread. OpenBLAS stays the path for CPUs without AVX-512 (the variants of the
// kernels built without AVX-512: see variant.h).
//
// Layout (row-major C[M, N] = alpha * op(A)[M, K] @ op(B)[K, N] + beta * C):
//   - op(B) is packed into panels of 32 columns, k-major: Bp[k * 32 + j] (the vector operand),
//     or read in place where packs_b() says it is not packed;
//   - op(A) is read in place, one element broadcast per row and k (the broadcast operand);
//   - the micro-kernel keeps a 12 x 32 tile of C in 24 zmm registers over one K block.
// Blocking: K in blocks of at most kKc (an A micro-panel, 12 x kKc, stays in L1 while the
// B micro-panels stream from L2); packed N in blocks of kNcThread columns per thread (at most kNc)
// so each thread's packed block fits in its L2, in place in blocks of kNcInPlace.
#include "backend/cpu/gemm.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "cstorch/core/error.h"

#include "backend/cpu/elementwise_math.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/tile_rows.h"
#include "backend/cpu/transpose16.h"

namespace cstorch::cpu {

#if CSTORCH_AVX512_KERNELS
namespace {

constexpr int kMr = 12, kNr = 32;
// kNc bounds a packed N block (and so a thread's packing area); a team packs blocks of
// kNcThread columns per thread, so each thread's part stays in its core's L2.
constexpr int64_t kKc = 384, kNc = 1536, kNcThread = 384, kNcInPlace = 320;
constexpr int64_t kPfB = 8;            // rows of B prefetched ahead
constexpr int64_t kLatePrefetch = 16;  // K steps before the loop's end (TileEpilogue::late)

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// K blocks of equal size (at most kKc), so no block is a sliver. With an addend, one K block: C
// may be the addend's own storage (the planner writes a momentum update in place), so no
// partial sum may be stored before the addend is read.
int64_t k_blocks(int64_t K, bool addend) {
  return addend ? 1 : std::max<int64_t>(1, ceil_div(K, kKc));
}

// Whether B is packed: always when transposed (its rows run along K); when read in place it
// would stream more than one K block of rows past every A micro-panel (large K); when its
// rows are a page or more apart (N >= 1024) and enough row panels of A reuse the packing: read
// in place, each k is then a new page, and with a row stride of a multiple of 4 KiB all of a
// panel's rows share one L1 set (GPT-2's [768, 3072] weight gradient, K = 256: 192 -> 232
// GFLOP/s on one core when packed); and with a transposed A (weight gradients) of enough rows,
// more than one column panel and at least kAtMinK steps along K, whose micro-panels are then
// copied too (copy_at, where any packed product's transposed A is copied). Below kAtMinK
// (FC-MNIST's weight gradients over a batch of 128) the product alone ran faster so (256 x 784 x
// 128: 308 -> 337 GFLOP/s, 2 threads) but the step did not: 533 -> 555 us at 2 threads (five
// alternated pairs), the larger scratch having moved the planner's layout under the products after
// it (the first backward product 7 -> 19 us, with the copy itself turned off); not pursued. `M` <
// 0: any M (the scratch bound).
constexpr int64_t kWideB = 1024, kPackRowsMin = 8 * kMr, kAtMinK = 256;
bool packs_b(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  return tb || K > kKc || (N >= kWideB && (M < 0 || M >= kPackRowsMin)) ||
         (ta && N > kNr && K >= kAtMinK && (M < 0 || M >= kPackRowsMin));
}

// Floats of one thread's packed B panels: the column panels of one N block, kNr * kc_max each.
int64_t pack_area(int64_t N, int64_t K, bool addend) {
  return ceil_div(std::min(N, kNc), kNr) * kNr * ceil_div(K, k_blocks(K, addend));
}

// An in-place A whose rows lie a multiple of 4 KiB apart (a leading dimension that is a multiple
// of 1024 floats: 1024, 2048, 3072 ... wide activations) has all twelve rows of a micro-panel in
// the same set of a 32 KiB, 8-way L1, where they evict each other while the kernel broadcasts
// along them. Such a micro-panel is copied, once per K block and reused by every column panel,
// into a buffer whose rows are kc_max + 16 floats apart. Measured on Zen 4, one core: GPT-2
// 124M's MLP-output forward and MLP input gradient (256 x 768 x 3072) 80-92 GFLOP/s with a
// leading dimension of 3072 against 97-101 with 3088; 256 x 768 x 1024 85.6 against 96.1.
bool a_rows_alias(int64_t stride) {
  return stride % 1024 == 0;
}
// The copy's row stride and floats (after a thread's packed B panels in its scratch area).
int64_t a_copy_stride(int64_t kc_max) {
  const int64_t s = kc_max + 16;
  return s % 1024 == 0 ? s + 16 : s;
}
// A transposed A (op(A)[i][k] = A[k * lda + i]) gives the micro-kernel a micro-panel whose K
// steps are rows of A lda floats apart: for the weight gradients of a step, lda is a layer's
// width (768, 2304, 3072, 50304 floats), so the panel's kc lines fall into a few L1 sets (a
// multiple of 4 KiB apart: one set) and are fetched from L2 again for every column panel. Such
// a micro-panel is copied, once per K block and reused by every column panel, into kc lines of
// kAtLine floats (12 used). Measured on an Intel Xeon (AVX-512, 2 threads, bench_peak --gemm,
// medians of five alternated runs): GPT-2 124M's weight-gradient products 264-308 -> 313-378
// GFLOP/s with B packed too, all its products together 303 -> 335.
// Such products also take N blocks of up to kAtBlockFloats packed floats a thread (1 MiB, half
// of an L2 of the Intel Xeon): with 384-column blocks, GPT-2 124M's head weight gradient
// (50304 x 768 x 256) read its A twice; measured there (same runs), its weight-gradient
// products 282-356 -> 324-390 GFLOP/s at 2 threads, 138-173 -> 171-191 at one.
// The micro-panels are copied kAtGroup at a time (96 rows of A: six whole cache lines of each
// row k instead of 12 floats, 48 bytes, from each of kc rows a page or more apart, which no
// hardware prefetcher follows), into kAtGroup * kc lines kept in L2 until the group's last
// micro-panel has run. Measured on the Intel Xeon (bench_peak --shape, three alternated runs
// each): GPT-2 tiny's head weight gradient (8192 x 256 x 1024) 113-119 -> 139-145 GFLOP/s on
// one core, 251-266 -> 268-271 at 2 threads; GPT-2 124M's (50304 x 768 x 256) 114-118 ->
// 121-134 on one core; the GPT-2 tiny step at one thread 391-404 -> 364-389 ms (three
// alternated pairs), at 2 threads within noise (176-185 against 172-185 ms, four pairs).
constexpr int64_t kAtLine = 16, kAtBlockFloats = int64_t{1} << 18, kAtGroup = 8;
int64_t a_copy_floats(int64_t K, bool addend, bool ta) {
  const int64_t kc = ceil_div(K, k_blocks(K, addend));
  return std::max(kMr * a_copy_stride(kc), (ta ? kAtGroup : 1) * kAtLine * kc);
}

}  // namespace

// GCC 12's unpack, shuffle and max intrinsics start from _mm512_undefined_ps(), which its
// -Wuninitialized reports once inlined (a false positive); silenced for the AVX-512 code only.
CSTORCH_INTRINSICS_BEGIN
namespace {

// a * b + c rounded as the elementwise kernels round `a + b * c` (addcmul, the optimizers'
// updates), so that an epilogue is bitwise the separate kernel: one FMA where the build targets
// FMA (the compiler contracts their loops), else a rounded product then a sum (a portable build,
// whose elementwise kernels run without FMA). The empty asm keeps the product from being
// contracted into an FMA.
inline __m512 elementwise_madd(__m512 a, __m512 b, __m512 c) {
#if defined(__FMA__)
  return _mm512_fmadd_ps(a, b, c);
#else
  __m512 p = _mm512_mul_ps(a, b);
  asm("" : "+v"(p));
  return _mm512_add_ps(p, c);
#endif
}

// Packs rows [0, m) x k-range [0, kc) of a strided matrix X (X[i][k] = x[i * rs + k * cs]) into
// panels of P rows, k-major, for panels [panel_begin, panel_end): panel p at
// out + (p - panel_begin) * pstride, element (r, k) at [k * P + r]; rows past m are zero.
template <int P>
void pack_panels(const float* x, int64_t rs, int64_t cs, int64_t m, int64_t kc, float* out,
                 int64_t pstride, int64_t panel_begin, int64_t panel_end) {
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const int64_t i0 = p * P;
    const int rows = static_cast<int>(std::min<int64_t>(P, m - i0));
    float* o = out + (p - panel_begin) * pstride;
    if (rs == 1) {
      // Rows are contiguous along i for each k: a (masked) copy of `rows` floats per k.
      const __mmask16 lo = static_cast<__mmask16>((1u << std::min(rows, 16)) - 1);
      const __mmask16 hi = static_cast<__mmask16>(rows > 16 ? (1u << (rows - 16)) - 1 : 0);
      for (int64_t k = 0; k < kc; ++k) {
        const float* s = x + i0 + k * cs;
        if constexpr (P == 32) {
          // Whole panels with plain loads: a masked load that misses the caches is not
          // followed by the hardware prefetchers (AMD Zen 5; see run_line in fused.cpp).
          if (rows == P) {
            _mm512_storeu_ps(o + k * P, _mm512_loadu_ps(s));
            _mm512_storeu_ps(o + k * P + 16, _mm512_loadu_ps(s + 16));
            continue;
          }
          _mm512_storeu_ps(o + k * P, _mm512_maskz_loadu_ps(lo, s));
          _mm512_storeu_ps(o + k * P + 16, _mm512_maskz_loadu_ps(hi, s + 16));
        } else {
          static_assert(P <= 16);
          _mm512_mask_storeu_ps(o + k * P, static_cast<__mmask16>((1u << P) - 1),
                                _mm512_maskz_loadu_ps(lo, s));
        }
      }
    } else if (cs == 1) {
      // Each row is contiguous along k: 16 x 16 transposes.
      for (int64_t k0 = 0; k0 < kc; k0 += 16) {
        const int cols = static_cast<int>(std::min<int64_t>(16, kc - k0));
        for (int r0 = 0; r0 < P; r0 += 16) {
          const int rr = std::max(0, std::min(rows - r0, 16));
          const int width = std::min(16, P - r0);
          if (rr == 16 && cols == 16 && width == 16)
            transpose16<true>(x + (i0 + r0) * rs + k0, rs, 16, 16, o + k0 * P + r0, P, 16);
          else
            transpose16<false>(x + (i0 + r0) * rs + k0, rs, rr, cols, o + k0 * P + r0, P, width);
        }
      }
    } else {
      for (int64_t k = 0; k < kc; ++k)
        for (int r = 0; r < P; ++r) o[k * P + r] = r < rows ? x[(i0 + r) * rs + k * cs] : 0.f;
    }
  }
}

// The epilogue of one tile: pointers at the tile's first row / column.
struct TileEpilogue {
  const float* bias = nullptr;    // + bias[j]
  const float* addend = nullptr;  // + addend[r * ld_addend + j] * scale
  int64_t ld_addend = 0;
  float scale = 0.f;
  bool relu = false;
  const float* gate = nullptr;  // result zeroed where gate[r * ld_gate + j] <= 0
  int64_t ld_gate = 0;
  float* update = nullptr;  // then update[r * ld_update + j] += result * update_scale
  int64_t ld_update = 0;
  float update_scale = 0.f;
  // Rows of an operand the epilogue that follows the store reads (gelu's input: gelu_grad_block),
  // late[r * ld_late], two lines each: prefetched kLatePrefetch steps before the K loop ends.
  const float* late = nullptr;
  int64_t ld_late = 0;
};

// Stores an R x 16V tile of results held in registers, C[r][16v ..] under mask[v], through the
// epilogue: alpha * acc (+ beta * C) (+ bias) (+ addend * scale) (relu) (gate), then the
// update. The order of the unfused ops, so that every result is bitwise the plain product
// followed by the separate kernels. Each step runs over the whole tile (each test once per tile,
// the bias loaded once per column vector): per vector, the tests and the reloads of the
// epilogue's fields after every store to C (which might have changed them, as far as the
// compiler knew) cost ~270 cycles per 12 x 32 tile on one Zen 4 core: 120 x 256 products at
// 48.6 / 84.5 / 104.1 GFLOP/s for K = 8 / 32 / 128 against 73.9 / 99.5 / 109.4. Always inlined:
// the accumulators stay in registers.
template <int R, int V>
__attribute__((always_inline)) inline void store_tile(__m512 (&acc)[R][V], const __mmask16* mask,
                                                      float* c, int64_t ldc, float alpha,
                                                      float beta, const TileEpilogue& e) {
  const TileEpilogue el = e;
  const __m512 zero = _mm512_setzero_ps();
#define CS_TILE_LOOP(body)                                \
  _Pragma("GCC unroll 12") for (int r = 0; r < R; ++r) {  \
    _Pragma("GCC unroll 2") for (int v = 0; v < V; ++v) { \
      body;                                               \
    }                                                     \
  }
  if (alpha != 1.f) {
    const __m512 a = _mm512_set1_ps(alpha);
    CS_TILE_LOOP(acc[r][v] = _mm512_mul_ps(a, acc[r][v]))
  }
  if (beta == 1.f) {
    CS_TILE_LOOP(acc[r][v] =
                     _mm512_add_ps(acc[r][v], _mm512_maskz_loadu_ps(mask[v], c + r * ldc + 16 * v)))
  } else if (beta != 0.f) {
    const __m512 b = _mm512_set1_ps(beta);
    CS_TILE_LOOP(acc[r][v] = _mm512_fmadd_ps(
                     b, _mm512_maskz_loadu_ps(mask[v], c + r * ldc + 16 * v), acc[r][v]))
  }
  if (el.bias) {
    __m512 bv[V];
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) bv[v] = _mm512_maskz_loadu_ps(mask[v], el.bias + 16 * v);
    CS_TILE_LOOP(acc[r][v] = _mm512_add_ps(acc[r][v], bv[v]))
  }
  if (el.addend) {  // x + addend * s: bitwise the addcmul kernel's a + b * c on the product
    const __m512 sc = _mm512_set1_ps(el.scale);
    CS_TILE_LOOP(
        acc[r][v] = elementwise_madd(
            _mm512_maskz_loadu_ps(mask[v], el.addend + r * el.ld_addend + 16 * v), sc, acc[r][v]))
  }
  // relu: max's second operand on NaN, so x < 0 ? 0 : x exactly.
  if (el.relu) CS_TILE_LOOP(acc[r][v] = _mm512_max_ps(zero, acc[r][v]))
  if (el.gate) {  // relu_grad_f: y <= 0 ? 0 : x (an unordered compare: NaN y keeps x)
    CS_TILE_LOOP(
        acc[r][v] = _mm512_mask_mov_ps(
            acc[r][v],
            _mm512_cmp_ps_mask(_mm512_maskz_loadu_ps(mask[v], el.gate + r * el.ld_gate + 16 * v),
                               zero, _CMP_LE_OQ),
            zero))
  }
  CS_TILE_LOOP(_mm512_mask_storeu_ps(c + r * ldc + 16 * v, mask[v], acc[r][v]))
  if (el.update) {  // addcmul(p, x, r) = p + x * r: bitwise the separate kernel
    const __m512 us = _mm512_set1_ps(el.update_scale);
    CS_TILE_LOOP({
      float* pr = el.update + r * el.ld_update + 16 * v;
      _mm512_mask_storeu_ps(pr, mask[v],
                            elementwise_madd(acc[r][v], us, _mm512_maskz_loadu_ps(mask[v], pr)));
    })
  }
#undef CS_TILE_LOOP
}

// store_tile for a product computed as its transpose (C^T = B A^T, sgemm_avx512_impl): tile
// element (r, j) is C[j][r], at c + j * ldc + r, and the bias one per tile row (a column of C).
// The tile goes through two 16 x 16 transposes in L1 so that each of C's rows receives its R
// results as one masked vector, through the same steps in the same order as store_tile (alpha,
// beta, bias, relu): bitwise the results of the product computed directly. Only the epilogues
// the forward of a linear layer has (bias, relu).
template <int R, int V>
__attribute__((always_inline)) inline void store_tile_t(__m512 (&acc)[R][V], int cols, float* c,
                                                        int64_t ldc, float alpha, float beta,
                                                        const TileEpilogue& e) {
  alignas(64) float t[R][32];
  alignas(64) float u[32][16];
  if (alpha != 1.f) {
    const __m512 a = _mm512_set1_ps(alpha);
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_mul_ps(a, acc[r][v]);
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) _mm512_store_ps(&t[r][16 * v], acc[r][v]);
#pragma GCC unroll 2
  for (int v = 0; v < V; ++v) transpose16<false>(&t[0][16 * v], 32, R, 16, &u[16 * v][0], 16, 16);
  const __mmask16 m = static_cast<__mmask16>((1u << R) - 1);
  const __m512 zero = _mm512_setzero_ps(), b = _mm512_set1_ps(beta);
  const __m512 bias = e.bias ? _mm512_maskz_loadu_ps(m, e.bias) : zero;
  for (int j = 0; j < cols; ++j) {
    float* cj = c + j * ldc;
    __m512 x = _mm512_load_ps(u[j]);
    if (beta == 1.f)
      x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, cj));
    else if (beta != 0.f)
      x = _mm512_fmadd_ps(b, _mm512_maskz_loadu_ps(m, cj), x);
    if (e.bias) x = _mm512_add_ps(x, bias);
    if (e.relu) x = _mm512_max_ps(zero, x);
    _mm512_mask_storeu_ps(cj, m, x);
  }
}

// C[R rows, cols <= 16 * V] = alpha * A[R x kc] @ B[kc x 16V] + beta * C, the tile held in
// R * V zmm registers. A is read in place: element (r, k) at a[r * astride + k] when kcontig
// (rows contiguous along k), else at a[k * astride + r]. B row k is b[k * bks + j] (a packed
// panel, bks = 32, or the matrix itself); columns past `cols` are never read or written.
// V = 1 serves products with at most 16 columns (a classifier's logits) at twice the useful
// work per FMA of V = 2.
// The tile is then stored through the epilogue e (store_tile).
template <int R, int V, bool kcontig, bool kT = false>
void micro_kernel(int64_t kc, const float* __restrict a, int64_t astride, const float* __restrict b,
                  int64_t bks, float* c, int64_t ldc, int cols, float alpha, float beta,
                  const TileEpilogue& e) {
  __mmask16 mask[V];
#pragma GCC unroll 2
  for (int v = 0; v < V; ++v) {
    const int n = std::clamp(cols - 16 * v, 0, 16);
    mask[v] = static_cast<__mmask16>(n == 16 ? 0xffff : (1u << n) - 1);
  }
  __m512 acc[R][V];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
    // The tile of C is read (beta, a later K block) or written only after the K loop: its lines
    // arrive while the loop runs instead of stalling the stores (K blocks of a large C are
    // evicted from L2 between visits).
    if constexpr (!kT) {
      _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc), _MM_HINT_T0);
      if constexpr (V == 2)
        _mm_prefetch(reinterpret_cast<const char*>(c + r * ldc + 16), _MM_HINT_T0);
    }
  }
  if constexpr (kT) {  // the tile's C rows: one per column
    for (int j = 0; j < cols; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(c + j * ldc), _MM_HINT_T0);
  }
  // Rows contiguous along k: addressed as TileRows (tile_rows.h).
  TileRows<float, R> rows(a, astride);
  // The K loop instantiated twice: a tile of all 16 * V columns (nearly every tile) loads B's
  // rows without masks. Measured on an Intel Xeon (2 threads): GPT-2 124M's products 304-305 ->
  // 325-327 GFLOP/s (bench_peak --gemm, two alternations with the masked loads), its f32 step
  // 815-858 -> 770-842 ms (five alternated pairs). Later measured on AMD Zen 5: a masked load
  // that misses the caches is not followed by the hardware prefetchers (a stream read with
  // masked loads ran at a quarter of the plain loads' speed; see run_line in fused.cpp).
  // The epilogue's operand is prefetched near the end of the loop rather than before it, where
  // it was first (measured then on an Intel Xeon, GPT-2 tiny's 1024 x 1024 x 256 gradient
  // products with the gelu epilogue: 1.66-1.70x the time of a plain product -> 1.50-1.53x): the
  // B micro-panel that streams through L1 during the loop (48 KiB for kc = 384) evicts it
  // before the epilogue runs. Measured on Zen 4 (256 x 3072 x 768 with the GELU gradient in its
  // epilogue, GPT-2 124M's MLP input gradient, operands cold; alternated runs): 76-80 -> 80-88
  // GFLOP/s on one core, 141-152 -> 148-163 on two.
  const int64_t k_late = e.late ? std::max<int64_t>(0, kc - kLatePrefetch) : -1;
  auto k_loop = [&]<bool kFull>() __attribute__((always_inline)) {
    for (int64_t k = 0; k < kc; ++k) {
      if constexpr (kcontig) rows.hide_strides();
      // Software prefetch: B rows kPfB ahead, and each A row's next cache lines once per 16 k
      // (in-place operands are often cold after the previous op; measured 10-20% on those).
      _mm_prefetch(reinterpret_cast<const char*>(b + (k + kPfB) * bks), _MM_HINT_T0);
      if constexpr (V == 2)
        _mm_prefetch(reinterpret_cast<const char*>(b + (k + kPfB) * bks + 16), _MM_HINT_T0);
      if (kcontig && (k & 15) == 0) {
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r)
          _mm_prefetch(reinterpret_cast<const char*>(rows.row(r) + 64), _MM_HINT_T0);
      }
      // A transposed (each k a row of a wide matrix, often a different page): the next
      // micro-panels' piece of row k, which no hardware prefetcher tracks over hundreds of rows.
      if (!kcontig)
        _mm_prefetch(reinterpret_cast<const char*>(a + k * astride + 3 * kMr), _MM_HINT_T0);
      __m512 bv[V];
#pragma GCC unroll 2
      for (int v = 0; v < V; ++v)
        bv[v] = kFull ? _mm512_loadu_ps(b + k * bks + 16 * v)
                      : _mm512_maskz_loadu_ps(mask[v], b + k * bks + 16 * v);
#pragma GCC unroll 12
      for (int r = 0; r < R; ++r) {
        const __m512 av = _mm512_set1_ps(kcontig ? *rows.row(r) : a[k * astride + r]);
#pragma GCC unroll 2
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
      }
      if constexpr (kcontig) rows.advance(1);
      if (k == k_late) [[unlikely]] {
#pragma GCC unroll 12
        for (int r = 0; r < R; ++r) {
          _mm_prefetch(reinterpret_cast<const char*>(e.late + r * e.ld_late), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(e.late + r * e.ld_late + 16), _MM_HINT_T0);
        }
      }
    }
  };
  if (cols == 16 * V)
    k_loop.template operator()<true>();
  else
    k_loop.template operator()<false>();
  if constexpr (kT)
    store_tile_t<R, V>(acc, cols, c, ldc, alpha, beta, e);
  else
    store_tile<R, V>(acc, mask, c, ldc, alpha, beta, e);
}

using MicroKernel = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t,
                             int, float, float, const TileEpilogue&);
using KernelRow = std::array<MicroKernel, kMr + 1>;  // indexed by the tile's row count
template <int V, bool kcontig, bool kT, size_t... R>
constexpr KernelRow kernel_row(std::index_sequence<R...>) {
  return {nullptr, &micro_kernel<static_cast<int>(R + 1), V, kcontig, kT>...};
}
// kKernels[kcontig][V - 1][rows]
constexpr KernelRow kKernels[2][2] = {
    {kernel_row<1, false, false>(std::make_index_sequence<kMr>{}),
     kernel_row<2, false, false>(std::make_index_sequence<kMr>{})},
    {kernel_row<1, true, false>(std::make_index_sequence<kMr>{}),
     kernel_row<2, true, false>(std::make_index_sequence<kMr>{})}};
// The transposed store (store_tile_t), A's rows contiguous along k: kKernelsT[V - 1][rows].
constexpr KernelRow kKernelsT[2] = {kernel_row<1, true, true>(std::make_index_sequence<kMr>{}),
                                    kernel_row<2, true, true>(std::make_index_sequence<kMr>{})};

TileEpilogue tile_epilogue(const GemmEpilogue& ep, bool first, bool last, int64_t i, int64_t j) {
  TileEpilogue t;
  if (first && ep.bias) t.bias = ep.bias + j;
  if (last && ep.addend) {
    t.addend = ep.addend + i * ep.ld_addend + j;
    t.ld_addend = ep.ld_addend;
    t.scale = ep.addend_scale;
  }
  t.relu = last && ep.relu;
  if (last && ep.gate) {
    t.gate = ep.gate + i * ep.ld_gate + j;
    t.ld_gate = ep.ld_gate;
  }
  if (last && ep.update) {
    t.update = ep.update + i * ep.ld_update + j;
    t.ld_update = ep.ld_update;
    t.update_scale = ep.update_scale;
  }
  return t;
}

// Copies rows [0, rows) (at most kAtGroup * kMr) of a transposed A block, op(A)[i][k] =
// a[k * lda + i], into micro-panels of kMr rows: panel q at out + q * gs, element (r, k) at
// [k * kAtLine + r]. Each row k is read once, across the whole group (see kAtGroup).
void copy_at_group(const float* a, int64_t lda, int64_t kc, int64_t rows, float* out, int64_t gs) {
  for (int64_t k = 0; k < kc; ++k) {
    for (int64_t q = 0; q * kMr < rows; ++q) {
      const int n = static_cast<int>(std::min<int64_t>(kMr, rows - q * kMr));
      const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
      // A plain 16-float load where those floats lie within the group's rows (all panels but
      // the last): a masked load that misses the caches is not followed by the hardware
      // prefetchers (AMD Zen 5; see run_line in fused.cpp). The store keeps the panel's n.
      const float* src = a + k * lda + q * kMr;
      const __m512 v = q * kMr + 16 <= rows ? _mm512_loadu_ps(src) : _mm512_maskz_loadu_ps(m, src);
      _mm512_mask_storeu_ps(out + q * gs + k * kAtLine, m, v);
    }
  }
}

// gelu's gradient over a finished block of C in place (rows x cols at c, its first element
// result (i0, j0)): the GeluGrad kernel's own functions on the stored product, so the result is
// bitwise the separate kernel's. Called on each tile right after the micro-kernel stored it,
// while its lines are in L1; the product is then never written to memory and read back.
void gelu_grad_block(const GemmEpilogue& ep, float* c, int64_t ldc, int64_t i0, int64_t j0,
                     int rows, int cols) {
  for (int r = 0; r < rows; ++r)
    gelu_grad_n(ep.gelu_tanh, c + r * ldc, ep.gelu_x + (i0 + r) * ep.ld_gelu_x + j0, c + r * ldc,
                cols);
}

// Products of a few rows with a transposed B (a small batch through a linear layer: B is the
// [N, K] weight): each result is the dot product of two rows contiguous along K, so B is read
// in place, once, instead of being transposed into panels that few rows would reuse. Measured
// on one core (Zen 5), packed against dots: 4 x 50 x 784 5.0 / 2.8 us (OpenBLAS's Haswell
// kernels 8.9), 1 x 3072 x 768 318 / 114, 4 x 768 x 768 81 / 48; but 8 x 256 x 784 28 / 31
// (B is read once per kDotRows rows) and 4 x 50 x 50 0.31 / 0.34 (short dots: the reductions
// dominate). So: at most kDotRows rows, K >= 64, op(A) rows contiguous.
// R rows x NC columns at a time: R * NC vector accumulators over K in 16-float pieces (the last
// masked), each reduced to a scalar by the same fixed tree; out[r][c] for columns [0, NC).
constexpr int kDotRows = 4;
bool uses_dot(bool ta, bool tb, int64_t M, int64_t K) {
  return tb && !ta && M <= kDotRows && K >= 64;
}

template <int R, int NC>
void dot_tile(const float* __restrict a, int64_t lda, const float* __restrict b, int64_t ldb,
              int64_t K, float (*out)[16]) {
  __m512 acc[R][NC];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  auto step = [&](int64_t k, __mmask16 m) {
    __m512 bv[NC];
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c) bv[c] = _mm512_maskz_loadu_ps(m, b + c * ldb + k);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_maskz_loadu_ps(m, a + r * lda + k);
#pragma GCC unroll 2
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_fmadd_ps(av, bv[c], acc[r][c]);
    }
  };
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) step(k, 0xffff);
  if (k < K) step(k, static_cast<__mmask16>((1u << (K - k)) - 1));
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int c = 0; c < NC; ++c) out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
}

using DotTile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float (*)[16]);
template <int NC, size_t... R>
constexpr std::array<DotTile, kDotRows + 1> dot_row(std::index_sequence<R...>) {
  return {nullptr, &dot_tile<static_cast<int>(R + 1), NC>...};
}
// kDotTiles[NC - 1][rows]
constexpr std::array<DotTile, kDotRows + 1> kDotTiles[2] = {
    dot_row<1>(std::make_index_sequence<kDotRows>{}),
    dot_row<2>(std::make_index_sequence<kDotRows>{})};

// C = epilogue(alpha * A @ B^T + beta * C) for columns [j0, j1) (j0 a multiple of 16): the dots
// of up to kDotRows rows and 16 columns, then the epilogue on each row's 16 results as one
// vector, as the micro-kernel applies it.
void dot_columns(int64_t M, int64_t j0, int64_t j1, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                 const GemmEpilogue& ep) {
  alignas(64) float out[kDotRows][16];
  for (int64_t j = j0; j < j1; j += 16) {
    const int cols = static_cast<int>(std::min<int64_t>(16, j1 - j));
    const __mmask16 mask = static_cast<__mmask16>(cols == 16 ? 0xffff : (1u << cols) - 1);
    for (int64_t i = 0; i < M; i += kDotRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kDotRows, M - i));
      for (int c = 0; c < cols; c += 2) {
        float(*o)[16] = reinterpret_cast<float(*)[16]>(&out[0][c]);
        kDotTiles[c + 1 < cols][rows](A + i * lda, lda, B + (j + c) * ldb, ldb, K, o);
      }
      for (int r = 0; r < rows; ++r) {
        __m512 acc[1][1] = {{_mm512_load_ps(out[r])}};
        store_tile<1, 1>(acc, &mask, C + (i + r) * ldc + j, ldc, alpha, beta,
                         tile_epilogue(ep, true, true, i + r, j));
        if (ep.gelu_x) gelu_grad_block(ep, C + (i + r) * ldc + j, ldc, i + r, j, 1, cols);
      }
    }
  }
}

}  // namespace

// sgemm_avx512 on operands in the order it computes them: with `tr`, the product computed is
// C^T = op(A) op(B) (tile (i, j) stored at C[j][i] by store_tile_t, the bias one per row of this
// product; only bias and relu epilogues).
bool sgemm_run(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
               int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
               int threads, const Scratch& ws, const GemmEpilogue& ep, bool tr) {
  if (uses_dot(ta, tb, M, K)) {
    // Threads split the columns in blocks of 16; every result is one thread's whole dot.
    threads = omp_in_parallel() ? 1 : std::max(1, threads);
    const int64_t blocks = ceil_div(N, 16);
    auto run = [&](int t, int nt) {
      const int64_t b0 = blocks * t / nt, b1 = blocks * (t + 1) / nt;
      if (b0 < b1)
        dot_columns(M, 16 * b0, std::min(N, 16 * b1), K, alpha, A, lda, B, ldb, beta, C, ldc, ep);
    };
    run_on_team(threads, run);
    return true;
  }
  // op(A)[i][k] = A[i * ars + k * acs], op(B)[k][j] = B[k * brs + j * bcs]. A is always read in
  // place (the kernel broadcasts its elements); B is read in place when its rows are
  // contiguous along N and K fits one block, else packed into 32-column panels (a vectorised
  // transpose, or a copy of row pieces): measured on GPT-2 124M's products of K = 2304-50304
  // (2 threads, Zen 5), packing took them from 246-408 to 368-395 GFLOP/s.
  const int64_t ars = ta ? 1 : lda, acs = ta ? lda : 1;
  const int64_t brs = tb ? 1 : ldb, bcs = tb ? ldb : 1;
  const int64_t kblocks = k_blocks(K, ep.addend != nullptr);
  const int64_t kc_max = ceil_div(K, kblocks);
  const size_t b_area = static_cast<size_t>(pack_area(N, K, ep.addend != nullptr));
  // B packed whatever A's layout, or (packed_for_at) only for a transposed A: taken only where
  // the caller's scratch has room for the A copy too; callers that size it for an untransposed A
  // keep reading B in place.
  const bool packs_anyway = packs_b(false, tb, M, N, K);
  const bool packed_for_at = !packs_anyway && packs_b(ta, tb, M, N, K) &&
                             ws.floats >= b_area + static_cast<size_t>(kAtLine * kc_max);
  const bool pack_b = packs_anyway || packed_for_at;
  // A's rows run along k unless it is transposed (whatever its strides: a transposed A of one
  // row, lda = 1, has both strides 1); the micro-kernel is picked by that layout.
  const int64_t astride = ta ? acs : ars;
  // Inside a parallel region the product runs on the calling thread (a nested team would have
  // one thread, numbered 0, and every caller would pack into area 0).
  threads = omp_in_parallel() ? 1 : std::max(1, threads);
  // Each thread packs the B panels it reads into its own area of ws (panel stride kNr * kc_max):
  // team thread t into area t, a lone calling thread into its own slot; at most ws.slots threads.
  const size_t area = pack_b ? b_area : 0;
  const bool use_ws = area > 0;  // (K = 0 packs nothing)
  if (use_ws) threads = std::max(1, std::min(threads, ws.slots));
  const int first_slot = threads == 1 ? omp_get_thread_num() : 0;  // area of team thread 0
  if (use_ws) ws.slot(first_slot + threads - 1, area);             // checked before any team starts
  // A's micro-panels copied where its rows alias in L1 (a_rows_alias), into the scratch area
  // after the B panels (sgemm_avx512_scratch_floats counts it; a smaller area reads in place).
  const int64_t a_stride = a_copy_stride(kc_max);
  const bool copy_a =
      use_ws && !ta && a_rows_alias(ars) && ws.floats >= area + static_cast<size_t>(kMr * a_stride);
  const bool copy_at =
      use_ws && ta && ws.floats >= area + static_cast<size_t>(kAtGroup * kAtLine * kc_max);
  // B read in place streams a kc x nc block past every A micro-panel: at most kNcInPlace columns,
  // so that block (384 x 320 floats, 480 KiB) stays in a core's L2. (The N blocking does not
  // change any sum: each result still adds its K blocks in the same order.)
  // A packed product with at least as many rows as columns splits its rows: each thread then
  // reads its part of A and all of B (packing every panel of B into its own area) instead of all
  // of A and its part of B, the smaller share when M >= N; and each A micro-panel, loaded from
  // L3 or memory, serves every column panel of an N block instead of the thread's share of them.
  // Measured at 2 threads (Zen 4): GPT-2 tiny's 1024 x 256 x 1024 and 1024 x 256 x 8192 products
  // 160-168 -> 190-203 GFLOP/s, 1024 x 1024 x 256 172-182 -> 207; N >= 512 (square, 4096 x 512
  // x 512, 1024 x 768 x 768) within +-3%. Each thread's N block is then kNcThread columns.
  // A product packed only for its transposed A (packed_for_at) splits rows too, as it did with B
  // read in place: the optimizer update fused into a weight gradient's epilogue, and the ops
  // after it, then find each thread's rows where they were. Measured on the Intel Xeon (2
  // threads): GPT-2 124M's products 328 -> 340 GFLOP/s (bench_peak --gemm, medians of four
  // alternations); FC-MNIST's 256 x 784 x 128 weight gradient with the fused SGD update (then
  // still copied) 180 -> 155-159 us in its step, where split by columns it had been slower
  // than read in place (163).
  const bool rows_first = pack_b && threads > 1 && (M >= N || packed_for_at) && M >= threads * kMr;
  // A product whose A^T micro-panels are copied takes wider N blocks, up to kAtBlockFloats of
  // packed B a thread: its A, often the largest operand (the head's logits gradient), is then
  // read and copied once for fewer blocks.
  const int64_t nct =
      copy_at ? std::clamp(kAtBlockFloats / kc_max / kNr * kNr, kNcThread, kNc) : kNcThread;
  const int64_t nc_max = !pack_b      ? kNcInPlace
                         : rows_first ? nct
                                      : std::min<int64_t>(kNc, nct * threads);
  auto body = [&](int t, int nt) {
    // Each thread owns a fixed rectangle of C: a range of 32-column panels (or a range of rows:
    // products split by rows first, and those with fewer panels than threads), the same one on
    // every call. It packs only the B panels it uses, into its own part of the buffer, so no
    // thread waits for another and no packed line moves between cores (measured on 2 cores:
    // packing into panels that the other core had read cost 6x the single-thread time).
    // Panel jp at bp + (jp - j0) * kNr * kc_max.
    float* bp = use_ws ? ws.base + static_cast<size_t>(first_slot + t) * ws.stride : nullptr;
    for (int64_t jc = 0; jc < N; jc += nc_max) {
      const int64_t nc = std::min(nc_max, N - jc), nbp = ceil_div(nc, kNr);
      // Rows [r0, r1) x column panels [j0, j1) of this thread. Rows in contiguous equal ranges
      // (the split the elementwise kernels use, so the optimizer update that reads this
      // product finds its half in its own core's cache) unless B is packed: then columns, so
      // no thread packs panels another also packs, except for products split by rows first
      // (above). Too few column panels: rows again.
      const bool split_rows = pack_b ? rows_first || nbp < nt : M >= nt * kMr || nbp < nt;
      const int64_t r0 = split_rows ? M * t / nt : 0, r1 = split_rows ? M * (t + 1) / nt : M;
      const int64_t j0 = split_rows ? 0 : nbp * t / nt, j1 = split_rows ? nbp : nbp * (t + 1) / nt;
      for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t pc = kb * kc_max, kc = std::max<int64_t>(0, std::min(kc_max, K - pc));
        const float beta_k = kb == 0 ? beta : 1.f;
        // The bias is added in the first K block, the addend and relu in the last, so that the
        // result is bitwise that of the unfused ops on the finished product.
        const bool first = kb == 0, last = kb + 1 == kblocks;
        const float* bblk = B + pc * brs + jc * bcs;
        if (pack_b) pack_panels<kNr>(bblk, bcs, brs, nc, kc, bp, kNr * kc_max, j0, j1);
        // A-panel-major within the rectangle: the A micro-panel (12 x kc) stays in L1 while
        // the thread's B panels stream from L2.
        for (int64_t i = r0; i < r1; i += kMr) {
          const int rows = static_cast<int>(std::min<int64_t>(kMr, r1 - i));
          const float* ablk = A + i * ars + pc * acs;
          int64_t ast = astride;
          if (copy_a) {
            float* ac = bp + area;
            for (int r = 0; r < rows; ++r)
              std::memcpy(ac + r * a_stride, ablk + r * ars, sizeof(float) * kc);
            ablk = ac;
            ast = a_stride;
          } else if (copy_at) {  // micro-panel g of its group, which its first one copies
            float* ac = bp + area;
            const int64_t g = (i - r0) / kMr % kAtGroup, gs = kAtLine * kc_max;
            if (g == 0) copy_at_group(ablk, acs, kc, std::min(kAtGroup * kMr, r1 - i), ac, gs);
            ablk = ac + g * gs;
            ast = kAtLine;
          }
          for (int64_t jp = j0; jp < j1; ++jp) {
            const int cols = static_cast<int>(std::min<int64_t>(kNr, nc - jp * kNr));
            const float* bt = pack_b ? bp + (jp - j0) * kNr * kc_max : bblk + jp * kNr;
            // Transposed (tr: bias and relu only), the tile lands at C[j][i] and its bias runs
            // along this product's rows.
            float* ct = tr ? C + (jc + jp * kNr) * ldc + i : C + i * ldc + jc + jp * kNr;
            TileEpilogue te = tr ? tile_epilogue(ep, first, last, 0, i)
                                 : tile_epilogue(ep, first, last, i, jc + jp * kNr);
            if (last && ep.gelu_x) {  // for gelu_grad_block, below
              te.late = ep.gelu_x + i * ep.ld_gelu_x + jc + jp * kNr;
              te.ld_late = ep.ld_gelu_x;
            }
            (tr ? kKernelsT[cols > 16] : kKernels[!ta][cols > 16])[rows](
                kc, ablk, ast, bt, pack_b ? kNr : brs, ct, ldc, cols, alpha, beta_k, te);
            if (last && ep.gelu_x) gelu_grad_block(ep, ct, ldc, i, jc + jp * kNr, rows, cols);
          }
        }
      }
    }
  };
  run_on_team(threads, body);
  return true;
}

bool sgemm_avx512_impl(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                       float* C, int64_t ldc, int threads, const Scratch& ws,
                       const GemmEpilogue& ep) {
  if (M <= 0 || N <= 0) return true;
  // The swapped form packs the M rows of A where the direct one packs the N columns of B^T:
  // taken where ws has room for that (as it does when sized for this product, N > M).
  if (own_gemm_swaps(ta, tb, M, N) && !ep.addend && !ep.gate && !ep.update && !ep.gelu_x &&
      ws.floats >= static_cast<size_t>(pack_area(M, K, false) + a_copy_floats(K, false, false)))
    return sgemm_run(false, true, N, M, K, alpha, B, ldb, A, lda, beta, C, ldc, threads, ws, ep,
                     true);
  return sgemm_run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads, ws, ep, false);
}
CSTORCH_INTRINSICS_END

bool own_gemm_applies(int64_t M, int64_t, int64_t K, bool) {
  return K >= 1 && M >= 1;
}

bool own_gemm_one_k_block(int64_t K) {
  return K <= kKc;
}

size_t sgemm_avx512_scratch_floats(int64_t N, int64_t K, bool ta, bool tb, bool addend) {
  if (!packs_b(ta, tb, -1, N, K) || N <= 0 || K <= 0) return 0;
  return static_cast<size_t>(pack_area(N, K, addend) + a_copy_floats(K, addend, ta));
}

bool sgemm_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                  int threads, const Scratch& ws, const GemmEpilogue& ep) {
  return sgemm_avx512_impl(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads, ws, ep);
}

#else

bool own_gemm_applies(int64_t, int64_t, int64_t, bool) {
  return false;
}
bool own_gemm_one_k_block(int64_t) {
  return false;
}
size_t sgemm_avx512_scratch_floats(int64_t, int64_t, bool, bool, bool) {
  return 0;
}
bool sgemm_avx512(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                  int64_t, float, float*, int64_t, int, const Scratch&, const GemmEpilogue&) {
  return false;
}

#endif

float* Scratch::slot(int t, size_t need) const {
  CS_CHECK(t >= 0 && t < slots && need <= floats,
           "{}: thread {} needs a workspace area of {} floats; the kernel's workspace has {} "
           "area(s) of {} floats",
           op, t, need, slots, floats);
  return base + static_cast<size_t>(t) * stride;
}

}  // namespace cstorch::cpu
