// Unit tests of cstorch's own AVX-512 GEMM (src/backend/cpu/gemm.cpp) against a double-precision
// host reference: every transpose combination, leading dimensions wider than the matrix, alpha
// and beta (0, 1, other), K of 0 and K spanning several blocks, row and column remainders of
// every size, a bias row added once over several K blocks, and teams of 1-4 threads (each thread
// packs its own panels; a shared buffer raced here before). The padding columns of C must never be
// written.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"

namespace {

struct Case {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
  int threads;
  bool bias = false;  // add a bias row vector (once, whatever the number of K blocks)
};

// Runs one case and returns the number of wrong elements (printing the first few).
int check(const Case& c, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::uniform_int_distribution<int> pad(0, 3);
  const int64_t lda = (c.ta ? c.M : c.K) + pad(rng), ldb = (c.tb ? c.K : c.N) + pad(rng);
  const int64_t ldc = c.N + pad(rng);
  std::vector<float> A((c.ta ? c.K : c.M) * lda + 1), B((c.tb ? c.N : c.K) * ldb + 1), C(c.M * ldc);
  for (auto* v : {&A, &B, &C})
    for (auto& x : *v) x = u(rng);
  const std::vector<float> C0 = C;
  std::vector<float> bias(c.N);
  for (auto& x : bias) x = u(rng);
  if (!cstorch::cpu::sgemm_avx512(
          c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), lda, B.data(), ldb, c.beta, C.data(), ldc,
          c.threads, cstorch::cpu::GemmEpilogue{.bias = c.bias ? bias.data() : nullptr}))
    return -1;  // no AVX-512 in this build
  int bad = 0;
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
      // fp32 accumulation over K terms: error bounded by ~K * eps * sum|a*b|.
      const double tol = 1e-6 * (1.0 + static_cast<double>(c.K)) * (mag + 1.0) * 1.2;
      if (std::fabs(got - want) > tol && bad++ < 3)
        ADD_FAILURE() << "M" << c.M << " N" << c.N << " K" << c.K << " ta" << c.ta << " tb" << c.tb
                      << " threads " << c.threads << ": C(" << i << "," << j << ") = " << got
                      << ", want " << want;
    }
  }
  return bad;
}

TEST(OwnGemm, RandomShapesTransposesAlphaBetaThreads) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dm(1, 70), dn(1, 100), dk(0, 900), d2(0, 1), dt(1, 4);
  const float alphas[] = {1.f, 0.5f, -2.f}, betas[] = {0.f, 1.f, 0.3f};
  int cases = 0;
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
    const int bad = check(c, rng);
    if (bad < 0) GTEST_SKIP() << "built without AVX-512: the OpenBLAS path is used instead";
    ASSERT_EQ(bad, 0) << "case " << it;
    ++cases;
  }
  EXPECT_EQ(cases, 240);
}

TEST(OwnGemm, TrainingShapesAndEdges) {
  std::mt19937 rng(11);
  // The FC-MNIST step's products, a classifier head (N < 16), K = 0 (C = beta * C), K over
  // several 384-blocks, and more column panels than one N block (1536).
  const Case cases[] = {
      {128, 256, 784, false, true, 1.f, 0.f, 2, true}, {256, 784, 128, true, false, 1.f, 0.f, 2},
      {128, 256, 256, false, false, 1.f, 0.f, 2},      {256, 256, 128, true, false, 1.f, 0.9f, 2},
      {128, 10, 256, false, true, 1.f, 0.f, 1},        {10, 256, 128, true, false, 1.f, 0.f, 3},
      {7, 9, 0, false, false, 1.f, 0.5f, 2, true},     {33, 40, 1000, true, true, 0.25f, 0.f, 2},
      {13, 1600, 20, false, false, 1.f, 0.f, 2},       {1, 1, 1, false, false, 1.f, 0.f, 1},
  };
  for (const auto& c : cases) {
    const int bad = check(c, rng);
    if (bad < 0) GTEST_SKIP() << "built without AVX-512";
    EXPECT_EQ(bad, 0) << "M" << c.M << " N" << c.N << " K" << c.K;
  }
}

}  // namespace
