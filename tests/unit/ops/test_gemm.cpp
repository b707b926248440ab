// Unit tests of cstorch's own AVX-512 GEMM (and of the Gemm node's kernel, below)
// (src/backend/cpu/gemm.cpp) against a double-precision host reference: every transpose
// combination, leading dimensions wider than the matrix, alpha and beta (0, 1, other), K of 0 and K
// spanning several blocks, row and column remainders of every size, a bias row added once over
// several K blocks, and teams of 1-4 threads (each thread packs its own panels; a shared buffer
// raced here before). The padding columns of C must never be written.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernels.h"
#include "ir/node.h"

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

// ---- the Gemm node's kernel against the separate kernels it replaces ----------------------

namespace {

namespace ir = cstorch::ir;
namespace cpu = cstorch::cpu;

ir::NodePtr leaf(const cstorch::Shape& s) {
  auto n = ir::Node::make(ir::OpCode::Constant, ir::NoAttrs{}, {});
  n->shape = s;
  n->dtype = cstorch::DType::f32;
  return n;
}
ir::NodePtr op(ir::OpCode code, ir::Attrs attrs, std::vector<ir::NodePtr> in) {
  auto n = ir::Node::make(code, std::move(attrs), std::move(in));
  ir::op_info(code).infer(*n);
  return n;
}
std::vector<float> random_vec(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// For one product shape: relu(linear), relu_grad(matmul, y) and addcmul(matmul, C, s) (also
// written in place over C, as the planner places a momentum update, and with the parameter
// update P + out * r written in place into P) through cpu_Gemm, and the
// same through the separate kernels: bitwise equal (an addend over several K blocks, which the
// fusion pass never creates, within 1e-4). M, N, K pick the own GEMM (K >= 8) or
// the OpenBLAS path with its epilogue pass (K < 8), so both paths of cpu_Gemm run.
void expect_gemm_node_matches(int64_t M, int64_t N, int64_t K, bool ta) {
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
    cpu::cpu_Linear(ir::KernelContext{}, *lin, in_lin, tmp.data());
    const void* in_relu[] = {tmp.data()};
    cpu::cpu_Relu(ir::KernelContext{}, *relu, in_relu, want.data());
    auto g =
        op(ir::OpCode::Gemm, ir::GemmAttrs{.trans_b = true, .bias = true, .relu = true}, {A, W, b});
    cpu::cpu_Gemm(ir::KernelContext{}, *g, in_lin, got.data());
    EXPECT_EQ(got, want) << "relu(linear) M" << M << " N" << N << " K" << K;
  }
  auto mm = op(ir::OpCode::Matmul, ir::MatmulAttrs{.trans_a = ta}, {A, Bm});
  const void* in_mm[] = {a.data(), bm.data()};
  cpu::cpu_Matmul(ir::KernelContext{}, *mm, in_mm, tmp.data());
  // relu_grad(matmul, y)
  {
    auto rg = op(ir::OpCode::ReluGrad, ir::NoAttrs{}, {mm, y});
    const void* in_rg[] = {tmp.data(), yv.data()};
    cpu::cpu_ReluGrad(ir::KernelContext{}, *rg, in_rg, want.data());
    auto g = op(ir::OpCode::Gemm, ir::GemmAttrs{.trans_a = ta, .relu_grad = true}, {A, Bm, y});
    const void* in_g[] = {a.data(), bm.data(), yv.data()};
    cpu::cpu_Gemm(ir::KernelContext{}, *g, in_g, got.data());
    EXPECT_EQ(got, want) << "relu_grad(matmul) M" << M << " N" << N << " K" << K;
  }
  // addcmul(matmul, C, s), into a fresh buffer and in place over C
  {
    auto ac = op(ir::OpCode::Addcmul, ir::NoAttrs{}, {mm, C, s});
    const void* in_ac[] = {tmp.data(), c.data(), &sv};
    cpu::cpu_Addcmul(ir::KernelContext{}, *ac, in_ac, want.data());
    auto g = op(ir::OpCode::Gemm, ir::GemmAttrs{.trans_a = ta, .addend = true}, {A, Bm, C, s});
    const void* in_g[] = {a.data(), bm.data(), c.data(), &sv};
    cpu::cpu_Gemm(ir::KernelContext{}, *g, in_g, got.data());
    std::vector<float> inplace = c;
    const void* in_gi[] = {a.data(), bm.data(), inplace.data(), &sv};
    cpu::cpu_Gemm(ir::KernelContext{}, *g, in_gi, inplace.data());
    EXPECT_EQ(inplace, got) << "in place, M" << M << " N" << N << " K" << K;
    if (K < 8 || cpu::own_gemm_one_k_block(K)) {  // what the fusion pass creates
      EXPECT_EQ(got, want) << "addcmul(matmul) M" << M << " N" << N << " K" << K;
    } else {  // several K blocks: the same sums, rounded in another order
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-4 * (1.0 + std::fabs(want[i]))) << i;
    }
    // ... and also updating P <- P + out * r in place (SGD's parameter update), against
    // addcmul(P, want, r).
    if (K < 8 || cpu::own_gemm_one_k_block(K)) {
      auto P = leaf({M, N}), r = leaf({});
      const float rv = -0.01f;
      std::vector<float> p = random_vec(M * N, rng), p_want(M * N);
      auto up = op(ir::OpCode::Addcmul, ir::NoAttrs{}, {P, C, r});
      const void* in_up[] = {p.data(), want.data(), &rv};
      cpu::cpu_Addcmul(ir::KernelContext{}, *up, in_up, p_want.data());
      auto gu = op(ir::OpCode::Gemm, ir::GemmAttrs{.trans_a = ta, .addend = true, .update = true},
                   {A, Bm, C, s, P, r});
      std::vector<float> mom = c;
      const void* in_gu[] = {a.data(), bm.data(), mom.data(), &sv, p.data(), &rv};
      cpu::cpu_Gemm(ir::KernelContext{}, *gu, in_gu, mom.data());
      EXPECT_EQ(mom, want) << "momentum with update, M" << M << " N" << N << " K" << K;
      EXPECT_EQ(p, p_want) << "parameter update, M" << M << " N" << N << " K" << K;
    }
  }
}

TEST(GemmKernel, EqualsTheSeparateKernelsOnBothPaths) {
  expect_gemm_node_matches(48, 40, 64, false);   // own GEMM
  expect_gemm_node_matches(48, 40, 64, true);    // own GEMM, transposed A (weight gradient)
  expect_gemm_node_matches(64, 70, 900, false);  // own GEMM, bias over several K blocks
  expect_gemm_node_matches(20, 30, 4, true);     // K < 8: OpenBLAS and an epilogue pass
  expect_gemm_node_matches(20, 30, 4, false);
}

}  // namespace
