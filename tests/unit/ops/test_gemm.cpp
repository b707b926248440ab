// Unit tests of cstorch's own GEMM, on every variant of the CPU kernels this CPU runs that has
// one (the AVX-512 ones), and of the Gemm node's kernel (below)
// (src/backend/cpu/gemm.cpp) against a double-precision host reference: every transpose
// combination, leading dimensions wider than the matrix, alpha and beta (0, 1, other), K of 0 and K
// spanning several blocks, row and column remainders of every size, a bias row added once over
// several K blocks, and teams of 1-4 threads (each thread packs its own panels into its own area
// of the scratch it is handed; a shared buffer raced here before). The padding columns of C and
// the memory between and after the scratch areas must never be written.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/device.h"
#include "backend/cpu/variant.h"
#include "ir/node.h"
#include "unit/ir_nodes.h"
#include "unit/test_util.h"

namespace {

struct Case {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  int threads;
  bool bias = false;  // add a bias row vector (once, whatever the number of K blocks)
};

// The variants of the kernels this CPU runs that have an own GEMM (those built with AVX-512).
std::vector<const cstorch::cpu::KernelVariant*> own_gemm_variants() {
  std::vector<const cstorch::cpu::KernelVariant*> r;
  for (const auto* v : cstorch::cpu::built_variants())
    if (cstorch::cpu::runs_here(*v) && v->own_gemm_applies(64, 64, 64, false)) r.push_back(v);
  return r;
}

// Runs one case on variant v's own GEMM (or, with small, its short-side kernels: alpha 1, no
// bias, no scratch; C starts as NaN where beta is 0, which must never be read) and returns the
// number of wrong elements (printing the first few).
int check(const Case& c, std::mt19937& rng, const cstorch::cpu::KernelVariant& v,
          bool small = false) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> pad(0, 3);
  const int64_t lda = (c.ta ? c.M : c.K) + pad(rng), ldb = (c.tb ? c.K : c.N) + pad(rng);
  const int64_t ldc = c.N + pad(rng);
  std::vector<float> A((c.ta ? c.K : c.M) * lda + 1), B((c.tb ? c.N : c.K) * ldb + 1), C(c.M * ldc);
  for (auto* v : {&A, &B, &C})
    for (auto& x : *v) x = u(rng);
  if (small && c.beta == 0.f)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) C[i * ldc + j] = std::nanf("");
  const std::vector<float> C0 = C;
  std::vector<float> bias(c.N);
  for (auto& x : bias) x = u(rng);
  // One scratch area per thread of the size sgemm_avx512_scratch_floats gives, a guard of 16
  // floats after each, all filled with a pattern the GEMM must not touch outside the areas.
  const size_t floats = v.sgemm_scratch_floats(c.N, c.K, c.ta, c.tb, false);
  const size_t stride = floats + 16;
  std::vector<float> ws(stride * c.threads, -7.f);
  const cstorch::cpu::Scratch scratch{ws.data(), stride, floats, c.threads};
  if (small) {
    if (!v.sgemm_small(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, c.beta, C.data(),
                       ldc, c.threads)) {
      ADD_FAILURE() << v.name << ": the short-side kernels refused a product";
      return 1;
    }
  } else if (!v.sgemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta,
                      C.data(), ldc, c.threads, scratch,
                      cstorch::cpu::GemmEpilogue{.bias = c.bias ? bias.data() : nullptr})) {
    ADD_FAILURE() << v.name << ": the own GEMM refused a product";
    return 1;
  }
  int bad = 0;
  for (int t = 0; t < c.threads; ++t)
    for (size_t i = floats; i < stride; ++i)
      if (ws[t * stride + i] != -7.f && bad++ < 3)
        ADD_FAILURE() << "scratch guard " << i - floats << " after area " << t << " was written";
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = C[i * ldc + j];
      if (j >= c.N) {
        if (got != C0[i * ldc + j] && bad++ < 3)
          ADD_FAILURE() << "padding column " << j << " of row " << i << " was written";
        continue;
      }
      double s = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double p = static_cast<double>(c.ta ? A[k * lda + i] : A[i * lda + k]) *
                         (c.tb ? B[j * ldb + k] : B[k * ldb + j]);
        s += p;
        mag += std::fabs(p);
      }
      const double want =
          c.alpha * s + (c.beta == 0.f ? 0.0 : c.beta * C0[i * ldc + j]) + (c.bias ? bias[j] : 0.0);
      if (std::isnan(got) && bad++ < 3)
        ADD_FAILURE() << v.name << ": C(" << i << "," << j << ") is NaN (C read with beta 0?)";
      // fp32 accumulation over K terms: error bounded by ~K * eps * sum|a*b|.
      const double tol = 1e-6 * (1.0 + static_cast<double>(c.K)) * (mag + 1.0) * 1.2;
      if (std::fabs(got - want) > tol && bad++ < 3)
        ADD_FAILURE() << v.name << ": M" << c.M << " N" << c.N << " K" << c.K << " ta" << c.ta
                      << " tb" << c.tb << " threads " << c.threads << ": C(" << i << "," << j
                      << ") = " << got << ", want " << want;
    }
  }
  return bad;
}

TEST(OwnGemm, RandomShapesTransposesAlphaBetaThreads) {
  const auto variants = own_gemm_variants();
  if (variants.empty())
    GTEST_SKIP() << "this CPU runs no AVX-512 variant of the kernels: OpenBLAS runs products";
  for (const auto* v : variants) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> dm(1, 70), dn(1, 100), dk(0, 900), d2(0, 1), dt(1, 4);
    const float alphas[] = {1.f, 0.5f, -2.f}, betas[] = {0.f, 1.f, 0.3f};
    for (int it = 0; it < 240; ++it) {
      Case c{dm(rng),
             dn(rng),
             dk(rng),
             d2(rng) == 1,
             d2(rng) == 1,
             alphas[it % 3],
             betas[(it / 3) % 3],
             dt(rng),
             it % 4 == 0};
      ASSERT_EQ(check(c, rng, *v), 0) << v->name << " case " << it;
    }
  }
}

TEST(OwnGemm, TrainingShapesAndEdges) {
  std::mt19937 rng(11);
  // The FC-MNIST step's products, a classifier head (N < 16), K = 0 (C = beta * C), K over
  // several 384-blocks, more column panels than one N block (1536), and wide untransposed B
  // (N >= 1024) with enough rows to be packed (M >= 96), on one thread and three.
  const Case cases[] = {
      {120, 1100, 200, true, false, 0.5f, 1.f, 2},
      {97, 2100, 384, false, false, 1.f, 0.f, 3},
      {96, 1024, 33, false, false, 1.f, 0.3f, 1},
      {95, 1024, 33, false, false, 1.f, 0.3f, 2},
      {128, 256, 784, false, true, 1.f, 0.f, 2, true},
      {256, 784, 128, true, false, 1.f, 0.f, 2},
      {128, 256, 256, false, false, 1.f, 0.f, 2},
      {256, 256, 128, true, false, 1.f, 0.9f, 2},
      {128, 10, 256, false, true, 1.f, 0.f, 1},
      {10, 256, 128, true, false, 1.f, 0.f, 3},
      {7, 9, 0, false, false, 1.f, 0.5f, 2, true},
      {33, 40, 1000, true, true, 0.25f, 0.f, 2},
      {13, 1600, 20, false, false, 1.f, 0.f, 2},
      {1, 1, 1, false, false, 1.f, 0.f, 1},
      // Few rows of a transposed B (the dot path): a batch of 4 through FC-MNIST's first layer,
      // one row against a wide weight on three threads, masked K and column tails.
      {4, 50, 784, false, true, 1.f, 0.f, 1, true},
      {1, 3072, 768, false, true, 1.f, 0.3f, 3},
      {3, 37, 65, false, true, -2.f, 1.f, 2, true},
      {4, 17, 64, false, true, 0.5f, 0.f, 1},
      // K < 8 (a weight gradient over a batch of 4), one row with an untransposed B.
      {50, 784, 4, true, false, 1.f, 0.9f, 2},
      {1, 300, 100, false, false, 1.f, 0.f, 1},
      // A B^T with N > M >= 64, computed as C^T = B A^T (own_gemm_swaps): row and column tails
      // of the transposed tiles, several K blocks, alpha and beta, a bias.
      {64, 65, 3, false, true, 1.f, 0.f, 1, true},
      {77, 500, 1602, false, true, 0.5f, 0.3f, 2, true},
      {100, 1234, 385, false, true, -2.f, 1.f, 3, true},
  };
  const auto variants = own_gemm_variants();
  if (variants.empty())
    GTEST_SKIP() << "this CPU runs no AVX-512 variant of the kernels: OpenBLAS runs products";
  for (const auto* v : variants)
    for (const auto& c : cases)
      EXPECT_EQ(check(c, rng, *v), 0) << v->name << ": M" << c.M << " N" << c.N << " K" << c.K;
}

// Every 7th row and 5th column of C against the double-precision alpha * op(A) op(B) + beta * C0
// + bias (+ -0.5 * addend, row-major [M, N], when given), op(A)(i, k) = a(i, k) and op(B)(k, j) =
// b(k, j): within the fp32 bound of a K-term sum (1e-6 (K + 1) (sum of |products| + 1), with 20%
// headroom for the epilogue's roundings).
template <class FA, class FB>
void expect_near_double_product(const std::string& name, const std::vector<float>& C, int64_t ldc,
                                int64_t M, int64_t N, int64_t K, FA a, FB b, float alpha,
                                float beta, const std::vector<float>& C0,
                                const std::vector<float>& bias, const std::vector<float>* add) {
  for (int64_t i = 0; i < M; i += 7) {
    for (int64_t j = 0; j < N; j += 5) {
      double d = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(a(i, k)) * b(k, j);
        d += p;
        mag += std::fabs(p);
      }
      const double want =
          alpha * d + beta * C0[i * ldc + j] + bias[j] + (add ? -0.5 * (*add)[i * N + j] : 0.0);
      ASSERT_NEAR(C[i * ldc + j], want, 1e-6 * (K + 1.0) * (mag + 1.0) * 1.2)
          << name << ": C(" << i << "," << j << ")";
    }
  }
}

// An A B^T product with more columns than rows is computed as its transpose C^T = B A^T
// (own_gemm_swaps: the weight read in place, the activations packed, each tile transposed on its
// way to C): the same FMAs in the same order, so bitwise the direct form of the same product (B
// given un-transposed, which is never swapped), with a bias and relu, alpha and beta, one K block
// and several, tails of rows and columns, at 1-3 threads; C's padding never written.
TEST(OwnGemm, SwappedFormIsBitwiseTheDirectForm) {
  const auto variants = own_gemm_variants();
  if (variants.empty())
    GTEST_SKIP() << "this CPU runs no AVX-512 variant of the kernels: OpenBLAS runs products";
  struct Shape {
    int64_t M, N, K;
  };
  for (const auto* v : variants) {
    std::mt19937 rng(13);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (const Shape sh : {Shape{64, 65, 1}, Shape{77, 500, 768}, Shape{96, 1234, 1602},
                           Shape{256, 3072, 768}, Shape{130, 131, 3072}}) {
      const int64_t M = sh.M, N = sh.N, K = sh.K, lda = K + 1, ldbt = K + 3, ldb = N + 5,
                    ldc = N + 2;
      // The first call below takes the swapped form, the second the direct one.
      ASSERT_TRUE(cstorch::cpu::own_gemm_swaps(false, true, M, N));
      ASSERT_FALSE(cstorch::cpu::own_gemm_swaps(false, false, M, N));
      std::vector<float> A(M * lda), Bt(N * ldbt), B(K * ldb), C0(M * ldc), bias(N);
      for (auto* x : {&A, &Bt, &C0, &bias})
        for (auto& e : *x) e = u(rng);
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) B[k * ldb + j] = Bt[j * ldbt + k];
      // Scratch sized as the planner sizes it for each call.
      const size_t fs = v->sgemm_scratch_floats(N, K, false, true, false),
                   fd = v->sgemm_scratch_floats(N, K, false, false, false);
      for (int threads : {1, 2, 3}) {
        std::vector<float> ws_s(fs * threads + 1), ws_d(fd * threads + 1);
        const cstorch::cpu::Scratch ss{ws_s.data(), fs, fs, threads},
            sd{ws_d.data(), fd, fd, threads};
        for (int form = 0; form < 4; ++form) {
          const float alpha = form == 3 ? -0.5f : 1.f, beta = form == 1   ? 1.f
                                                              : form == 3 ? 0.3f
                                                                          : 0.f;
          cstorch::cpu::GemmEpilogue ep;
          if (form >= 2) ep.bias = bias.data();
          ep.relu = form == 2;
          std::vector<float> swapped = C0, direct = C0;
          ASSERT_TRUE(v->sgemm(false, true, M, N, K, alpha, A.data(), lda, Bt.data(), ldbt, beta,
                               swapped.data(), ldc, threads, ss, ep));
          ASSERT_TRUE(v->sgemm(false, false, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta,
                               direct.data(), ldc, threads, sd, ep));
          ASSERT_EQ(swapped, direct) << v->name << ": M" << M << " N" << N << " K" << K << ", form "
                                     << form << ", " << threads << " threads";
          if (form == 0)
            expect_near_double_product(
                v->name, swapped, ldc, M, N, K,
                [&](int64_t i, int64_t k) { return A[i * lda + k]; },
                [&](int64_t k, int64_t j) { return Bt[j * ldbt + k]; }, 1.f, 0.f, C0,
                std::vector<float>(N, 0.f), nullptr);
        }
      }
    }
  }
}

// A read in place with rows a multiple of 1024 floats apart (they alias in L1) is read from a
// copy of each micro-panel instead: the same values in the same FMAs, so the same bits as the
// same product with a leading dimension 16 floats wider (read in place), with alpha, beta, a
// bias, several K blocks, one K block with an addend, partial tiles, at 1 and 2 threads; and
// within the fp32 bound of the double product.
TEST(OwnGemm, AliasingRowsOfACopiedGiveTheSameBits) {
  namespace cpu = cstorch::cpu;
  const auto variants = own_gemm_variants();
  if (variants.empty())
    GTEST_SKIP() << "this CPU runs no AVX-512 variant of the kernels: OpenBLAS runs products";
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  struct Shape {
    int64_t M, N, K, lda;
    bool tb, addend;
    float alpha, beta;
  };
  for (const auto* v : variants) {
    for (const Shape sh : {Shape{100, 300, 1024, 1024, true, false, 1.f, 0.f},
                           Shape{256, 768, 3072, 3072, false, false, 1.f, 0.f},
                           Shape{37, 70, 2000, 2048, true, false, 0.5f, 0.3f},
                           Shape{50, 100, 1000, 1024, false, true, 1.f, 0.f}}) {
      const int64_t M = sh.M, N = sh.N, K = sh.K, ldb = sh.tb ? K + 1 : N + 3, ldc = N + 2;
      std::vector<float> A(M * sh.lda), Aw(M * (sh.lda + 16)), B((sh.tb ? N : K) * ldb), bias(N),
          add(M * N), C0(M * ldc);
      for (auto* x : {&A, &B, &bias, &add, &C0})
        for (auto& e : *x) e = u(rng);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k) Aw[i * (sh.lda + 16) + k] = A[i * sh.lda + k];
      const size_t floats = v->sgemm_scratch_floats(N, K, false, sh.tb, sh.addend);
      ASSERT_GT(floats, 0u) << "B is packed: the copy has room after the panels";
      cpu::GemmEpilogue ep{.bias = bias.data()};
      if (sh.addend) {
        ep.addend = add.data();
        ep.ld_addend = N;
        ep.addend_scale = -0.5f;
      }
      for (int threads : {1, 2}) {
        std::vector<float> ws(floats * threads + 16);
        const cpu::Scratch scratch{ws.data(), floats, floats, threads};
        std::vector<float> copied = C0, in_place = C0;
        ASSERT_TRUE(v->sgemm(false, sh.tb, M, N, K, sh.alpha, A.data(), sh.lda, B.data(), ldb,
                             sh.beta, copied.data(), ldc, threads, scratch, ep));
        ASSERT_TRUE(v->sgemm(false, sh.tb, M, N, K, sh.alpha, Aw.data(), sh.lda + 16, B.data(), ldb,
                             sh.beta, in_place.data(), ldc, threads, scratch, ep));
        ASSERT_EQ(copied, in_place)
            << v->name << ": M" << M << " N" << N << " K" << K << ", " << threads << " threads";
        expect_near_double_product(
            v->name, copied, ldc, M, N, K, [&](int64_t i, int64_t k) { return A[i * sh.lda + k]; },
            [&](int64_t k, int64_t j) { return sh.tb ? B[j * ldb + k] : B[k * ldb + j]; }, sh.alpha,
            sh.beta, C0, bias, sh.addend ? &add : nullptr);
      }
    }
  }
}

// A transposed A (a weight gradient) with scratch sized for it (ta) is read from a copy of each
// micro-panel, one line per K step, copied eight micro-panels at a time (M = 1024 split at rows
// 341 and 682 by 3 threads: groups that start off the 12-row grid; M = 101: one partial group
// ending in a partial micro-panel), with B packed and wider N blocks: the same values in the same
// FMAs as the untransposed product of A^T written out (read in place), so the same bits, with
// alpha, beta, a bias, several K blocks, one K block with an addend, partial tiles and a row
// stride of a multiple of 1024 floats, at 1, 2 and 3 threads; and within the fp32 bound of the
// double product. M = 1 (a layer with one output, lda = 1, K = 512: B packed for K > 384) has
// both of A's strides 1; its copy is still laid out along i, and a kernel that took it for rows
// along k read it wrong: the Linear(32, 1) weight gradient of examples/external/mlp_adamw (512
// samples a step) came out wrong.
TEST(OwnGemm, TransposedACopiedGivesTheSameBits) {
  namespace cpu = cstorch::cpu;
  const auto variants = own_gemm_variants();
  if (variants.empty())
    GTEST_SKIP() << "this CPU runs no AVX-512 variant of the kernels: OpenBLAS runs products";
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  struct Shape {
    int64_t M, N, K, lda;
    bool addend;
    float alpha, beta;
  };
  for (const auto* v : variants) {
    for (const Shape sh : {Shape{1, 32, 512, 1, false, 1.f, 0.f},  // one row: lda = 1 (below)
                           Shape{1024, 256, 300, 1024, false, 1.f, 0.f},    // rows first, 4K rows
                           Shape{101, 70, 900, 103, false, 0.5f, 0.3f},     // K blocks, partial
                           Shape{230, 1100, 64, 230, false, 1.f, 1.f},      // columns, N blocks
                           Shape{800, 450, 300, 805, true, -2.f, 0.5f}}) {  // one block, addend
      const int64_t M = sh.M, N = sh.N, K = sh.K, ldb = N + 3, ldc = N + 2;
      std::vector<float> A(K * sh.lda), B(K * ldb), bias(N), add(M * N), C0(M * ldc);
      for (auto* x : {&A, &B, &bias, &add, &C0})
        for (auto& e : *x) e = u(rng);
      // A^T written out, rows K + 5 floats apart (no copy of its own: a_rows_alias)
      std::vector<float> At(M * (K + 5));
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k) At[i * (K + 5) + k] = A[k * sh.lda + i];
      const size_t copied_floats = v->sgemm_scratch_floats(N, K, true, false, sh.addend);
      const size_t plain_floats = v->sgemm_scratch_floats(N, K, false, false, sh.addend);
      ASSERT_GT(copied_floats, 0u) << "A^T needs room for B's panels and its copy";
      cpu::GemmEpilogue ep{.bias = bias.data()};
      if (sh.addend) {
        ep.addend = add.data();
        ep.ld_addend = N;
        ep.addend_scale = -0.5f;
      }
      auto run = [&](bool ta, size_t floats, int threads) {
        std::vector<float> ws(std::max<size_t>(1, floats * threads));
        const cpu::Scratch scratch{ws.data(), floats, floats, threads};
        std::vector<float> C = C0;
        EXPECT_TRUE(v->sgemm(ta, false, M, N, K, sh.alpha, ta ? A.data() : At.data(),
                             ta ? sh.lda : K + 5, B.data(), ldb, sh.beta, C.data(), ldc, threads,
                             scratch, ep));
        return C;
      };
      const std::vector<float> in_place = run(false, plain_floats, 1);
      for (int threads : {1, 2, 3})
        ASSERT_EQ(run(true, copied_floats, threads), in_place)
            << v->name << ": M" << M << " N" << N << " K" << K << ", " << threads << " threads";
      expect_near_double_product(
          v->name, in_place, ldc, M, N, K, [&](int64_t i, int64_t k) { return A[k * sh.lda + i]; },
          [&](int64_t k, int64_t j) { return B[k * ldb + j]; }, sh.alpha, sh.beta, C0, bias,
          sh.addend ? &add : nullptr);
    }
  }
}

// The team's split of C (columns of packed B panels; rows for products with at least as many
// rows as columns, or too few panels; rows for B read in place) never changes a result: every
// element adds the same products in the same order on 1-4 threads, so the bits equal the
// single-thread product's (training is bitwise the same at any thread count). Shapes of each
// split, with partial tiles, several K blocks and N blocks, a bias, and one K block with an
// addend.
TEST(OwnGemm, TeamSplitNeverChangesTheBits) {
  namespace cpu = cstorch::cpu;
  const auto variants = own_gemm_variants();
  if (variants.empty())
    GTEST_SKIP() << "this CPU runs no AVX-512 variant of the kernels: OpenBLAS runs products";
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  struct Shape {
    int64_t M, N, K;
    bool ta, tb, addend;
  };
  for (const auto* v : variants) {
    for (const Shape sh : {Shape{1024, 256, 1024, false, false, false},  // rows first, K blocks
                           Shape{301, 100, 500, false, true, false},     // rows first, partial
                           Shape{800, 450, 300, true, false, true},      // rows first, 2 N blocks
                           Shape{130, 900, 800, false, true, false},     // columns
                           Shape{150, 1100, 200, true, false, false},    // columns, wide B
                           Shape{200, 300, 100, false, false, false},    // B in place
                           Shape{40, 40, 1000, false, true, false}}) {   // few panels: rows
      const int64_t M = sh.M, N = sh.N, K = sh.K;
      const int64_t lda = (sh.ta ? M : K) + 3, ldb = (sh.tb ? K : N) + 1, ldc = N + 2;
      std::vector<float> A((sh.ta ? K : M) * lda), B((sh.tb ? N : K) * ldb), bias(N), add(M * N),
          C0(M * ldc);
      for (auto* x : {&A, &B, &bias, &add, &C0})
        for (auto& e : *x) e = u(rng);
      const size_t floats = v->sgemm_scratch_floats(N, K, sh.ta, sh.tb, sh.addend);
      cpu::GemmEpilogue ep{.bias = bias.data()};
      if (sh.addend) {
        ep.addend = add.data();
        ep.ld_addend = N;
        ep.addend_scale = 0.9f;
      }
      std::vector<float> one;
      for (int threads = 1; threads <= 4; ++threads) {
        std::vector<float> ws(std::max<size_t>(1, floats * threads));
        const cpu::Scratch scratch{ws.data(), floats, floats, threads};
        std::vector<float> C = C0;
        ASSERT_TRUE(v->sgemm(sh.ta, sh.tb, M, N, K, 1.f, A.data(), lda, B.data(), ldb, 0.5f,
                             C.data(), ldc, threads, scratch, ep));
        if (threads == 1)
          one = C;
        else
          ASSERT_EQ(C, one) << v->name << ": M" << M << " N" << N << " K" << K << " ta" << sh.ta
                            << " tb" << sh.tb << ", " << threads << " threads";
      }
    }
  }
}

}  // namespace

// ---- the Gemm node's kernel against the separate kernels it replaces ----------------------

namespace {

namespace ir = cstorch::ir;
namespace cpu = cstorch::cpu;

// A kernel context with the workspace a program plans for the node: cpu::workspace_bytes(n,
// threads) bytes, 64-byte aligned (threads: the backend's own count by default).
struct Workspace {
  explicit Workspace(const ir::Node& n, int threads = cpu::workspace_threads())
      : Workspace(cpu::workspace_bytes(n, threads)) {}
  explicit Workspace(size_t bytes) : mem(bytes / sizeof(float) + 16) {
    auto p = reinterpret_cast<uintptr_t>(mem.data());
    ctx.workspace = bytes ? reinterpret_cast<void*>((p + 63) & ~uintptr_t{63}) : nullptr;
    ctx.workspace_bytes = bytes;
  }
  std::vector<float> mem;
  ir::KernelContext ctx;
};

using cstorch::testing::leaf;
using cstorch::testing::op;
std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// For one product shape: relu(linear), relu_grad(matmul, y), gelu_grad(matmul, x) in both forms
// and addcmul(matmul, C, s) (also written in place over C, as the planner places a momentum
// update, and with the parameter update P + out * r written in place into P) through cpu_Gemm,
// and the same through the separate kernels: bitwise equal (an addend over several K blocks, which
// the fusion pass never creates, within 1e-4), with variant v's kernels: every shape runs on the
// own GEMM in the AVX-512 variant (M <= 4 with a transposed B and K >= 64: its dot path), and on
// OpenBLAS with the epilogue pass in the others.
void expect_gemm_node_matches(const cpu::KernelVariant& v, int64_t M, int64_t N, int64_t K,
                              bool ta) {
  auto kernel = [&](ir::OpCode op) { return v.kernels[static_cast<int>(op)]; };
  auto ws = [&](const ir::Node& n) {
    return Workspace(v.workspace_bytes(n, cpu::workspace_threads()));
  };
  std::mt19937 rng(static_cast<uint32_t>(M * 131 + N * 7 + K));
  const cstorch::Shape sa = ta ? cstorch::Shape{K, M} : cstorch::Shape{M, K};
  auto A = leaf(sa), W = leaf({N, K}), Bm = leaf({K, N}), b = leaf({N}), C = leaf({M, N}),
       s = leaf({}), y = leaf({M, N});
  auto a = random_vec(M * K, rng), w = random_vec(N * K, rng), bm = random_vec(K * N, rng),
       bias = random_vec(N, rng), c = random_vec(M * N, rng), yv = random_vec(M * N, rng);
  const float sv = 0.9f;
  std::vector<float> want(M * N), tmp(M * N), got(M * N);
  // relu(linear(x, W, b)) (only untransposed x: a Linear's input)
  if (!ta) {
    auto lin = op(ir::OpCode::Linear, ir::NoAttrs{}, {A, W, b});
    auto relu = op(ir::OpCode::Relu, ir::NoAttrs{}, {lin});
    const void* in_lin[] = {a.data(), w.data(), bias.data()};
    kernel(ir::OpCode::Linear)(ws(*lin).ctx, *lin, in_lin, tmp.data());
    const void* in_relu[] = {tmp.data()};
    kernel(ir::OpCode::Relu)(ir::KernelContext{}, *relu, in_relu, want.data());
    auto g =
        op(ir::OpCode::Gemm, ir::GemmAttrs{.trans_b = true, .bias = true, .relu = true}, {A, W, b});
    kernel(ir::OpCode::Gemm)(ws(*g).ctx, *g, in_lin, got.data());
    EXPECT_EQ(got, want) << v.name << ": relu(linear) M" << M << " N" << N << " K" << K;
  }
  auto mm = op(ir::OpCode::Matmul, ir::MatmulAttrs{.trans_a = ta}, {A, Bm});
  const void* in_mm[] = {a.data(), bm.data()};
  kernel(ir::OpCode::Matmul)(ws(*mm).ctx, *mm, in_mm, tmp.data());
  // relu_grad(matmul, y)
  {
    auto rg = op(ir::OpCode::ReluGrad, ir::NoAttrs{}, {mm, y});
    const void* in_rg[] = {tmp.data(), yv.data()};
    kernel(ir::OpCode::ReluGrad)(ir::KernelContext{}, *rg, in_rg, want.data());
    auto g = op(ir::OpCode::Gemm, ir::GemmAttrs{.trans_a = ta, .relu_grad = true}, {A, Bm, y});
    const void* in_g[] = {a.data(), bm.data(), yv.data()};
    kernel(ir::OpCode::Gemm)(ws(*g).ctx, *g, in_g, got.data());
    EXPECT_EQ(got, want) << "relu_grad(matmul) M" << M << " N" << N << " K" << K;
  }
  // gelu_grad(matmul, x), both forms (x: y's values, scaled to reach gelu's tails)
  for (bool tanh_form : {true, false}) {
    std::vector<float> xv(yv);
    for (auto& e : xv) e *= 3.f;
    auto gg = op(ir::OpCode::GeluGrad, ir::GeluAttrs{tanh_form}, {mm, y});
    const void* in_gg[] = {tmp.data(), xv.data()};
    kernel(ir::OpCode::GeluGrad)(ir::KernelContext{}, *gg, in_gg, want.data());
    auto g =
        op(ir::OpCode::Gemm,
           ir::GemmAttrs{.trans_a = ta, .gelu_grad = true, .gelu_tanh = tanh_form}, {A, Bm, y});
    const void* in_g[] = {a.data(), bm.data(), xv.data()};
    kernel(ir::OpCode::Gemm)(ws(*g).ctx, *g, in_g, got.data());
    EXPECT_EQ(got, want) << v.name << ": gelu_grad(matmul) tanh " << tanh_form << " M" << M << " N"
                         << N << " K" << K;
  }
  // addcmul(matmul, C, s), into a fresh buffer and in place over C
  {
    auto ac = op(ir::OpCode::Addcmul, ir::NoAttrs{}, {mm, C, s});
    const void* in_ac[] = {tmp.data(), c.data(), &sv};
    kernel(ir::OpCode::Addcmul)(ir::KernelContext{}, *ac, in_ac, want.data());
    auto g = op(ir::OpCode::Gemm, ir::GemmAttrs{.trans_a = ta, .addend = true}, {A, Bm, C, s});
    const void* in_g[] = {a.data(), bm.data(), c.data(), &sv};
    kernel(ir::OpCode::Gemm)(ws(*g).ctx, *g, in_g, got.data());
    std::vector<float> inplace = c;
    const void* in_gi[] = {a.data(), bm.data(), inplace.data(), &sv};
    kernel(ir::OpCode::Gemm)(ws(*g).ctx, *g, in_gi, inplace.data());
    EXPECT_EQ(inplace, got) << "in place, M" << M << " N" << N << " K" << K;
    if (K < 8 || v.own_gemm_one_k_block(K)) {  // what the fusion pass creates
      EXPECT_EQ(got, want) << "addcmul(matmul) M" << M << " N" << N << " K" << K;
    } else {  // several K blocks: the same sums, rounded in another order
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-4 * (1.0 + std::fabs(want[i]))) << i;
    }
    // ... and also updating P <- P + out * r in place (SGD's parameter update), against
    // addcmul(P, want, r).
    if (K < 8 || v.own_gemm_one_k_block(K)) {
      auto P = leaf({M, N}), r = leaf({});
      const float rv = -0.01f;
      std::vector<float> p = random_vec(M * N, rng), p_want(M * N);
      auto up = op(ir::OpCode::Addcmul, ir::NoAttrs{}, {P, C, r});
      const void* in_up[] = {p.data(), want.data(), &rv};
      kernel(ir::OpCode::Addcmul)(ir::KernelContext{}, *up, in_up, p_want.data());
      auto gu = op(ir::OpCode::Gemm, ir::GemmAttrs{.trans_a = ta, .addend = true, .update = true},
                   {A, Bm, C, s, P, r});
      std::vector<float> mom = c;
      const void* in_gu[] = {a.data(), bm.data(), mom.data(), &sv, p.data(), &rv};
      kernel(ir::OpCode::Gemm)(ws(*gu).ctx, *gu, in_gu, mom.data());
      EXPECT_EQ(mom, want) << "momentum with update, M" << M << " N" << N << " K" << K;
      EXPECT_EQ(p, p_want) << "parameter update, M" << M << " N" << N << " K" << K;
    }
  }
}

// In every variant this CPU runs: the own GEMM in the AVX-512 one, OpenBLAS with its epilogue
// pass in the others (the x86-64 baseline of a portable build at least).
TEST(GemmKernel, EqualsTheSeparateKernelsOnBothPaths) {
  for (const auto* v : cpu::built_variants()) {
    if (!cpu::runs_here(*v)) continue;
    SCOPED_TRACE(v->name);
    expect_gemm_node_matches(*v, 48, 40, 64, false);
    expect_gemm_node_matches(*v, 48, 40, 64, true);    // transposed A (weight gradient)
    expect_gemm_node_matches(*v, 64, 70, 900, false);  // bias over several K blocks
    expect_gemm_node_matches(*v, 20, 30, 4, true);     // a weight gradient over 4 samples
    expect_gemm_node_matches(*v, 20, 30, 4, false);
    expect_gemm_node_matches(*v, 4, 50, 784, false);    // linear of 4 samples: the dot path
    expect_gemm_node_matches(*v, 200, 300, 40, false);  // several tiles and threads
  }
}

}  // namespace

// ---- the kernels' workspaces ------------------------------------------------------------

namespace {

namespace ir = cstorch::ir;
namespace cpu = cstorch::cpu;

// Runs `f` with the pool's team at `threads`, restoring it after.
template <class F>
void with_threads(int threads, F&& f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  f();
  omp_set_num_threads(saved);
}

// The workspace is planned from the node alone, one area per thread of the team a product runs
// on; handed fewer areas than the running team has threads, a kernel caps its team (here at 1)
// and computes the same bits.
TEST(GemmKernel, WorkspacePerThreadAndTheTeamCappedAtItsAreas) {
  if (!cpu::kernels().own_gemm_applies(128, 256, 784, true))
    GTEST_SKIP() << "this variant of the kernels (no AVX-512) has no own GEMM";
  std::mt19937 rng(5);
  // Linear 128 x 256 x 784 (B^T packed, on the whole team), a batched B^T matmul of small
  // products (one per task of a parallel loop) and a folded one.
  auto x = leaf({128, 784}), w = leaf({256, 784}), qa = leaf({16, 16, 32}), kb = leaf({16, 24, 32}),
       fa = leaf({4, 32, 200}), fb = leaf({96, 200});
  auto xv = random_vec(128 * 784, rng), wv = random_vec(256 * 784, rng),
       qv = random_vec(16 * 16 * 32, rng), kv = random_vec(16 * 24 * 32, rng),
       fav = random_vec(4 * 32 * 200, rng), fbv = random_vec(96 * 200, rng);
  auto lin = op(ir::OpCode::Linear, ir::NoAttrs{}, {x, w});
  auto bmm = op(ir::OpCode::Matmul, ir::MatmulAttrs{.trans_b = true}, {qa, kb});
  auto fmm = op(ir::OpCode::Matmul, ir::MatmulAttrs{.trans_b = true}, {fa, fb});
  struct Run {
    ir::NodePtr n;
    std::vector<const void*> in;
    ir::Kernel k;
  };
  const Run runs[] = {{lin, {xv.data(), wv.data()}, cpu::kernel(ir::OpCode::Linear)},
                      {bmm, {qv.data(), kv.data()}, cpu::kernel(ir::OpCode::Matmul)},
                      {fmm, {fav.data(), fbv.data()}, cpu::kernel(ir::OpCode::Matmul)}};
  for (const auto& r : runs) {
    const size_t one = cpu::workspace_bytes(*r.n, 1);
    EXPECT_GT(one, 0u) << r.n->name();
    EXPECT_EQ(cpu::workspace_bytes(*r.n, 4), 4 * one) << r.n->name();
    std::vector<float> want(r.n->numel()), capped(r.n->numel()), full(r.n->numel());
    with_threads(1, [&] { r.k(Workspace(*r.n, 1).ctx, *r.n, r.in.data(), want.data()); });
    with_threads(4, [&] {
      r.k(Workspace(*r.n, 1).ctx, *r.n, r.in.data(), capped.data());
      r.k(Workspace(*r.n, 4).ctx, *r.n, r.in.data(), full.data());
    });
    EXPECT_EQ(capped, want) << r.n->name();
    EXPECT_EQ(full, want) << r.n->name();
  }
  // Products that need no scratch (B read in place: untransposed, narrow, one K block) plan
  // none; with
  // more than one K block B is packed too; an OpenBLAS product with an addend plans one product
  // buffer, whatever the team.
  auto nt = op(ir::OpCode::Matmul, ir::MatmulAttrs{}, {leaf({128, 256}), leaf({256, 256})});
  EXPECT_EQ(cpu::workspace_bytes(*nt, 4), 0u);
  auto deep = op(ir::OpCode::Matmul, ir::MatmulAttrs{}, {x, leaf({784, 256})});
  EXPECT_GT(cpu::workspace_bytes(*deep, 4), 0u);
  // (In each variant this CPU runs: the own GEMM reads this B in place.)
  auto g = op(ir::OpCode::Gemm, ir::GemmAttrs{.addend = true},
              {leaf({20, 4}), leaf({4, 30}), leaf({20, 30}), leaf({})});
  for (const auto* v : cpu::built_variants()) {
    if (!cpu::runs_here(*v)) continue;
    // 20 x 30, rounded to 64 bytes
    const size_t want = v->own_gemm_applies(20, 30, 4, false) ? 0 : 608 * sizeof(float);
    EXPECT_EQ(v->workspace_bytes(*g, 1), want) << v->name;
    EXPECT_EQ(v->workspace_bytes(*g, 4), want) << v->name;
  }
}

// A workspace smaller than the kernel needs is an error naming the op and the sizes, before
// anything is written.
TEST(GemmKernel, TooSmallWorkspaceIsAnError) {
  std::mt19937 rng(9);
  auto x = leaf({128, 784}), w = leaf({256, 784});
  auto xv = random_vec(128 * 784, rng), wv = random_vec(256 * 784, rng);
  const void* in_lin[] = {xv.data(), wv.data()};
  std::vector<float> out(128 * 256);
  if (cpu::kernels().own_gemm_applies(128, 256, 784, true)) {
    auto lin = op(ir::OpCode::Linear, ir::NoAttrs{}, {x, w});
    const size_t need = cpu::workspace_bytes(*lin, 1);
    EXPECT_ERROR(cpu::kernel(ir::OpCode::Linear)(ir::KernelContext{}, *lin, in_lin, out.data()),
                 "linear", std::to_string(need), "got 0");
    EXPECT_ERROR(
        cpu::kernel(ir::OpCode::Linear)(Workspace(need - 64).ctx, *lin, in_lin, out.data()),
        "linear", std::to_string(need), std::to_string(need - 64));
  }
  // The product buffer of an OpenBLAS product written over its addend, in each variant this CPU
  // runs that sends the product to OpenBLAS (the x86-64 baseline of a portable build at least).
  auto g = op(ir::OpCode::Gemm, ir::GemmAttrs{.addend = true},
              {leaf({20, 4}), leaf({4, 30}), leaf({20, 30}), leaf({})});
  auto a = random_vec(80, rng), b = random_vec(120, rng), c = random_vec(600, rng);
  const float s = 0.5f;
  const void* in_g[] = {a.data(), b.data(), c.data(), &s};
  for (const auto* v : cpu::built_variants())
    if (cpu::runs_here(*v) && !v->own_gemm_applies(20, 30, 4, false))
      EXPECT_ERROR(
          v->kernels[static_cast<int>(ir::OpCode::Gemm)](ir::KernelContext{}, *g, in_g, c.data()),
          "gemm", std::to_string(v->workspace_bytes(*g, 1)));
  // The f32 copies of 16-bit operands (widened products); with the bf16 GEMM, its f32 result and
  // one packing area (a product this small runs on one thread).
  auto h = leaf({8, 16}), k = leaf({16, 8});
  h->dtype = k->dtype = cstorch::DType::bf16;
  auto mm = op(ir::OpCode::Matmul, ir::MatmulAttrs{}, {h, k});
  const size_t need = cpu::workspace_bytes(*mm, 4);
  if (!cpu::kernels().bf16_gemm_widened(-1))
    EXPECT_EQ(need,
              (64 + (cpu::kernels().sgemm_bf16_scratch_floats() + 15) / 16 * 16) * sizeof(float));
  else
    EXPECT_EQ(need, (128 + 128 + 64) * sizeof(float));
  std::vector<uint16_t> hv(128), kv(128), o(64);
  const void* in_mm[] = {hv.data(), kv.data()};
  EXPECT_ERROR(cpu::kernel(ir::OpCode::Matmul)(Workspace(need - 4).ctx, *mm, in_mm, o.data()),
               "matmul", std::to_string(need));
}

// A product's bits do not depend on the team it runs on, in every variant this CPU runs: the
// own GEMM's team split, and on OpenBLAS the blocks, which follow the shape and the machine,
// never the team (OpenBLAS rounds an element differently depending on where its tile falls
// inside a call: with the blocks following the team, 1024 x 128 x 128 differed between 1 and 2
// threads in 4.5% of its elements on a Zen CPU). Shapes of a small GPT-2's step: Linear with a
// bias, the input and weight gradients, a wide B^T and a large square product.
TEST(GemmKernel, SameBitsOnOneTwoAndThreeThreadsInEveryVariant) {
  struct Shape3 {
    int64_t M, N, K;
    bool ta, tb, bias;
  };
  const Shape3 shapes[] = {
      {1024, 384, 128, false, true, true},  {1024, 128, 128, false, false, false},
      {512, 128, 1024, true, false, false}, {128, 512, 1024, true, false, false},
      {256, 1536, 768, false, true, false}, {1024, 1024, 512, false, false, false}};
  std::mt19937 rng(21);
  for (const auto* v : cpu::built_variants()) {
    if (!cpu::runs_here(*v)) continue;
    for (const auto& s : shapes) {
      SCOPED_TRACE(std::string(v->name) + " M" + std::to_string(s.M) + " N" + std::to_string(s.N) +
                   " K" + std::to_string(s.K) + (s.ta ? " A^T" : "") + (s.tb ? " B^T" : ""));
      auto A = leaf(s.ta ? cstorch::Shape{s.K, s.M} : cstorch::Shape{s.M, s.K}),
           B = leaf(s.tb ? cstorch::Shape{s.N, s.K} : cstorch::Shape{s.K, s.N}), b = leaf({s.N});
      auto a = random_vec(s.M * s.K, rng), bm = random_vec(s.K * s.N, rng),
           bias = random_vec(s.N, rng);
      auto n = s.bias ? op(ir::OpCode::Linear, ir::NoAttrs{}, {A, B, b})
                      : op(ir::OpCode::Matmul, ir::MatmulAttrs{.trans_a = s.ta, .trans_b = s.tb},
                           {A, B});
      const void* in[] = {a.data(), bm.data(), bias.data()};
      Workspace ws(v->workspace_bytes(*n, 3));
      std::vector<float> one(s.M * s.N), got(s.M * s.N);
      with_threads(1, [&] { v->kernels[static_cast<int>(n->op)](ws.ctx, *n, in, one.data()); });
      for (int t : {2, 3}) {
        with_threads(t, [&] { v->kernels[static_cast<int>(n->op)](ws.ctx, *n, in, got.data()); });
        EXPECT_EQ(std::memcmp(got.data(), one.data(), got.size() * sizeof(float)), 0)
            << t << " threads";
      }
    }
  }
}

// The short-side kernels of the OpenBLAS path (sgemm_small), in every variant this CPU runs that
// has them (AVX2 and FMA): the products they take (a short K or M with B untransposed, a short N
// or M with only B transposed, K >= 64 for the latter), with remainder rows and columns of every
// size, leading dimensions wider than the matrix, beta 0 (C not read), 1 and 0.3, on 1-3 threads,
// against the double-precision product; the same bits on 1, 2 and 3 threads; and the products
// they refuse (both transposed, a dot product under 64 long, more than 2^22 multiply-adds, no
// short side) left to OpenBLAS.
TEST(SmallGemm, ShortSideProductsAgainstDoubleAndTheSameBitsOnAnyTeam) {
  // The variants that have them: those that take a 1 x 1 x 1 product.
  std::vector<const cstorch::cpu::KernelVariant*> variants;
  for (const auto* v : cstorch::cpu::built_variants()) {
    float a = 2.f, b = 3.f, c = 0.f;
    if (cstorch::cpu::runs_here(*v) &&
        v->sgemm_small(false, false, 1, 1, 1, &a, 1, &b, 1, 0.f, &c, 1, 1)) {
      EXPECT_EQ(c, 6.f) << v->name;
      variants.push_back(v);
    }
  }
  // On x86-64 the AVX2 variant has them whenever it runs here.
  for (const auto* v : cstorch::cpu::built_variants()) {
    if (std::string(v->name) == "avx2" && cstorch::cpu::runs_here(*v)) {
      EXPECT_NE(std::find(variants.begin(), variants.end(), v), variants.end());
    }
  }
  if (variants.empty()) GTEST_SKIP() << "this CPU runs no variant with AVX2 and FMA";
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> lng(1, 300), shrt(1, 16), d2(0, 1), dt(1, 3), dk(64, 300);
  const float betas[] = {0.f, 1.f, 0.3f};
  for (const auto* v : variants) {
    // The FC-MNIST classifier's products (batch 128) and its batch-4 products, by hand.
    const Case fixed[] = {
        {128, 256, 10, false, false, 1.f, 0.f, 1}, {10, 256, 128, true, false, 1.f, 0.f, 2},
        {128, 10, 256, false, true, 1.f, 1.f, 1},  {4, 50, 784, false, true, 1.f, 0.f, 1},
        {50, 784, 4, true, false, 1.f, 0.f, 1},    {4, 784, 50, false, false, 1.f, 0.f, 3},
        {1, 1, 1, false, false, 1.f, 0.3f, 1},     {17, 13, 65, false, true, 1.f, 0.3f, 2},
        {9, 1000, 300, true, false, 1.f, 1.f, 3},  {300, 16, 64, false, true, 1.f, 0.f, 2},
    };
    for (const auto& c : fixed)
      EXPECT_EQ(check(c, rng, *v, true), 0) << v->name << ": M" << c.M << " N" << c.N << " K" << c.K
                                            << (c.ta ? " A^T" : "") << (c.tb ? " B^T" : "");
    for (int it = 0; it < 200; ++it) {
      Case c{0, 0, 0, false, false, 1.f, betas[it % 3], dt(rng)};
      const int form = it % 4;  // short K, short M (B untransposed); short N, short M (B^T)
      c.tb = form >= 2;
      c.ta = !c.tb && d2(rng) == 1;
      c.M = form == 1 || form == 3 ? shrt(rng) : lng(rng);
      c.N = form == 2 ? shrt(rng) : lng(rng);
      c.K = form == 0 ? shrt(rng) : form == 1 ? lng(rng) : dk(rng);
      ASSERT_EQ(check(c, rng, *v, true), 0) << v->name << " case " << it << ": M" << c.M << " N"
                                            << c.N << " K" << c.K << " ta" << c.ta << " tb" << c.tb;
    }
    // Team independence: the same bits on 1, 2 and 3 threads.
    for (const Case& c : {Case{128, 256, 10, false, false, 1.f, 0.f, 1},
                          Case{10, 1000, 300, true, false, 1.f, 0.f, 1},
                          Case{300, 13, 200, false, true, 1.f, 1.f, 1}}) {
      const int64_t lda = c.ta ? c.M : c.K, ldb = c.tb ? c.K : c.N;
      auto A = random_vec(c.M * c.K, rng), B = random_vec(c.K * c.N, rng);
      const auto C0 = random_vec(c.M * c.N, rng);
      std::vector<float> one = C0;
      ASSERT_TRUE(v->sgemm_small(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, c.beta,
                                 one.data(), c.N, 1));
      for (int t : {2, 3}) {
        std::vector<float> got = C0;
        ASSERT_TRUE(v->sgemm_small(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb, c.beta,
                                   got.data(), c.N, t));
        EXPECT_EQ(std::memcmp(got.data(), one.data(), got.size() * sizeof(float)), 0)
            << v->name << ": M" << c.M << " N" << c.N << " K" << c.K << " on " << t << " threads";
      }
    }
    // Refused (OpenBLAS runs them): nothing is read or written.
    struct Refused {
      int64_t M, N, K;
      bool ta, tb;
    };
    for (const Refused& r : {Refused{8, 8, 8, true, true}, Refused{4, 50, 50, false, true},
                             Refused{16, 4096, 768, true, false}, Refused{64, 64, 64, false, false},
                             Refused{64, 8, 64, true, true}, Refused{0, 8, 8, false, false}})
      EXPECT_FALSE(
          v->sgemm_small(r.ta, r.tb, r.M, r.N, r.K, nullptr, 1, nullptr, 1, 0.f, nullptr, 1, 1))
          << v->name << ": M" << r.M << " N" << r.N << " K" << r.K;
  }
}

}  // namespace
