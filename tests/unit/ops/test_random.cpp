// Unit tests of the random draws: the Philox known answers, determinism per seed, fresh
// numbers per draw, state save/restore, distribution moments and thread-count independence.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "backend/cpu/variant.h"
#include "cstorch/runtime.h"
#include "cstorch/tensor.h"
#include "unit/test_util.h"

using namespace cstorch;
using cstorch::testing::expect_error;
using cstorch::testing::Moments;
using cstorch::testing::moments;

namespace {

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  size_t bytes = static_cast<size_t>(a.numel()) * itemsize(a.dtype());
  return std::memcmp(a.data_ptr(), b.data_ptr(), bytes) == 0;
}

constexpr int64_t kN = 100000;

}  // namespace

TEST(RandomPhilox, KnownAnswers) {
  // Random123's kat_vectors for philox4x32_10.
  struct Kat {
    uint32_t ctr[4], key[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& k : kats) {
    uint32_t out[4];
    cpu::kernels().philox4x32_10(k.ctr, k.key, out);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], k.out[i]) << "word " << i;
  }
}

TEST(RandomPhilox, FirstDrawOfSeedZero) {
  // seed 0, offset 0, element 0: counter and key all zero; u = top 24 bits of word 0.
  manual_seed(0);
  float u = rand({1}).item<float>();
  EXPECT_EQ(u, static_cast<float>(0x6627e8d5u >> 8) / 16777216.0f);
}

TEST(RandomState, DeterministicPerSeed) {
  manual_seed(42);
  Tensor a = rand({1000});
  Tensor b = randn({10, 10});
  manual_seed(42);
  Tensor c = rand({1000});
  Tensor d = randn({10, 10});
  EXPECT_TRUE(bitwise_equal(a, c));
  EXPECT_TRUE(bitwise_equal(b, d));
  manual_seed(43);
  EXPECT_FALSE(bitwise_equal(a, rand({1000})));
}

TEST(RandomState, SuccessiveDrawsDiffer) {
  manual_seed(7);
  Tensor a = rand({1000});
  Tensor b = rand({1000});
  EXPECT_FALSE(bitwise_equal(a, b));
  auto av = a.to_vector<float>(), bv = b.to_vector<float>();
  int same = 0;
  for (size_t i = 0; i < av.size(); ++i) same += av[i] == bv[i];
  EXPECT_LT(same, 5);
}

TEST(RandomState, OffsetCountsDraws) {
  manual_seed(5);
  EXPECT_EQ(rng_state().to_vector<int64_t>(), (std::vector<int64_t>{5, 0}));
  rand({3});
  bernoulli({2}, 0.5);
  EXPECT_EQ(rng_state().to_vector<int64_t>(), (std::vector<int64_t>{5, 2}));
  // Large seeds keep all 64 bits.
  manual_seed(0xfedcba9876543210ull);
  EXPECT_EQ(static_cast<uint64_t>(rng_state().to_vector<int64_t>()[0]), 0xfedcba9876543210ull);
}

TEST(RandomState, SaveAndRestore) {
  manual_seed(11);
  rand({4});
  Tensor saved = rng_state();
  Tensor x = randn({64});
  Tensor y = rand({64});
  // rng_state() is a copy: it does not move with the generator.
  EXPECT_EQ(saved.to_vector<int64_t>(), (std::vector<int64_t>{11, 1}));
  set_rng_state(saved);
  EXPECT_TRUE(bitwise_equal(randn({64}), x));
  EXPECT_TRUE(bitwise_equal(rand({64}), y));
  // A hand-made state works too.
  set_rng_state(from_vector(std::vector<int64_t>{11, 1}, {2}));
  EXPECT_TRUE(bitwise_equal(randn({64}), x));
}

TEST(RandomState, SetStateErrors) {
  expect_error(
      [] {
        set_rng_state(from_vector(std::vector<float>{1, 2}, {2}));
      },
      {"set_rng_state", "i64", "f32"});
  expect_error(
      [] {
        set_rng_state(from_vector(std::vector<int64_t>{1, 2, 3}, {3}));
      },
      {"set_rng_state", "[2]", "[3]"});
  expect_error([] { set_rng_state(Tensor()); }, {"set_rng_state"});
}

TEST(RandomDistribution, UniformMoments) {
  manual_seed(123);
  Tensor u = rand({kN});
  EXPECT_EQ(u.dtype(), DType::f32);
  Moments m = moments(u);
  const double se = std::sqrt(1.0 / 12 / kN);
  EXPECT_NEAR(m.mean, 0.5, 5 * se);
  EXPECT_NEAR(m.var, 1.0 / 12, 0.002);
  EXPECT_GE(m.min, 0.0);
  EXPECT_LT(m.max, 1.0);

  Tensor w = uniform({kN}, -2.0, 5.0);
  Moments mw = moments(w);
  EXPECT_NEAR(mw.mean, 1.5, 5 * 7 * se);
  EXPECT_NEAR(mw.var, 49.0 / 12, 0.1);
  EXPECT_GE(mw.min, -2.0);
  EXPECT_LT(mw.max, 5.0);
  // A histogram of 10 bins is flat.
  auto v = u.to_vector<float>();
  std::vector<int> bins(10);
  for (float x : v) bins[static_cast<size_t>(x * 10)]++;
  for (int c : bins) EXPECT_NEAR(c, kN / 10, 600);
}

TEST(RandomDistribution, NormalMoments) {
  manual_seed(321);
  Tensor z = randn({kN});
  Moments m = moments(z);
  EXPECT_NEAR(m.mean, 0.0, 5 * std::sqrt(1.0 / kN));
  EXPECT_NEAR(m.var, 1.0, 5 * std::sqrt(2.0 / kN));
  auto v = z.to_vector<double>();
  int64_t tail = 0;
  for (double x : v) tail += std::abs(x) > 1.959964;
  EXPECT_NEAR(static_cast<double>(tail) / kN, 0.05, 5 * std::sqrt(0.05 * 0.95 / kN));
  for (double x : v) ASSERT_TRUE(std::isfinite(x));

  Tensor n = normal({kN}, 3.0, 2.0);
  Moments mn = moments(n);
  EXPECT_NEAR(mn.mean, 3.0, 5 * 2 * std::sqrt(1.0 / kN));
  EXPECT_NEAR(mn.var, 4.0, 5 * 4 * std::sqrt(2.0 / kN));
}

TEST(RandomDistribution, NeighboursUncorrelated) {
  manual_seed(99);
  auto v = randn({kN}).to_vector<double>();
  double c = 0;
  for (size_t i = 0; i + 1 < v.size(); ++i) c += v[i] * v[i + 1];
  EXPECT_NEAR(c / static_cast<double>(v.size() - 1), 0.0, 5 / std::sqrt(double(kN)));
}

TEST(RandomDistribution, BernoulliRate) {
  manual_seed(2024);
  for (double p : {0.1, 0.3, 0.5, 0.9}) {
    Tensor b = bernoulli({kN}, p);
    EXPECT_EQ(b.dtype(), DType::f32);
    auto v = b.to_vector<float>();
    double ones = 0;
    for (float x : v) {
      ASSERT_TRUE(x == 0.f || x == 1.f);
      ones += x;
    }
    EXPECT_NEAR(ones / kN, p, 5 * std::sqrt(p * (1 - p) / kN)) << "p=" << p;
  }
  EXPECT_EQ(moments(bernoulli({1000}, 0.0)).max, 0.0);
  EXPECT_EQ(moments(bernoulli({1000}, 1.0)).min, 1.0);
  // Other dtypes.
  Tensor bb = bernoulli({1000}, 0.5, DType::boolean);
  EXPECT_EQ(bb.dtype(), DType::boolean);
  Tensor bi = bernoulli({1000}, 0.5, DType::i64);
  auto iv = bi.to_vector<int64_t>();
  for (auto x : iv) ASSERT_TRUE(x == 0 || x == 1);
  EXPECT_EQ(bernoulli({10}, 0.5, DType::bf16).dtype(), DType::bf16);
}

TEST(RandomDistribution, SixteenBitFloats) {
  manual_seed(8);
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor u = rand({kN}, t);
    EXPECT_EQ(u.dtype(), t);
    Moments m = moments(u);
    EXPECT_GE(m.min, 0.0);
    EXPECT_LT(m.max, 1.0);  // never rounds up to 1
    EXPECT_NEAR(m.mean, 0.5, 0.01);
    Tensor z = randn({kN}, t);
    Moments mz = moments(z);
    EXPECT_NEAR(mz.mean, 0.0, 0.02);
    EXPECT_NEAR(mz.var, 1.0, 0.03);
  }
}

TEST(RandomDistribution, IndependentOfThreadCount) {
  const int saved = omp_get_max_threads();
  const Shape s = {1 << 20};  // many parallel chunks
  auto draw_all = [&] {
    manual_seed(77);
    return std::vector<Tensor>{rand(s), randn(s), bernoulli(s, 0.4), rand(s, DType::bf16)};
  };
  omp_set_num_threads(1);
  auto one = draw_all();
  omp_set_num_threads(2);
  auto two = draw_all();
  omp_set_num_threads(3);
  auto three = draw_all();
  omp_set_num_threads(saved);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_TRUE(bitwise_equal(one[i], two[i])) << "draw " << i;
    EXPECT_TRUE(bitwise_equal(one[i], three[i])) << "draw " << i;
  }
}

TEST(RandomDistribution, PrefixStable) {
  // Element i depends only on (seed, offset, i): a longer draw extends a shorter one.
  manual_seed(3);
  auto small = randn({10}).to_vector<float>();
  manual_seed(3);
  auto big = randn({100000}).to_vector<float>();
  for (size_t i = 0; i < small.size(); ++i) EXPECT_EQ(small[i], big[i]);
}

TEST(RandomDistribution, ShapesAndEmpty) {
  EXPECT_EQ(rand({2, 3, 4}).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(randn({}).shape(), Shape{});
  EXPECT_EQ(rand({0, 5}).numel(), 0);
  EXPECT_FALSE(rand({3}).requires_grad());
}

TEST(RandomDistribution, Errors) {
  expect_error([] { rand({2}, DType::i64); }, {"rand", "i64"});
  expect_error([] { randn({2}, DType::boolean); }, {"randn", "bool"});
  expect_error([] { normal({2}, 0, -1); }, {"normal", "std"});
  expect_error([] { uniform({2}, 1, 0); }, {"uniform"});
  expect_error([] { bernoulli({2}, 1.5); }, {"bernoulli", "1.5"});
  expect_error([] { rand({-1}); }, {"rand", "negative"});
}

TEST(RandomState, TracedStepDrawsFreshNumbersEachReplay) {
  // Eager reference: two draws from seed 5.
  manual_seed(5);
  Tensor r0 = rand({8});
  Tensor r1 = randn({8});
  Tensor r2 = rand({8});
  Tensor r3 = randn({8});
  // The same draws inside a traced step: the state is read and advanced by the program, so the
  // replay continues the sequence rather than repeating the traced values.
  manual_seed(5);
  auto step = trace([](const Tensor& x) { return std::vector<Tensor>{x + rand({8}), randn({8})}; });
  auto a = step(zeros({8}));
  auto b = step(zeros({8}));
  synchronize();
  EXPECT_TRUE(bitwise_equal(a[0], r0));
  EXPECT_TRUE(bitwise_equal(a[1], r1));
  EXPECT_TRUE(bitwise_equal(b[0], r2));
  EXPECT_TRUE(bitwise_equal(b[1], r3));
  EXPECT_EQ(rng_state().to_vector<int64_t>(), (std::vector<int64_t>{5, 4}));
  // Eager draws continue from where the steps left the generator.
  manual_seed(5);
  for (int i = 0; i < 4; ++i) rand({1});
  Tensor next = rand({8});
  set_rng_state(from_vector(std::vector<int64_t>{5, 4}, {2}));
  EXPECT_TRUE(bitwise_equal(rand({8}), next));
}
