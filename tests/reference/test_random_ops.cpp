// Random ops cannot match torch's generator, so they are checked statistically: moments within
// bounds (5 standard errors), ranges, dropout scaling and zero fraction, fresh draws on
// successive calls (eager and replayed traced steps), and reproducibility after manual_seed /
// set_rng_state.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "cstorch/runtime.h"
#include "cstorch/tensor.h"
#include "unit/test_util.h"

namespace cs = cstorch;
using cs::testing::moments;

namespace {

constexpr int64_t kN = 200000;

// |mean - mu| within 5 standard errors, variance within 5 standard errors of its estimate
// (`kurt` = E[(x-mu)^4] / sigma^4: 3 for a normal, 1.8 for a uniform).
void expect_moments(const cs::Tensor& t, double mu, double var, double kurt, const char* what) {
  auto m = moments(t);
  double n = static_cast<double>(t.numel());
  EXPECT_NEAR(m.mean, mu, 5 * std::sqrt(var / n)) << what << ": mean";
  EXPECT_NEAR(m.var, var, 5 * var * std::sqrt((kurt - 1) / n)) << what << ": variance";
}

TEST(RandomOps, RandIsUniform01) {
  cs::manual_seed(1);
  auto t = cs::rand({kN});
  EXPECT_EQ(t.dtype(), cs::DType::f32);
  EXPECT_EQ(t.shape(), cs::Shape{kN});
  auto m = moments(t);
  EXPECT_GE(m.min, 0.0);
  EXPECT_LT(m.max, 1.0);
  expect_moments(t, 0.5, 1.0 / 12, 1.8, "rand");
}

TEST(RandomOps, RandnIsStandardNormal) {
  cs::manual_seed(2);
  auto t = cs::randn({400, 500});
  EXPECT_EQ(t.shape(), (cs::Shape{400, 500}));
  expect_moments(t, 0.0, 1.0, 3.0, "randn");
  // Tails: about 0.27% beyond 3 sigma.
  auto v = t.to_vector<double>();
  double beyond = 0;
  for (double x : v) beyond += std::abs(x) > 3;
  EXPECT_NEAR(beyond / static_cast<double>(v.size()), 0.0027, 0.0006);
}

TEST(RandomOps, UniformRange) {
  cs::manual_seed(3);
  auto t = cs::uniform({kN}, -2.0, 3.0);
  auto m = moments(t);
  EXPECT_GE(m.min, -2.0);
  EXPECT_LT(m.max, 3.0);
  expect_moments(t, 0.5, 25.0 / 12, 1.8, "uniform(-2, 3)");
}

TEST(RandomOps, NormalMeanStd) {
  cs::manual_seed(4);
  auto t = cs::normal({kN}, 3.0, 0.5);
  expect_moments(t, 3.0, 0.25, 3.0, "normal(3, 0.5)");
}

TEST(RandomOps, Bernoulli) {
  cs::manual_seed(5);
  auto t = cs::bernoulli({kN}, 0.3);
  auto v = t.to_vector<double>();
  for (double x : v) ASSERT_TRUE(x == 0 || x == 1) << "bernoulli drew " << x;
  expect_moments(t, 0.3, 0.21, (1 - 3 * 0.21) / 0.21 + 0.0, "bernoulli(0.3)");
  auto all = cs::bernoulli({1000}, 1.0).to_vector<double>();
  for (double x : all) ASSERT_EQ(x, 1);
  auto none = cs::bernoulli({1000}, 0.0).to_vector<double>();
  for (double x : none) ASSERT_EQ(x, 0);
}

TEST(RandomOps, HalfPrecisionDraws) {
  cs::manual_seed(6);
  auto a = cs::rand({kN}, cs::DType::bf16);
  EXPECT_EQ(a.dtype(), cs::DType::bf16);
  auto m = moments(a);
  EXPECT_GE(m.min, 0.0);
  EXPECT_LE(m.max, 1.0);  // bf16 rounding may reach 1
  EXPECT_NEAR(m.mean, 0.5, 0.01);
  auto b = cs::randn({kN}, cs::DType::f16);
  EXPECT_EQ(b.dtype(), cs::DType::f16);
  expect_moments(b, 0.0, 1.0, 3.0, "randn f16");
}

TEST(RandomOps, SuccessiveDrawsDiffer) {
  cs::manual_seed(7);
  auto a = cs::randn({64}).to_vector<float>();
  auto b = cs::randn({64}).to_vector<float>();
  EXPECT_NE(a, b);
  std::set<float> distinct(a.begin(), a.end());
  EXPECT_GT(distinct.size(), 60u);
}

TEST(RandomOps, ManualSeedReproduces) {
  cs::manual_seed(1234);
  auto a1 = cs::rand({100}).to_vector<float>();
  auto a2 = cs::randn({3, 7}).to_vector<float>();
  auto a3 = cs::bernoulli({50}, 0.5).to_vector<float>();
  cs::manual_seed(1234);
  EXPECT_EQ(cs::rand({100}).to_vector<float>(), a1);
  EXPECT_EQ(cs::randn({3, 7}).to_vector<float>(), a2);
  EXPECT_EQ(cs::bernoulli({50}, 0.5).to_vector<float>(), a3);
  cs::manual_seed(1235);
  EXPECT_NE(cs::rand({100}).to_vector<float>(), a1);
}

TEST(RandomOps, RngStateSaveRestore) {
  cs::manual_seed(99);
  (void)cs::rand({10});
  auto st = cs::rng_state();
  EXPECT_EQ(st.dtype(), cs::DType::i64);
  EXPECT_EQ(st.shape(), cs::Shape{2});
  auto a = cs::randn({20}).to_vector<float>();
  auto b = cs::randn({20}).to_vector<float>();
  cs::set_rng_state(st);
  EXPECT_EQ(cs::randn({20}).to_vector<float>(), a);
  EXPECT_EQ(cs::randn({20}).to_vector<float>(), b);
}

TEST(RandomOps, IndependentOfThreadCount) {
  int prev = cs::get_num_threads();
  cs::set_num_threads(1);
  cs::manual_seed(11);
  auto a = cs::randn({50000}).to_vector<float>();
  cs::set_num_threads(std::max(2, prev));
  cs::manual_seed(11);
  auto b = cs::randn({50000}).to_vector<float>();
  cs::set_num_threads(prev);
  EXPECT_EQ(a, b);
}

TEST(RandomOps, DropoutScalingAndZeroFraction) {
  cs::manual_seed(8);
  const double p = 0.25;
  auto x = cs::full({kN}, 2.0);
  x.set_requires_grad(true);
  auto y = cs::dropout(x, p, true);
  auto v = y.to_vector<double>();
  double zeros = 0;
  for (double e : v) {
    if (e == 0)
      ++zeros;
    else
      ASSERT_NEAR(e, 2.0 / (1 - p), 1e-6) << "kept elements are scaled by 1/(1-p)";
  }
  double frac = zeros / static_cast<double>(v.size());
  EXPECT_NEAR(frac, p, 5 * std::sqrt(p * (1 - p) / static_cast<double>(v.size())));
  // The gradient is the same mask, scaled.
  y.backward(cs::ones({kN}));
  auto g = x.grad().to_vector<double>();
  for (size_t i = 0; i < v.size(); ++i)
    ASSERT_NEAR(g[i], v[i] == 0 ? 0.0 : 1 / (1 - p), 1e-6) << "at " << i;
  // Two calls draw different masks; eval mode is the identity.
  auto y2 = cs::dropout(x.detach(), p, true).to_vector<double>();
  EXPECT_NE(v, y2);
  EXPECT_EQ(cs::dropout(x.detach(), p, false).to_vector<double>(), x.detach().to_vector<double>());
}

TEST(RandomOps, TracedStepDrawsFreshNumbers) {
  cs::manual_seed(21);
  auto step = cs::trace([](const cs::Tensor& s) { return cs::randn({1000}) * s; }, "rand_step");
  auto one = cs::scalar_tensor(1.0);
  auto a = step(one).to_vector<float>();
  auto b = step(one).to_vector<float>();
  EXPECT_NE(a, b) << "a replayed traced step must draw fresh numbers";
  auto m = moments(cs::from_vector(b, {1000}));
  EXPECT_NEAR(m.mean, 0.0, 5 * std::sqrt(1.0 / 1000));
  // Same seed, same draws: eager and traced consume the generator identically.
  cs::manual_seed(21);
  auto e1 = cs::randn({1000}).to_vector<float>();
  auto e2 = cs::randn({1000}).to_vector<float>();
  EXPECT_EQ(a, e1);
  EXPECT_EQ(b, e2);
  cs::manual_seed(21);
  EXPECT_EQ(step(one).to_vector<float>(), a) << "manual_seed must rewind a traced step's draws";
}

TEST(RandomOps, TracedDropout) {
  cs::manual_seed(31);
  cs::Tensor x = cs::ones({20000});
  auto step =
      cs::trace([&](const cs::Tensor& s) { return cs::dropout(x * s, 0.5, true); }, "dropout_step");
  auto one = cs::scalar_tensor(1.0);
  auto a = step(one).to_vector<double>();
  auto b = step(one).to_vector<double>();
  EXPECT_NE(a, b);
  double zeros = 0;
  for (double e : a) {
    if (e == 0)
      ++zeros;
    else
      ASSERT_NEAR(e, 2.0, 1e-6);
  }
  EXPECT_NEAR(zeros / static_cast<double>(a.size()), 0.5,
              5 * std::sqrt(0.25 / static_cast<double>(a.size())));
}

}  // namespace
