// bf16 GEMM with f32 accumulation through AVX512_BF16's VDPBF16PS (gemm.h): each instruction
// multiplies 16 pairs of bf16 values and adds both products of a pair to an f32 lane, twice the
// multiply-adds of an f32 FMA per instruction. Both operands are packed into pairs along K:
//   - op(A) into panels of 12 rows: word (p, r) = A[r][2p] | A[r][2p + 1] << 16, p-major;
//   - op(B) into panels of 32 columns: word (p, j) = B[2p][j] | B[2p + 1][j] << 16, p-major;
// the micro-kernel keeps a 12 x 32 f32 tile of C in 24 zmm registers and broadcasts one A word
// per row against two B vectors per pair. An odd K pads the last pair with a zero.
//
// Blocking: K in equal blocks of at most kKp pairs, C columns split over the team in 32-column
// panels (each thread packs only its own B columns, in blocks of nc_max), rows in blocks of mc_max
// packed by every thread for its columns. Every result sums its K blocks in order and each block's
// pairs in order, whatever the team size: results do not depend on the thread count.
//
// The instructions exist only on CPUs with avx512_bf16 (Zen 4 and later, Cooper Lake, Sapphire
// Rapids): the functions using them carry that target themselves and run only after
// bf16_gemm_runs_here() said yes; elsewhere 16-bit products are widened to f32 (linalg.cpp).
// On CPUs that also have AMX tiles the products run on those instead (sgemm_amx_run below). On
// Intel CPUs without the tiles the planner widens bf16 products to f32 instead of calling here
// (bf16_gemm_widened: VDPBF16PS runs at half the FMA's rate there).
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backend/cpu/amx.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/tile_rows.h"
#include "backend/cpu/transpose16.h"
#include "cstorch/core/dtype.h"
#include "cstorch/core/error.h"

namespace cstorch::cpu {

#if CSTORCH_AVX512_KERNELS && defined(__GNUC__)
// GCC 12's widening, shift and undefined-start intrinsics are reported as uninitialised once
// inlined (a false positive, as in gemm.cpp): silenced for this AVX-512 code only.
CSTORCH_INTRINSICS_BEGIN
namespace {

constexpr int kMr = 12, kNr = 32;
// K in equal blocks of at most kKp pairs: K <= 768 in one block, so the products of a
// transformer's width (and the vocabulary head's forward, whose f32 partial sums would otherwise
// stream a [rows, vocabulary] C through memory between blocks) store C once. Measured against
// blocks of 128 pairs (bench_peak --gemm, Zen 5): the head's forward 288 -> 412 GFLOP/s on one
// core, 602 -> 791 on two; the step's products together 422 -> 443 and 834 -> 856.
constexpr int64_t kKp = 384;
// Pairs of rows packed together into every panel when the panels' elements run along the rows
// (B's rows along N: an input gradient's weight, a weight gradient's activations), the next
// block's rows prefetched meanwhile: those rows are usually cold (in memory since the forward).
constexpr int64_t kPackPairs = 16;
// Words of one thread's A block and B block: their rows (mc_max) and columns (nc_max) follow the
// K block's pairs, so that together they stay within a core's L2 (1 MiB on Zen 5) beside the C
// tiles they update: 128 rows and 352 columns at 384 pairs, 384 and 1056 at 128.
constexpr int64_t kAWords = 128 * kKp, kBWords = 352 * kKp;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Words of one thread's packed blocks; the B block starts on a 64-byte line (the micro-kernel's
// aligned loads), and the smallest blocks (kMr rows, kNr columns) fit whatever the pairs.
constexpr size_t kAreaWords = static_cast<size_t>(kAWords + 16 + kBWords);
static_assert(kAWords >= kMr * kKp && kBWords >= kNr * kKp);

// Packs X[e][k] = x[e * es + k * ks] (bf16 bits) for elements [e0, e0 + m) of the panel dim
// (A's rows, B's columns) and pairs [p0, p0 + kp) into panels of P elements: panel q at
// out + q * kps * P, word (p, e) at [p * P + e] = X[e][2p] | X[e][2p + 1] << 16. Elements past
// m, the half past K of an odd last pair and the pairs [kp, kps) (kps >= kp: the AMX tiles'
// whole chunks of 16 pairs) are zero.
template <int P>
__attribute__((target("avx512f,avx512bw"))) void pack_pairs(const uint16_t* x, int64_t es,
                                                            int64_t ks, int64_t e0, int64_t m,
                                                            int64_t K, int64_t p0, int64_t kp,
                                                            int64_t kps, uint32_t* out) {
  const int64_t full = std::min(kp, K / 2 - p0);  // pairs with both halves inside K
  const int64_t panels = ceil_div(m, P);
  if (es == 1) {
    // The panels' elements are contiguous in each k row. Pairs in blocks of kPackPairs: each
    // panel takes the block's pairs in turn (a contiguous run of its words), reading a piece
    // of P words of each of the block's rows, and while it does, the same piece of the next
    // block's rows is prefetched. Panel by panel over all pairs, each piece was a demand miss
    // of its own (rows hundreds apart, each line fetched for half of it, then again for the
    // next panel); pair by pair over all panels, the stores went to panels kps * P words apart,
    // all in one L1 set.
    const uint16_t* base = x + e0 + 2 * p0 * ks;
    const int64_t rows_in_k = K - 2 * p0;  // rows of x from base on (an odd K's last pair has one)
    for (int64_t pb = 0; pb < kp; pb += kPackPairs) {
      const int64_t pe = std::min(kp, pb + kPackPairs);
      const int64_t next_end = std::min(2 * std::min(kp, pe + kPackPairs), rows_in_k);
      int64_t line = 0;  // the next block's rows are prefetched up to this 64-byte piece
      for (int64_t q = 0; q < panels; ++q) {
        const int n = static_cast<int>(std::min<int64_t>(P, m - q * P));
        for (const int64_t end = ceil_div(std::min(m, (q + 1) * P), 32); line < end; ++line)
          for (int64_t r = 2 * pe; r < next_end; ++r)
            _mm_prefetch(reinterpret_cast<const char*>(base + r * ks + 32 * line), _MM_HINT_T0);
        for (int64_t p = pb; p < pe; ++p) {
          const uint16_t* r = base + 2 * p * ks + q * P;
          const bool has_hi = p < full;
          uint32_t* o = out + q * kps * P + p * P;
          for (int c = 0; c < P; c += 16) {
            const int w = std::max(0, std::min(16, n - c));
            const __mmask16 mk = static_cast<__mmask16>((1u << w) - 1);
            // Plain loads for whole groups of 16: a masked load that misses the caches is not
            // followed by the hardware prefetchers (AMD Zen 5; see run_line in fused.cpp).
            auto load16 = [&](const uint16_t* src) {
              return _mm512_cvtepu16_epi32(
                  w == 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src))
                          : _mm256_maskz_loadu_epi16(mk, src));
            };
            const __m512i lo = load16(r + c);
            const __m512i hi = has_hi ? load16(r + ks + c) : _mm512_setzero_si512();
            const __m512i word = _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
            if (P - c >= 16)
              _mm512_storeu_si512(o + c, word);
            else
              _mm512_mask_storeu_epi32(o + c, static_cast<__mmask16>((1u << (P - c)) - 1), word);
          }
        }
      }
    }
    if (kps > kp)
      for (int64_t q = 0; q < panels; ++q)
        std::memset(out + q * kps * P + kp * P, 0, sizeof(uint32_t) * (kps - kp) * P);
    return;
  }
  for (int64_t q = 0; q < panels; ++q) {
    uint32_t* o = out + q * kps * P;
    if (kps > kp) std::memset(o + kp * P, 0, sizeof(uint32_t) * (kps - kp) * P);
    const int n = static_cast<int>(std::min<int64_t>(P, m - q * P));
    const uint16_t* base = x + (e0 + q * P) * es + 2 * p0 * ks;
    if (ks == 1 && es % 2 == 0 && reinterpret_cast<uintptr_t>(base) % 4 == 0) {
      // Each element's k run is contiguous: its pairs are 32-bit words already, and the panel
      // is a transpose of 32-bit words, 16 x 16 at a time (a word-by-word copy ran the bf16
      // vocabulary head at half the speed of its other products). Pairs from `full` on (an odd
      // K's last) hold their low half only.
      const float* words = reinterpret_cast<const float*>(base);
      float* ow = reinterpret_cast<float*>(o);
      const int64_t es_w = es / 2, tp = std::max<int64_t>(full, 0);
      for (int64_t pb = 0; pb < tp; pb += 16) {
        const int cols = static_cast<int>(std::min<int64_t>(16, tp - pb));
        for (int c = 0; c < P; c += 16) {
          const int rows = std::max(0, std::min(16, n - c));
          const int width = std::min(16, P - c);
          if (rows == 16 && cols == 16 && width == 16)
            transpose16<true>(words + c * es_w + pb, es_w, 16, 16, ow + pb * P + c, P, 16);
          else
            transpose16<false>(words + c * es_w + pb, es_w, rows, cols, ow + pb * P + c, P, width);
        }
      }
      for (int e = 0; e < P; ++e)
        for (int64_t p = tp; p < kp; ++p) o[p * P + e] = e < n ? base[e * es + 2 * p] : 0u;
    } else if (ks == 1) {
      // As above, on storage not aligned for 32-bit words: word by word.
      for (int e = 0; e < P; ++e) {
        if (e >= n) {
          for (int64_t p = 0; p < kp; ++p) o[p * P + e] = 0;
          continue;
        }
        const uint16_t* row = base + e * es;
        uint32_t w;
        for (int64_t p = 0; p < full; ++p) {
          std::memcpy(&w, row + 2 * p, 4);
          o[p * P + e] = w;
        }
        for (int64_t p = std::max<int64_t>(full, 0); p < kp; ++p) o[p * P + e] = row[2 * p];
      }
    } else {
      for (int e = 0; e < P; ++e)
        for (int64_t p = 0; p < kp; ++p) {
          if (e >= n) {
            o[p * P + e] = 0;
            continue;
          }
          const uint16_t* v = base + e * es + 2 * p * ks;
          o[p * P + e] = v[0] | (p < full ? static_cast<uint32_t>(v[ks]) << 16 : 0u);
        }
    }
  }
}

// bf16 bits of 16 f32 lanes, as bf16_t rounds: to nearest even, a NaN kept a quiet NaN (bit 6
// set). Integer arithmetic, not VCVTNEPS2BF16, which flushes denormal inputs to zero.
__attribute__((target("avx512f,avx512bw"))) inline __m256i to_bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                         _mm512_and_si512(high, _mm512_set1_epi32(1))),
                        16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i bits =
      _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(high, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(bits);
}

// A 32-bit word read from any 2-byte boundary (a pair of bf16 values inside a row).
using UnalignedWord = uint32_t __attribute__((aligned(2), may_alias));

// C[rows, cols] (+)= A panel (12 x kp words) . B panel (kp x 32 words), f32. The A panel is
// packed (word (p, r) at a[p * 12 + r]) or, kInPlace, A's own rows: pair p of row r at
// a16 + r * lda + 2p (rows contiguous along an even K; rows past `rows` read the last row again,
// their sums never stored). With c16 (the last K block of a bf16 result), the sum plus the bias
// (if any, f32, one per column) is rounded to bf16 and stored there instead; C is then only read
// (the earlier K blocks' sums). With round_c (the last K block of an f32_out product), the sum is
// rounded to bf16 and stored in C as f32.
struct APanel {
  const uint32_t* packed = nullptr;
  const uint16_t* rows = nullptr;  // kInPlace: row 0, pair 0 of the panel
  int64_t lda = 0;
};
// Where a tile's results go. Tile element (r, j) is C[r][j] (c + r * ldc + j), or, with
// `transposed`, C[j][r] (c + j * ldc + r; the bias then one per tile row): the product computed
// as C^T = op(B)^T op(A)^T (sgemm_bf16's swapped operands).
struct TileOut {
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;  // add C's partial sums of the earlier K blocks
  uint16_t* c16 = nullptr;
  const float* bias = nullptr;
  bool round_c = false;
  bool transposed = false;
  // Final f32 results of a C too large for the caches, in whole aligned rows of 32: stored
  // around the caches (AMX path only).
  bool stream = false;
};

// Calls f.template operator()<kAccumulate, kC16, kBias, kRound>() with the flags of what a
// tile's store does (o.accumulate, o.c16, o.bias, o.round_c): a bias is added to bf16 results
// only, round_c applies to f32 ones.
template <class F>
__attribute__((always_inline)) inline void with_store_flags(const TileOut& o, F&& f) {
  const bool acc = o.accumulate;
  if (o.c16 && o.bias)
    acc ? f.template operator()<true, true, true, false>()
        : f.template operator()<false, true, true, false>();
  else if (o.c16)
    acc ? f.template operator()<true, true, false, false>()
        : f.template operator()<false, true, false, false>();
  else if (o.round_c)
    acc ? f.template operator()<true, false, false, true>()
        : f.template operator()<false, false, false, true>();
  else
    acc ? f.template operator()<true, false, false, false>()
        : f.template operator()<false, false, false, false>();
}

// The f32 value of v's lanes rounded to bf16 (their bf16 bits as the high half of the word).
__attribute__((target("avx512f,avx512bw"))) inline __m512 rounded_to_bf16(__m512 v) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16_bits(v)), 16));
}

// The lane masks of a row of `cols` (<= 32) results as two vectors, and the bias under them.
template <bool kBias>
struct RowStore {
  __mmask16 m[2];
  __m512 bias[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  __attribute__((target("avx512f,avx512bw"))) RowStore(int cols, const TileOut& o)
      : m{static_cast<__mmask16>(cols >= 16 ? 0xFFFF : (1u << cols) - 1),
          static_cast<__mmask16>(cols >= 32  ? 0xFFFF
                                 : cols > 16 ? (1u << (cols - 16)) - 1
                                             : 0)} {
    if constexpr (kBias) {
      bias[0] = _mm512_maskz_loadu_ps(m[0], o.bias);
      bias[1] = _mm512_maskz_loadu_ps(m[1], o.bias + 16);
    }
  }
};

// Stores one vector of results (lanes under m) at element `at` of the tile's C (and C16): plus
// C's partial sums of the earlier K blocks (kAccumulate), then as bf16 with the bias added
// (kC16, kBias), or as f32 (rounded to bf16 with kRound). The template arguments are the tile's
// o.accumulate, o.c16, o.bias and o.round_c, decided once per tile (store_tile): tested per
// vector they cost about as much as the products of a short K block (120 x 256 x 32 on one Zen 4
// core: 144 GFLOP/s against 187).
template <bool kAccumulate, bool kC16, bool kBias, bool kRound>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline void store_vec(
    __m512 v, __mmask16 m, int64_t at, __m512 bias, const TileOut& o) {
  if constexpr (kAccumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, o.c + at), v);
  if constexpr (kC16) {
    if constexpr (kBias) v = _mm512_add_ps(v, bias);
    _mm256_mask_storeu_epi16(o.c16 + at, m, to_bf16_bits(v));
  } else {
    if constexpr (kRound)  // bf16 bits back to f32: the high half of the word
      v = rounded_to_bf16(v);
    _mm512_mask_storeu_ps(o.c + at, m, v);
  }
}

// Stores a tile held as t[r][j] (r < rows, j < cols; 32 floats a row) at its transposed place
// C[j][r]: two 16 x 16 transposes, then each C row's `rows` results (the bias one per r). Not
// inlined: the transposes' masked reads past row `rows` of t look out of bounds to GCC's
// -Warray-bounds once t is a fixed-size array of the caller.
template <bool kAccumulate, bool kC16, bool kBias, bool kRound>
__attribute__((target("avx512f,avx512bw"), noinline)) void store_transposed(const float (*t)[kNr],
                                                                            int rows, int cols,
                                                                            const TileOut& o) {
  alignas(64) float u[kNr][16];  // u[j][r] = t[r][j]
  transpose16<false>(&t[0][0], kNr, rows, std::min(cols, 16), &u[0][0], 16, 16);
  if (cols > 16) transpose16<false>(&t[0][16], kNr, rows, cols - 16, &u[16][0], 16, 16);
  const __mmask16 m = static_cast<__mmask16>((1u << rows) - 1);
  const __m512 bias = kBias ? _mm512_maskz_loadu_ps(m, o.bias) : _mm512_setzero_ps();
  for (int j = 0; j < cols; ++j)
    store_vec<kAccumulate, kC16, kBias, kRound>(_mm512_load_ps(u[j]), m, j * o.ldc, bias, o);
}

// Stores the rows [0, rows) x columns [0, cols) of a 12 x 32 tile held in registers at C[r][j],
// or with o.transposed at C[j][r] (store_transposed). Always inlined, so the accumulators stay in
// registers.
template <bool kAccumulate, bool kC16, bool kBias, bool kRound>
__attribute__((target("avx512f,avx512bw"), always_inline)) inline void store_tile(
    __m512 (&acc)[kMr][2], int rows, int cols, const TileOut& o) {
  if (o.transposed) {
    alignas(64) float t[kMr][kNr];
#pragma GCC unroll 12
    for (int r = 0; r < kMr; ++r) {
      _mm512_store_ps(t[r], acc[r][0]);
      _mm512_store_ps(t[r] + 16, acc[r][1]);
    }
    store_transposed<kAccumulate, kC16, kBias, kRound>(t, rows, cols, o);
    return;
  }
  const RowStore<kBias> rs(cols, o);
  const __mmask16(&m)[2] = rs.m;
  const __m512(&bias)[2] = rs.bias;
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r) {
    if (r == rows) break;
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v)
      store_vec<kAccumulate, kC16, kBias, kRound>(acc[r][v], m[v], r * o.ldc + 16 * v, bias[v], o);
  }
}

template <bool kInPlace>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void micro_bf16(int64_t kp, const APanel& ap,
                                                                       const uint32_t* b, int rows,
                                                                       int cols, const TileOut& o) {
  const uint32_t* a = ap.packed;
  const int64_t ldc = o.ldc;
  const char* ar[kMr];
  if constexpr (kInPlace) {
#pragma GCC unroll 12
    for (int r = 0; r < kMr; ++r)
      ar[r] = reinterpret_cast<const char*>(ap.rows + std::min(r, rows - 1) * ap.lda);
  }
  __m512 acc[kMr][2];
#pragma GCC unroll 12
  for (int r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  // The C tile is read (a later K block) and written after the loop: its lines arrive while the
  // loop runs (a vocabulary-wide C leaves the caches between K blocks), as in gemm.cpp.
  if (o.transposed) {
    for (int j = 0; j < cols; ++j)
      _mm_prefetch(o.c16 && !o.accumulate ? reinterpret_cast<const char*>(o.c16 + j * ldc)
                                          : reinterpret_cast<const char*>(o.c + j * ldc),
                   _MM_HINT_T0);
  } else {
    for (int r = 0; r < rows; ++r) {
      if (o.c16 && !o.accumulate) {
        _mm_prefetch(reinterpret_cast<const char*>(o.c16 + r * ldc), _MM_HINT_T0);
        continue;
      }
      _mm_prefetch(reinterpret_cast<const char*>(o.c + r * ldc), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(o.c + r * ldc + 16), _MM_HINT_T0);
    }
  }
  if (kInPlace && rows == kMr) {
    // A full tile in place: its rows as TileRows (tile_rows.h), strides in bytes. Measured on
    // Zen 4 (bench_peak --gemm, the step's bf16 products, three alternations): one core 182 ->
    // 190 GFLOP/s, two 363 -> 375. (Partial tiles keep a pointer per row: theirs are clamped.)
    TileRows<char, kMr> tile(ar[0], ap.lda * 2);
    for (int64_t p = 0; p < kp; ++p) {
      tile.hide_strides();
      const __m512i b0 = _mm512_load_si512(b + p * kNr);
      const __m512i b1 = _mm512_load_si512(b + p * kNr + 16);
      if ((p & 15) == 0) {  // each row's next lines, as gemm.cpp's in-place A
#pragma GCC unroll 12
        for (int r = 0; r < kMr; ++r) _mm_prefetch(tile.row(r) + 128, _MM_HINT_T0);
      }
#pragma GCC unroll 12
      for (int r = 0; r < kMr; ++r) {
        const __m512i av = _mm512_set1_epi32(
            static_cast<int>(*reinterpret_cast<const UnalignedWord*>(tile.row(r))));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)av, (__m512bh)b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)av, (__m512bh)b1);
      }
      tile.advance(4);
    }
  } else {
    for (int64_t p = 0; p < kp; ++p) {
      const __m512i b0 = _mm512_load_si512(b + p * kNr);
      const __m512i b1 = _mm512_load_si512(b + p * kNr + 16);
      if (kInPlace && (p & 15) == 0) {  // each row's next lines, as gemm.cpp's in-place A
#pragma GCC unroll 12
        for (int r = 0; r < kMr; ++r) _mm_prefetch(ar[r] + 4 * p + 128, _MM_HINT_T0);
      }
#pragma GCC unroll 12
      for (int r = 0; r < kMr; ++r) {
        const uint32_t word =
            kInPlace ? *reinterpret_cast<const UnalignedWord*>(ar[r] + 4 * p) : a[p * kMr + r];
        const __m512i av = _mm512_set1_epi32(static_cast<int>(word));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], (__m512bh)av, (__m512bh)b0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], (__m512bh)av, (__m512bh)b1);
      }
    }
  }
  // The tile's store decided once: store_tile instantiated for what this tile does.
  with_store_flags(
      o, [&]<bool kA, bool kC, bool kB, bool kR>()
             __attribute__((always_inline)) { store_tile<kA, kC, kB, kR>(acc, rows, cols, o); });
}

// Thread t of a team of nt's rows [r0, r1) and columns [c0, c1) of C[M, N]: its slice of the
// column panels (nr wide) when split_cols, else of the row panels (mr high).
struct Share {
  int64_t r0, r1, c0, c1;
};
Share share_of(bool split_cols, int64_t M, int64_t N, int64_t mr, int64_t nr, int t, int nt) {
  if (split_cols) {
    const int64_t panels = ceil_div(N, nr);
    return {0, M, std::min(N, panels * t / nt * nr), std::min(N, panels * (t + 1) / nt * nr)};
  }
  const int64_t panels = ceil_div(M, mr);
  return {std::min(M, panels * t / nt * mr), std::min(M, panels * (t + 1) / nt * mr), 0, N};
}

// Where the tile at row i, column j of the product goes in K block kb (of kblocks): C's element
// (C[i][j], or C[j][i] when the product runs transposed), and the bf16 output and bias in the
// last block only.
TileOut tile_out(float* C, int64_t ldc, const Bf16Result& out, int64_t i, int64_t j, int64_t kb,
                 int64_t kblocks, bool transposed) {
  const bool last = kb == kblocks - 1;
  const int64_t at = transposed ? j * ldc + i : i * ldc + j;
  TileOut o;
  o.c = C + at;
  o.ldc = ldc;
  o.accumulate = kb > 0;
  o.c16 = last && out.c16 ? out.c16 + at : nullptr;
  o.bias = last && out.bias ? out.bias + (transposed ? i : j) : nullptr;
  o.round_c = last && out.round_c;
  o.transposed = transposed;
  return o;
}

// One thread's share of a product: its rows [r0, r1) and columns [c0, c1), over K blocks of kpb
// pairs (kblocks of them, the last shorter). In each K block, B blocks of nc_max columns are
// packed once (pack_b(jc, nc, p0, kp)) and A blocks of mc_max rows (pack_a(ic, mc, p0, kp)), and
// run(kb, p0, kp, ic, mc, jc, nc) computes each pair of them: each A block is packed once per K
// block when the rows fit one A block, else again for each B block.
template <class PackA, class PackB, class Run>
void for_each_block(int64_t pairs, int64_t kpb, int64_t kblocks, int64_t r0, int64_t r1, int64_t c0,
                    int64_t c1, int64_t mc_max, int64_t nc_max, PackA&& pack_a, PackB&& pack_b,
                    Run&& run) {
  for (int64_t kb = 0; kb < kblocks; ++kb) {
    const int64_t p0 = kb * kpb, kp = std::min(kpb, pairs - p0);
    if (r1 - r0 > mc_max) {
      for (int64_t jc = c0; jc < c1; jc += nc_max) {
        const int64_t nc = std::min(nc_max, c1 - jc);
        pack_b(jc, nc, p0, kp);
        for (int64_t ic = r0; ic < r1; ic += mc_max) {
          const int64_t mc = std::min(mc_max, r1 - ic);
          pack_a(ic, mc, p0, kp);
          run(kb, p0, kp, ic, mc, jc, nc);
        }
      }
    } else {
      const int64_t mc = r1 - r0;  // one A block
      if (mc <= 0) continue;
      pack_a(r0, mc, p0, kp);
      for (int64_t jc = c0; jc < c1; jc += nc_max) {
        const int64_t nc = std::min(nc_max, c1 - jc);
        pack_b(jc, nc, p0, kp);
        run(kb, p0, kp, r0, mc, jc, nc);
      }
    }
  }
}

// ---- AMX tiles (TDPBF16PS) ----
// On CPUs with AMX (Sapphire Rapids and later) the products run on the tile unit: one TDPBF16PS
// multiplies a 16 x 32 bf16 tile of A by a 32 x 16 tile of B into a 16 x 16 f32 tile of C, 16
// times the multiply-adds of a VDPBF16PS. The micro-kernel keeps a 32 x 32 block of C in four
// tiles (0-3), the two 16-row groups of A in tiles 4-5 and the two 16-column groups of B in 6-7,
// and steps along K 16 pairs at a time:
//   - op(A) as rows of pairs: in place (A's own rows, an even K in whole chunks of 16 pairs) or
//     packed in groups of 16 rows, word (r, p) at [r * kps + p];
//   - op(B) as pack_pairs<16> panels (16 columns, p-major): each chunk a contiguous 1 KiB tile.
// K keeps the blocks of the VDPBF16PS path (at most kKp pairs, their sums added into C in
// order), rounded up to whole chunks; the last chunk of a block is zero-padded in both operands.
// The tile unit sums each block its own way (its results differ in the last bits from
// VDPBF16PS's pair-by-pair sums, measured), the same way for every element wherever it lies in
// a tile, so results still do not depend on the team size or the swapped form (tested).
constexpr int64_t kChunk = 16;  // pairs of one tile step
constexpr int kAmxM = 32, kAmxN = 32;

// Loads the configuration on the calling thread / releases its tiles.
__attribute__((target("amx-tile"))) void tiles_on() {
  static const TileConfig config;
  _tile_loadconfig(&config);
}
__attribute__((target("amx-tile"))) void tiles_off() {
  _tile_release();
}

// Packs op(A)[e][k] = x[e * es + k * ks] for rows [e0, e0 + m) and pairs [p0, p0 + kp) into
// groups of 16 rows: group g at out + g * 16 * kps, word (r, p) at [r * kps + p]; rows past m,
// the half past K of an odd last pair and pairs [kp, kps) zero. kps is a multiple of 16.
__attribute__((target("avx512f,avx512bw"))) void pack_rows(const uint16_t* x, int64_t es,
                                                           int64_t ks, int64_t e0, int64_t m,
                                                           int64_t K, int64_t p0, int64_t kp,
                                                           int64_t kps, uint32_t* out) {
  const int64_t groups = ceil_div(m, 16);
  if (ks == 1) {  // each row's k run contiguous: a copy of its halves
    const int64_t halves = std::min(2 * kp, K - 2 * p0);
    for (int64_t r = 0; r < groups * 16; ++r) {
      uint16_t* o = reinterpret_cast<uint16_t*>(out + r * kps);
      const int64_t n = r < m ? halves : 0;
      if (n > 0) std::memcpy(o, x + (e0 + r) * es + 2 * p0, sizeof(uint16_t) * n);
      std::memset(o + n, 0, sizeof(uint16_t) * (2 * kps - n));
    }
    return;
  }
  // Rows along k (A^T stored): 16 rows x 16 pairs at a time as a pack_pairs panel (p-major),
  // then transposed as 32-bit words.
  alignas(64) uint32_t panel[kChunk * 16];
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t rows = std::min<int64_t>(16, m - 16 * g);
    for (int64_t pb = 0; pb < kps; pb += kChunk) {
      uint32_t* o = out + g * 16 * kps + pb;
      const int64_t n = std::max<int64_t>(0, std::min<int64_t>(kChunk, kp - pb));
      pack_pairs<16>(x, es, ks, e0 + 16 * g, rows, K, p0 + pb, n, kChunk, panel);
      transpose16<true>(reinterpret_cast<const float*>(panel), 16, 16, 16,
                        reinterpret_cast<float*>(o), kps, 16);
    }
  }
}

// A 32 x 32 block of C (kRg row groups, kCg column groups of 16) over kps pairs into t (32
// floats a row): row group g of A at a[g] (bf16 bits, its pair p at a[g] + 2p), rows sa[g]
// bytes apart; column group h of B at b[h] (16 words a pair).
template <int kRg, int kCg>
__attribute__((target("amx-tile,amx-bf16"))) void micro_amx(int64_t kps,
                                                            const uint16_t* const (&a)[2],
                                                            const int64_t (&sa)[2],
                                                            const uint32_t* const (&b)[2],
                                                            float (*t)[kAmxN]) {
  _tile_zero(0);
  if constexpr (kCg == 2) _tile_zero(1);
  if constexpr (kRg == 2) _tile_zero(2);
  if constexpr (kRg == 2 && kCg == 2) _tile_zero(3);
  for (int64_t p = 0; p < kps; p += kChunk) {
    _tile_loadd(4, a[0] + 2 * p, sa[0]);
    _tile_loadd(6, b[0] + p * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kCg == 2) {
      _tile_loadd(7, b[1] + p * 16, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (kRg == 2) {
      _tile_loadd(5, a[1] + 2 * p, sa[1]);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (kCg == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, &t[0][0], kAmxN * 4);
  if constexpr (kCg == 2) _tile_stored(1, &t[0][16], kAmxN * 4);
  if constexpr (kRg == 2) _tile_stored(2, &t[16][0], kAmxN * 4);
  if constexpr (kRg == 2 && kCg == 2) _tile_stored(3, &t[16][16], kAmxN * 4);
}

// Stores rows [0, rows) x columns [0, cols) of a 32 x 32 block held in t as store_tile does.
template <bool kAccumulate, bool kC16, bool kBias, bool kRound>
__attribute__((target("avx512f,avx512bw"))) void store_block(const float (*t)[kAmxN], int rows,
                                                             int cols, const TileOut& o) {
  if constexpr (!kAccumulate && !kC16) {
    // Streamed: whole rows of 32 results in C (all 32 columns; transposed, all 32 rows).
    if (o.stream && (o.transposed ? rows == kAmxM : cols == kAmxN)) {
      alignas(64) float u[kAmxN][kAmxM];  // transposed: u[j][r] = t[r][j]
      const float(*src)[kAmxN] = t;
      int n = rows;
      if (o.transposed) {
        for (int rh = 0; rh < 2; ++rh)
          for (int ch = 0; ch < 2; ++ch)
            transpose16<true>(&t[16 * rh][16 * ch], kAmxN, 16, 16, &u[16 * ch][16 * rh], kAmxM, 16);
        src = u;
        n = cols;
      }
      for (int i = 0; i < n; ++i)
        for (int v = 0; v < 2; ++v) {
          __m512 x = _mm512_load_ps(&src[i][16 * v]);
          if constexpr (kRound) x = rounded_to_bf16(x);
          _mm512_stream_ps(o.c + i * o.ldc + 16 * v, x);
        }
      return;
    }
  }
  if (o.transposed) {  // two 16-row halves, each transposed
    store_transposed<kAccumulate, kC16, kBias, kRound>(t, std::min(rows, 16), cols, o);
    if (rows > 16) {
      TileOut h = o;
      h.c += 16;
      if (h.c16) h.c16 += 16;
      if (h.bias) h.bias += 16;
      store_transposed<kAccumulate, kC16, kBias, kRound>(t + 16, rows - 16, cols, h);
    }
    return;
  }
  const RowStore<kBias> rs(cols, o);
  const __mmask16(&m)[2] = rs.m;
  const __m512(&bias)[2] = rs.bias;
  for (int r = 0; r < rows; ++r)
    for (int v = 0; v < (cols > 16 ? 2 : 1); ++v)
      store_vec<kAccumulate, kC16, kBias, kRound>(_mm512_load_ps(&t[r][16 * v]), m[v],
                                                  r * o.ldc + 16 * v, bias[v], o);
}

void store_block(const float (*t)[kAmxN], int rows, int cols, const TileOut& o) {
  with_store_flags(o, [&]<bool kA, bool kC, bool kB, bool kR>() {
    store_block<kA, kC, kB, kR>(t, rows, cols, o);
  });
}

// Whether the CPU has AMX tiles and the OS lets this process use them (asked once).
bool amx_available() {
  static const bool yes = amx_granted();
  return yes;
}

// Whether sgemm_bf16 runs on the tiles: available, and not turned off by CSTORCH_AMX=0 or
// bf16_gemm_amx(0).
std::atomic<int>& amx_mode() {
  static std::atomic<int> mode{[] {
    const char* env = std::getenv("CSTORCH_AMX");
    return env && std::string_view(env) == "0" ? 0 : 1;
  }()};
  return mode;
}
bool amx_on() {
  return amx_mode().load(std::memory_order_relaxed) != 0 && amx_available();
}

// sgemm_bf16_run on the tiles (same arguments, same blocking of the team and of K).
__attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw"))) void sgemm_amx_run(
    bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
    const uint16_t* B, int64_t ldb, float* C, int64_t ldc, int threads, const Scratch& ws,
    const Bf16Result& out, bool transposed) {
  const int64_t ars = ta ? 1 : lda, acs = ta ? lda : 1;
  const int64_t brs = tb ? 1 : ldb, bcs = tb ? ldb : 1;
  const int64_t pairs = ceil_div(K, 2);
  const int64_t kpb = ceil_div(ceil_div(pairs, ceil_div(pairs, kKp)), kChunk) * kChunk;
  const int64_t kblocks = ceil_div(pairs, kpb);
  const int64_t mc_max = std::max<int64_t>(kAmxM, kAWords / kpb / kAmxM * kAmxM);
  const int64_t nc_max = std::max<int64_t>(kAmxN, kBWords / kpb / kAmxN * kAmxN);
  const int64_t nbp = ceil_div(N, kAmxN), nmp = ceil_div(M, kAmxM);
  // A's rows read in place when they hold whole chunks of pairs (K a multiple of 32); a last
  // group of fewer than 16 rows is packed (a tile load would read past A).
  const bool a_in_place = !ta && K % (2 * kChunk) == 0;
  // A final f32 C of 8 MiB or more, written once (one K block), goes around the caches: its
  // lines would only evict the operands, and a plain store first reads each line in. Measured
  // in GPT-2 124M's bf16 step (2 threads, with AMX): the tied head's weight gradient ([50304,
  // 768], 154 MB) 22.7 -> 11.4 ms, its logits ([256, 50304], stored transposed) 14.7 -> 12.4 ms;
  // the AdamW pass and log_softmax that read them next took no longer.
  const bool stream = kblocks == 1 && !out.c16 && M * N * 4 >= (int64_t{8} << 20) &&
                      ldc % 16 == 0 && reinterpret_cast<uintptr_t>(C) % 64 == 0;
  threads = omp_in_parallel() ? 1 : std::max(1, std::min<int>(threads, ws.slots));
  const bool split_cols = nbp >= threads && M <= N;
  threads = static_cast<int>(std::min<int64_t>(threads, split_cols ? nbp : nmp));
  const int first_slot = threads == 1 ? omp_get_thread_num() : 0;
  ws.slot(first_slot + threads - 1, kAreaWords);
  auto body = [&](int t, int nt) {
    tiles_on();
    uint32_t* apack = reinterpret_cast<uint32_t*>(ws.base + (first_slot + t) * ws.stride);
    uint32_t* bpack = apack + (mc_max * kpb + 15) / 16 * 16;
    const auto [r0, r1, c0, c1] = share_of(split_cols, M, N, kAmxM, kAmxN, t, nt);
    alignas(64) float tile[kAmxM][kAmxN];
    // Pairs of a K block's packed operands: whole tile chunks.
    auto chunked = [](int64_t kp) { return ceil_div(kp, kChunk) * kChunk; };
    auto run = [&](int64_t kb, int64_t p0, int64_t kp, int64_t ic, int64_t mc, int64_t jc,
                   int64_t nc) {
      const int64_t kps = chunked(kp);
      for (int64_t jq = 0; jq < ceil_div(nc, kAmxN); ++jq) {
        const int cols = static_cast<int>(std::min<int64_t>(kAmxN, nc - jq * kAmxN));
        const uint32_t* const b[2] = {bpack + 2 * jq * kps * 16, bpack + (2 * jq + 1) * kps * 16};
        for (int64_t iq = 0; iq < ceil_div(mc, kAmxM); ++iq) {
          const int rows = static_cast<int>(std::min<int64_t>(kAmxM, mc - iq * kAmxM));
          const uint16_t* a[2];
          int64_t sa[2];
          for (int g = 0; g < 2; ++g) {
            const int64_t r = iq * kAmxM + 16 * g;  // the group's first row in the block
            if (a_in_place && r + 16 <= mc) {
              a[g] = A + (ic + r) * lda + 2 * p0;
              sa[g] = lda * 2;
            } else {
              a[g] = reinterpret_cast<const uint16_t*>(apack + r * kps);
              sa[g] = kps * 4;
            }
          }
          if (rows > 16)
            cols > 16 ? micro_amx<2, 2>(kps, a, sa, b, tile) : micro_amx<2, 1>(kps, a, sa, b, tile);
          else
            cols > 16 ? micro_amx<1, 2>(kps, a, sa, b, tile) : micro_amx<1, 1>(kps, a, sa, b, tile);
          TileOut o =
              tile_out(C, ldc, out, ic + iq * kAmxM, jc + jq * kAmxN, kb, kblocks, transposed);
          o.stream = stream;  // (only with one K block: always its last)
          store_block(tile, rows, cols, o);
        }
      }
    };
    auto pack_a = [&](int64_t ic, int64_t mc, int64_t p0, int64_t kp) {
      const int64_t kps = chunked(kp);
      if (!a_in_place) {
        pack_rows(A, ars, acs, ic, mc, K, p0, kp, kps, apack);
      } else if (mc % 16) {  // only the last, partial group
        const int64_t r = mc / 16 * 16;
        pack_rows(A, ars, acs, ic + r, mc - r, K, p0, kp, kps, apack + r * kps);
      }
    };
    auto pack_b = [&](int64_t jc, int64_t nc, int64_t p0, int64_t kp) {
      pack_pairs<16>(B, bcs, brs, jc, nc, K, p0, kp, chunked(kp), bpack);
    };
    for_each_block(pairs, kpb, kblocks, r0, r1, c0, c1, mc_max, nc_max, pack_a, pack_b, run);
    tiles_off();
    if (stream) _mm_sfence();  // the streamed stores visible before the team's barrier
  };
  run_on_team(threads, body);
}

}  // namespace

bool bf16_gemm_runs_here() {
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}

namespace {
// Whether the CPU's vendor is Intel, whose cores issue VDPBF16PS on one port against two for the
// f32 FMA: two multiply-adds per lane at half the instruction rate, no more than an FMA's one at
// the full rate (AMD's Zen 4 and 5 issue both at one rate: there the bf16 products run at twice
// the f32 ones).
bool dot_at_half_rate() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  return b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;  // "Genu" "ineI" "ntel"
}

// -1: the default (widened where dot_at_half_rate() and the tiles are off), 0: sgemm_bf16,
// 1: widened; CSTORCH_BF16_GEMM=bf16 / widen in the environment sets 0 / 1 (read once).
std::atomic<int>& widen_mode() {
  static std::atomic<int> mode{[] {
    const char* env = std::getenv("CSTORCH_BF16_GEMM");
    if (!env) return -1;
    const std::string_view v(env);
    CS_CHECK(v == "bf16" || v == "widen",
             "CSTORCH_BF16_GEMM: must be 'bf16' (the bf16 GEMM) or 'widen' (bf16 operands widened "
             "to f32 for the f32 GEMM), got '{}'",
             v);
    return v == "widen" ? 1 : 0;
  }()};
  return mode;
}
}  // namespace

bool bf16_gemm_widened(int mode) {
  if (mode >= 0) widen_mode().store(mode != 0 ? 1 : 0, std::memory_order_relaxed);
  if (!bf16_gemm_runs_here()) return true;
  const int m = widen_mode().load(std::memory_order_relaxed);
  if (m >= 0) return m == 1;
  static const bool half_rate = dot_at_half_rate();
  return half_rate && !amx_on();
}

size_t sgemm_bf16_scratch_floats() {
  return bf16_gemm_runs_here() ? kAreaWords : 0;
}

bool bf16_gemm_amx(int mode) {
  if (mode >= 0) amx_mode().store(mode != 0 ? 1 : 0, std::memory_order_relaxed);
  return bf16_gemm_runs_here() && amx_on();
}

namespace {
bool sgemm_bf16_run(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                    int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc, int threads,
                    const Scratch& ws, const Bf16Result& out, bool transposed);
}  // namespace

bool sgemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                const uint16_t* B, int64_t ldb, float* C, int64_t ldc, int threads,
                const Scratch& ws, const Bf16Result& out) {
  if (!bf16_gemm_runs_here()) return false;
  if (M <= 0 || N <= 0) return true;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i) {
      if (!out.c16) {
        std::memset(C + i * ldc, 0, sizeof(float) * N);
        continue;
      }
      for (int64_t j = 0; j < N; ++j)
        out.c16[i * ldc + j] = bf16_t(0.0f + (out.bias ? out.bias[j] : 0.0f)).bits;
    }
    return true;
  }
  // A product with B^T (a linear layer's forward: A the activations [M, K], B the weight [N, K])
  // and more columns than rows is computed as C^T = B A^T: the weight, the larger operand, is
  // then read in place as the broadcast operand (its rows hold their pairs along K as they are)
  // and only the activations are packed, instead of every weight element being transposed into
  // panels; the tiles are transposed once on their way to C. The same products summed in the
  // same order (VDPBF16PS is symmetric in its operands), so the same bits (tested). Measured on
  // Zen 4, one core (bench_peak --shape, three runs each): GPT-2 124M's forward products, M =
  // 256 rows, 190.6 -> 214.5 GFLOP/s (N = 3072), 195.6 -> 218.6 (K = 3072), 195.3 -> 211.8 (N
  // = 2304), 183.3 -> 207.4 (the vocabulary head), run as the swapped shapes. Few rows (M < 64)
  // would fill few of a vector's 16 lanes: those keep the direct form.
  const bool swap = bf16_gemm_swaps(ta, tb, M, N, K);
  if (amx_on()) {
    if (swap)
      sgemm_amx_run(false, true, N, M, K, B, ldb, A, lda, C, ldc, threads, ws, out, true);
    else
      sgemm_amx_run(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, threads, ws, out, false);
    return true;
  }
  if (swap)
    return sgemm_bf16_run(false, true, N, M, K, B, ldb, A, lda, C, ldc, threads, ws, out, true);
  return sgemm_bf16_run(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, threads, ws, out, false);
}

namespace {
// sgemm_bf16 on a product with K >= 1; with `transposed`, the result of tile (i, j) is stored at
// C[j][i] (and the bias is one per row of this product).
bool sgemm_bf16_run(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                    int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc, int threads,
                    const Scratch& ws, const Bf16Result& out, bool transposed) {
  const int64_t ars = ta ? 1 : lda, acs = ta ? lda : 1;
  const int64_t brs = tb ? 1 : ldb, bcs = tb ? ldb : 1;
  const int64_t pairs = ceil_div(K, 2), kblocks = ceil_div(pairs, kKp);
  const int64_t kpb = ceil_div(pairs, kblocks);  // pairs of each K block but the last
  const int64_t mc_max = std::max<int64_t>(kMr, kAWords / kpb / kMr * kMr);
  const int64_t nc_max = std::max<int64_t>(kNr, kBWords / kpb / kNr * kNr);
  const int64_t nbp = ceil_div(N, kNr), nmp = ceil_div(M, kMr);
  // op(A)'s rows contiguous along an even K hold its pairs as they are: the micro-kernel reads
  // them in place instead of a packed copy (which every thread of a column split would make of
  // all of A). Measured on GPT-2 124M's bf16 step (Zen 5, 2 threads): packing A by 12-row
  // transposes took 7% of the products' time (perf); reading in place, the step went from about
  // 355 to 345 ms and the step's products, timed alone, from 856 to 887 GFLOP/s.
  const bool a_in_place = !ta && K % 2 == 0;
  threads = omp_in_parallel() ? 1 : std::max(1, std::min<int>(threads, ws.slots));
  // Columns split over the team when there are as many panels as threads and the rows are no
  // more than the columns (each thread then reads all of A, the smaller operand: in place, or
  // packed by each thread); else rows.
  const bool split_cols = nbp >= threads && M <= N;
  threads = static_cast<int>(std::min<int64_t>(threads, split_cols ? nbp : nmp));
  const int first_slot = threads == 1 ? omp_get_thread_num() : 0;
  ws.slot(first_slot + threads - 1, kAreaWords);  // checked before any team starts
  auto body = [&](int t, int nt) {
    uint32_t* apack = reinterpret_cast<uint32_t*>(ws.base + (first_slot + t) * ws.stride);
    uint32_t* bpack = apack + (mc_max * kpb + 15) / 16 * 16;
    const auto [r0, r1, c0, c1] = share_of(split_cols, M, N, kMr, kNr, t, nt);
    auto run = [&](int64_t kb, int64_t p0, int64_t kp, int64_t ic, int64_t mc, int64_t jc,
                   int64_t nc) {
      for (int64_t jq = 0; jq < ceil_div(nc, kNr); ++jq) {
        const int cols = static_cast<int>(std::min<int64_t>(kNr, nc - jq * kNr));
        for (int64_t iq = 0; iq < ceil_div(mc, kMr); ++iq) {
          const int rows = static_cast<int>(std::min<int64_t>(kMr, mc - iq * kMr));
          const int64_t i = ic + iq * kMr, j = jc + jq * kNr;
          const TileOut o = tile_out(C, ldc, out, i, j, kb, kblocks, transposed);
          if (a_in_place)
            micro_bf16<true>(kp, {nullptr, A + i * lda + 2 * p0, lda}, bpack + jq * kp * kNr, rows,
                             cols, o);
          else
            micro_bf16<false>(kp, {apack + iq * kp * kMr}, bpack + jq * kp * kNr, rows, cols, o);
        }
      }
    };
    auto pack_a = [&](int64_t ic, int64_t mc, int64_t p0, int64_t kp) {
      if (!a_in_place) pack_pairs<kMr>(A, ars, acs, ic, mc, K, p0, kp, kp, apack);
    };
    auto pack_b = [&](int64_t jc, int64_t nc, int64_t p0, int64_t kp) {
      pack_pairs<kNr>(B, bcs, brs, jc, nc, K, p0, kp, kp, bpack);
    };
    for_each_block(pairs, kpb, kblocks, r0, r1, c0, c1, mc_max, nc_max, pack_a, pack_b, run);
  };
  run_on_team(threads, body);
  return true;
}
}  // namespace

CSTORCH_INTRINSICS_END

#else

bool bf16_gemm_runs_here() {
  return false;
}
size_t sgemm_bf16_scratch_floats() {
  return 0;
}
bool bf16_gemm_amx(int) {
  return false;
}
bool bf16_gemm_widened(int) {
  return true;
}
bool sgemm_bf16(bool, bool, int64_t, int64_t, int64_t, const uint16_t*, int64_t, const uint16_t*,
                int64_t, float*, int64_t, int, const Scratch&, const Bf16Result&) {
  return false;
}

#endif

}  // namespace cstorch::cpu
