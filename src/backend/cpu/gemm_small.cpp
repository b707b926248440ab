// Products with one short side (gemm.h: sgemm_small), for variants without the own AVX-512 GEMM.
// OpenBLAS packs both operands into its panels whatever their shape; with 10 rows, columns or
// inner steps (a classifier's layer and its gradients) the packing costs more than the
// arithmetic. Two direct kernels, both summing each element's K products in order, one FMA at a
// time (or in eight interleaved lanes, for the dot form, added in a fixed tree), so an element's
// bits depend only on its row of A and column of B: never on the thread count or the tiling.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cpu/gemm.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CSTORCH_SMALL_GEMM 1
#else
#define CSTORCH_SMALL_GEMM 0
#endif

namespace cstorch::cpu {

namespace {

#if CSTORCH_SMALL_GEMM

// The product's multiply-adds, up to which a direct kernel runs it. Measured on AMD EPYC Zen 1
// (AVX2), one thread: FC-MNIST's batch-4 step (ten layers of 50) 112 against 138 us a step with
// these products on OpenBLAS (three alternated runs each); the batch-128 step (784-256-256-10, 2
// threads) unchanged within noise (2.77 against 2.79 ms), its three classifier products being
// 3% of it. Alone, with operands from malloc, 128 x 256 x 10 takes 21 us against OpenBLAS's 30
// and 4 x 50 x 784 (B^T) 11 against 21; but OpenBLAS's Zen kernel runs slower alone than inside
// the step (`perf`: most of its time on the instruction after a prefetch), so only the step's
// figures decide. Past 2^22 the kernels, which re-read an operand for each tile of rows or columns,
// fall behind OpenBLAS where the long sides amortise its packing (16 x 4096 x 768 with A^T: 12.2
// against 6.6 ms).
constexpr double kSmallMaxMacs = static_cast<double>(1 << 22);
// The short side: at most this many rows, columns or inner steps.
constexpr int64_t kShort = 16;

enum class Form { none, broadcast, dot };

Form form_of(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  if (M <= 0 || N <= 0 || K <= 0) return Form::none;
  if (static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) > kSmallMaxMacs)
    return Form::none;
  // B's rows run along N: each of C's rows is a sum of B's rows scaled by A's elements.
  if (!tb && (K <= kShort || M <= kShort)) return Form::broadcast;
  // Both operands' rows run along K: each element is a dot product of two contiguous rows.
  // Not for K < 64: the horizontal sums at the end then cost more than OpenBLAS's whole product
  // (4 x 50 x 50: 1.5 against 1.3 us).
  if (tb && !ta && K >= 64 && (N <= kShort || M <= kShort)) return Form::dot;
  return Form::none;
}

// The lanes of the last, partial vector of a row of n (1..8) floats.
inline __m256i tail_mask(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx);
}

// Accumulators named one by one: GCC keeps an array of vectors indexed in a loop on the stack,
// storing every one after each multiply-add (twice the time of the arithmetic, measured).
struct Acc4x2 {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
};

// C[i0 .. i0+R, j0 .. j0+16) (the first `cols` columns) = sum over k of A(i, k) * B[k, j] (B
// rows along N), + beta * C where beta != 0 (C is not read with beta 0). R is 1, 2 or 4.
template <int R, bool Full>
void broadcast_tile(bool ta, int64_t K, const float* A, int64_t lda, int64_t i0, const float* B,
                    int64_t ldb, int64_t j0, int64_t cols, float beta, float* C, int64_t ldc) {
  static_assert(R == 1 || R == 2 || R == 4);
  const __m256i m0 = tail_mask(std::min<int64_t>(cols, 8));
  const __m256i m1 = tail_mask(std::max<int64_t>(cols - 8, 0));
  Acc4x2 acc;
  const int64_t sa_row = ta ? 1 : lda, sa_k = ta ? lda : 1;  // A(i, k) = A[i * sa_row + k * sa_k]
  const float* a = A + i0 * sa_row;
  const float* b = B + j0;
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = Full ? _mm256_loadu_ps(b) : _mm256_maskload_ps(b, m0);
    const __m256 b1 = Full ? _mm256_loadu_ps(b + 8) : _mm256_maskload_ps(b + 8, m1);
    __m256 av = _mm256_broadcast_ss(a);
    acc.a0 = _mm256_fmadd_ps(av, b0, acc.a0);
    acc.a1 = _mm256_fmadd_ps(av, b1, acc.a1);
    if constexpr (R >= 2) {
      av = _mm256_broadcast_ss(a + sa_row);
      acc.b0 = _mm256_fmadd_ps(av, b0, acc.b0);
      acc.b1 = _mm256_fmadd_ps(av, b1, acc.b1);
    }
    if constexpr (R == 4) {
      av = _mm256_broadcast_ss(a + 2 * sa_row);
      acc.c0 = _mm256_fmadd_ps(av, b0, acc.c0);
      acc.c1 = _mm256_fmadd_ps(av, b1, acc.c1);
      av = _mm256_broadcast_ss(a + 3 * sa_row);
      acc.d0 = _mm256_fmadd_ps(av, b0, acc.d0);
      acc.d1 = _mm256_fmadd_ps(av, b1, acc.d1);
    }
    a += sa_k;
    b += ldb;
  }
  const __m256 bv = _mm256_set1_ps(beta);
  auto store = [&](int r, __m256 v0, __m256 v1) {
    float* c = C + (i0 + r) * ldc + j0;
    if constexpr (Full) {
      if (beta != 0.f) {
        v0 = _mm256_fmadd_ps(bv, _mm256_loadu_ps(c), v0);
        v1 = _mm256_fmadd_ps(bv, _mm256_loadu_ps(c + 8), v1);
      }
      _mm256_storeu_ps(c, v0);
      _mm256_storeu_ps(c + 8, v1);
    } else {  // through a buffer: a masked store is microcoded on some CPUs (AMD Zen 1)
      alignas(32) float t[16];
      if (beta != 0.f) {
        for (int64_t j = 0; j < cols; ++j) t[j] = c[j];
        v0 = _mm256_fmadd_ps(bv, _mm256_load_ps(t), v0);
        v1 = _mm256_fmadd_ps(bv, _mm256_load_ps(t + 8), v1);
      }
      _mm256_store_ps(t, v0);
      _mm256_store_ps(t + 8, v1);
      for (int64_t j = 0; j < cols; ++j) c[j] = t[j];
    }
  };
  store(0, acc.a0, acc.a1);
  if constexpr (R >= 2) store(1, acc.b0, acc.b1);
  if constexpr (R == 4) {
    store(2, acc.c0, acc.c1);
    store(3, acc.d0, acc.d1);
  }
}

// The eight lanes of v added in a fixed tree: (0+4, 1+5, 2+6, 3+7), then pairs, then the two.
inline float lanes_sum(__m256 v) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

// C[i0 .. i0+R, j0 .. j0+S) = dot(A's row i, B's row j) over K (both rows along K), + beta * C
// where beta != 0: eight lanes of interleaved partial sums (k = l, l + 8, ...), then lanes_sum.
// R is 1 or 2, S 1 or 4.
template <int R, int S>
void dot_tile(int64_t K, const float* A, int64_t lda, int64_t i0, const float* B, int64_t ldb,
              int64_t j0, float beta, float* C, int64_t ldc) {
  static_assert((R == 1 || R == 2) && (S == 1 || S == 4));
  Acc4x2 acc;  // row 0: a0 a1 b0 b1 (columns 0-3), row 1: c0 c1 d0 d1
  const float* a0 = A + i0 * lda;
  const float* a1 = R == 2 ? a0 + lda : a0;
  const float* b0 = B + j0 * ldb;
  const float* b1 = S == 4 ? b0 + ldb : b0;
  const float* b2 = S == 4 ? b0 + 2 * ldb : b0;
  const float* b3 = S == 4 ? b0 + 3 * ldb : b0;
  // One step of 8 along K: `load` reads 8 floats (all, or the tail's lanes and zeros: a 0 * 0
  // term leaves a partial sum as it is).
  auto step = [&](int64_t k, auto load) {
    const __m256 x0 = load(a0 + k);
    const __m256 y0 = load(b0 + k);
    acc.a0 = _mm256_fmadd_ps(x0, y0, acc.a0);
    __m256 x1 = x0;
    if constexpr (R == 2) {
      x1 = load(a1 + k);
      acc.c0 = _mm256_fmadd_ps(x1, y0, acc.c0);
    }
    if constexpr (S == 4) {
      const __m256 y1 = load(b1 + k), y2 = load(b2 + k), y3 = load(b3 + k);
      acc.a1 = _mm256_fmadd_ps(x0, y1, acc.a1);
      acc.b0 = _mm256_fmadd_ps(x0, y2, acc.b0);
      acc.b1 = _mm256_fmadd_ps(x0, y3, acc.b1);
      if constexpr (R == 2) {
        acc.c1 = _mm256_fmadd_ps(x1, y1, acc.c1);
        acc.d0 = _mm256_fmadd_ps(x1, y2, acc.d0);
        acc.d1 = _mm256_fmadd_ps(x1, y3, acc.d1);
      }
    }
  };
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) step(k, [](const float* p) { return _mm256_loadu_ps(p); });
  if (k < K) {
    const __m256i m = tail_mask(K - k);
    step(k, [m](const float* p) { return _mm256_maskload_ps(p, m); });
  }
  auto put = [&](int r, int c, __m256 v) {
    float* out = C + (i0 + r) * ldc + j0 + c;
    const float x = lanes_sum(v);
    *out = beta != 0.f ? std::fma(beta, *out, x) : x;
  };
  put(0, 0, acc.a0);
  if constexpr (S == 4) {
    put(0, 1, acc.a1);
    put(0, 2, acc.b0);
    put(0, 3, acc.b1);
  }
  if constexpr (R == 2) {
    put(1, 0, acc.c0);
    if constexpr (S == 4) {
      put(1, 1, acc.c1);
      put(1, 2, acc.d0);
      put(1, 3, acc.d1);
    }
  }
}

// Rows in tiles of 4 (the last 1-3 in a tile of 2 and one of 1), columns [j0, j0 + cols), cols
// <= 16. Fewer than 4 rows leave the FMA unit idle between the dependent steps of a sum.
void broadcast_rows(bool ta, int64_t M, int64_t K, const float* A, int64_t lda, const float* B,
                    int64_t ldb, int64_t j0, int64_t cols, float beta, float* C, int64_t ldc) {
  auto rows = [&]<bool Full>() {
    int64_t i = 0;
    for (; i + 4 <= M; i += 4)
      broadcast_tile<4, Full>(ta, K, A, lda, i, B, ldb, j0, cols, beta, C, ldc);
    if (i + 2 <= M) {
      broadcast_tile<2, Full>(ta, K, A, lda, i, B, ldb, j0, cols, beta, C, ldc);
      i += 2;
    }
    if (i < M) broadcast_tile<1, Full>(ta, K, A, lda, i, B, ldb, j0, cols, beta, C, ldc);
  };
  if (cols == 16)
    rows.template operator()<true>();
  else
    rows.template operator()<false>();
}

// C[i0 .. i0+8, j] = dot(A's row i, B's row j): one column against 8 rows (as dot_tile sums).
void dot_col8(int64_t K, const float* A, int64_t lda, int64_t i0, const float* B, int64_t ldb,
              int64_t j, float beta, float* C, int64_t ldc) {
  Acc4x2 acc;  // rows 0-7: a0 a1 b0 b1 c0 c1 d0 d1
  const float* a = A + i0 * lda;
  const float* b = B + j * ldb;
  auto step = [&](int64_t k, auto load) {
    const __m256 y = load(b + k);
    acc.a0 = _mm256_fmadd_ps(load(a + k), y, acc.a0);
    acc.a1 = _mm256_fmadd_ps(load(a + lda + k), y, acc.a1);
    acc.b0 = _mm256_fmadd_ps(load(a + 2 * lda + k), y, acc.b0);
    acc.b1 = _mm256_fmadd_ps(load(a + 3 * lda + k), y, acc.b1);
    acc.c0 = _mm256_fmadd_ps(load(a + 4 * lda + k), y, acc.c0);
    acc.c1 = _mm256_fmadd_ps(load(a + 5 * lda + k), y, acc.c1);
    acc.d0 = _mm256_fmadd_ps(load(a + 6 * lda + k), y, acc.d0);
    acc.d1 = _mm256_fmadd_ps(load(a + 7 * lda + k), y, acc.d1);
  };
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) step(k, [](const float* p) { return _mm256_loadu_ps(p); });
  if (k < K) {
    const __m256i m = tail_mask(K - k);
    step(k, [m](const float* p) { return _mm256_maskload_ps(p, m); });
  }
  const __m256 v[8] = {acc.a0, acc.a1, acc.b0, acc.b1, acc.c0, acc.c1, acc.d0, acc.d1};
  for (int r = 0; r < 8; ++r) {
    float* out = C + (i0 + r) * ldc + j;
    const float x = lanes_sum(v[r]);
    *out = beta != 0.f ? std::fma(beta, *out, x) : x;
  }
}

// Rows [i0, i0 + rows), rows <= 8, against every column: columns in tiles of 4 with rows in
// pairs; the last 1-3 columns against all 8 rows at once where there are 8 (a column against
// one or two rows leaves the FMA unit idle between the dependent steps of its sums).
void dot_rows(int64_t rows, int64_t N, int64_t K, const float* A, int64_t lda, int64_t i0,
              const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  int64_t j = 0;
  for (; j + 4 <= N; j += 4) {
    int64_t i = i0;
    for (; i + 2 <= i0 + rows; i += 2) dot_tile<2, 4>(K, A, lda, i, B, ldb, j, beta, C, ldc);
    if (i < i0 + rows) dot_tile<1, 4>(K, A, lda, i, B, ldb, j, beta, C, ldc);
  }
  for (; j < N; ++j) {
    if (rows == 8) {
      dot_col8(K, A, lda, i0, B, ldb, j, beta, C, ldc);
      continue;
    }
    int64_t i = i0;
    for (; i + 2 <= i0 + rows; i += 2) dot_tile<2, 1>(K, A, lda, i, B, ldb, j, beta, C, ldc);
    if (i < i0 + rows) dot_tile<1, 1>(K, A, lda, i, B, ldb, j, beta, C, ldc);
  }
}

#endif  // CSTORCH_SMALL_GEMM

}  // namespace

bool sgemm_small(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads) {
#if CSTORCH_SMALL_GEMM
  const Form f = form_of(ta, tb, M, N, K);
  if (f == Form::none) return false;
  const int team = omp_in_parallel() ? 1 : std::max(1, threads);
  // Column tiles of 16 (broadcast) or row tiles of 8 (dot), shared by the team; a team of one
  // runs them without entering a parallel region (which costs about a microsecond, as much as a
  // product of 10^4 multiply-adds).
  const bool broadcast = f == Form::broadcast;
  const int64_t tiles = broadcast ? (N + 15) / 16 : (M + 7) / 8;
  auto tile = [&](int64_t t) {
    if (broadcast)
      broadcast_rows(ta, M, K, A, lda, B, ldb, t * 16, std::min<int64_t>(16, N - t * 16), beta, C,
                     ldc);
    else
      dot_rows(std::min<int64_t>(8, M - t * 8), N, K, A, lda, t * 8, B, ldb, beta, C, ldc);
  };
  if (team == 1 || tiles == 1) {
    for (int64_t t = 0; t < tiles; ++t) tile(t);
  } else {
#pragma omp parallel for num_threads(team) schedule(static)
    for (int64_t t = 0; t < tiles; ++t) tile(t);
  }
  return true;
#else
  (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)A, (void)lda, (void)B, (void)ldb, (void)beta,
      (void)C, (void)ldc, (void)threads;
  return false;
#endif
}

}  // namespace cstorch::cpu
