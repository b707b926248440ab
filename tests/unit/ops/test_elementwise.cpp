// Unit tests of the elementwise ops: values per dtype path, broadcasting, PyTorch dtype
// promotion, error messages and gradients (hand values and finite differences).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "backend/cpu/variant.h"
#include "core/internal.h"
#include "cstorch/tensor.h"
#include "unit/test_util.h"

using namespace cstorch;

namespace {

using cstorch::testing::bv;
using cstorch::testing::expect_error;
using cstorch::testing::F;
using cstorch::testing::fv;
using cstorch::testing::iv;
using I64 = std::vector<int64_t>;
using I32 = std::vector<int32_t>;

Tensor i32v(I32 v) {
  int64_t n = static_cast<int64_t>(v.size());
  return from_vector(v, {n});
}
std::vector<uint8_t> bools(const Tensor& t) {
  return t.to_vector<uint8_t>();
}

void expect_near(const Tensor& t, const std::vector<double>& want, double tol = 1e-6) {
  auto got = t.to_vector<double>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << "at " << i;
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << "at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << "at " << i;
    }
  }
}

// Central finite differences of sum(f(x) * w) against backward(), for an f32 input.
void check_grad(const std::function<Tensor(const Tensor&)>& f, const F& x0, const Shape& s,
                double tol = 2e-3) {
  Tensor x = fv(x0, s);
  x.set_requires_grad();
  Tensor y = f(x);
  // Fixed non-uniform weights so every output element matters differently.
  F w(static_cast<size_t>(y.numel()));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f + 0.25f * static_cast<float>(i % 5);
  Tensor wt = fv(w, y.shape());
  y.backward(wt);
  ASSERT_TRUE(x.grad().defined());
  auto g = x.grad().to_vector<double>();
  const double h = 1e-2;
  for (size_t i = 0; i < x0.size(); ++i) {
    auto eval = [&](double d) {
      F xp = x0;
      xp[i] = static_cast<float>(xp[i] + d);
      auto yv = f(fv(xp, s)).to_vector<double>();
      double acc = 0;
      for (size_t j = 0; j < yv.size(); ++j) acc += yv[j] * w[j];
      return acc;
    };
    double fd = (eval(h) - eval(-h)) / (2 * h);
    EXPECT_NEAR(g[i], fd, tol * std::max(1.0, std::abs(fd))) << "element " << i;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Unary values.

TEST(ElementwiseUnary, MathF32) {
  Tensor x = fv({-2.f, -0.5f, 0.f, 0.5f, 3.f});
  expect_near(neg(x), {2, 0.5, 0, -0.5, -3});
  expect_near(abs(x), {2, 0.5, 0, 0.5, 3});
  expect_near(sign(x), {-1, -1, 0, 1, 1});
  expect_near(exp(x), {std::exp(-2.0), std::exp(-0.5), 1, std::exp(0.5), std::exp(3.0)});
  expect_near(tanh(x), {std::tanh(-2.0), std::tanh(-0.5), 0, std::tanh(0.5), std::tanh(3.0)});
  expect_near(sigmoid(x), {1 / (1 + std::exp(2.0)), 1 / (1 + std::exp(0.5)), 0.5,
                           1 / (1 + std::exp(-0.5)), 1 / (1 + std::exp(-3.0))});
  expect_near(relu(x), {0, 0, 0, 0.5, 3});
  expect_near(erf(x), {std::erf(-2.0), std::erf(-0.5), 0, std::erf(0.5), std::erf(3.0)});
  expect_near(silu(x), {-2 / (1 + std::exp(2.0)), -0.5 / (1 + std::exp(0.5)), 0,
                        0.5 / (1 + std::exp(-0.5)), 3 / (1 + std::exp(-3.0))});
  Tensor p = fv({0.25f, 1.f, 4.f});
  expect_near(log(p), {std::log(0.25), 0, std::log(4.0)});
  expect_near(sqrt(p), {0.5, 1, 2});
  expect_near(rsqrt(p), {2, 1, 0.5});
  expect_near(reciprocal(p), {4, 1, 0.25});
  EXPECT_EQ(exp(x).dtype(), DType::f32);
}

TEST(ElementwiseUnary, GeluBothForms) {
  Tensor x = fv({-3.f, -1.f, 0.f, 0.7f, 2.f});
  std::vector<double> erf_form, tanh_form;
  for (double v : {-3.0, -1.0, 0.0, 0.7, 2.0}) {
    erf_form.push_back(0.5 * v * (1 + std::erf(v / std::sqrt(2.0))));
    tanh_form.push_back(0.5 * v *
                        (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
  }
  expect_near(gelu(x), erf_form, 1e-6);
  expect_near(gelu(x, true), tanh_form, 1e-6);
}

TEST(ElementwiseUnary, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = fv({-inf, -1.f, 0.f, inf, nan});
  EXPECT_EQ(bools(isfinite(x)), (std::vector<uint8_t>{0, 1, 1, 0, 0}));
  expect_near(log(fv({0.f, -1.f})), {-INFINITY, NAN});
  expect_near(sigmoid(fv({-200.f, 200.f})), {0, 1});
  expect_near(relu(fv({nan})), {NAN});  // relu keeps nan, as torch
  expect_near(sign(fv({nan, -0.f})), {0, 0});
  expect_near(sqrt(fv({-1.f})), {NAN});
  EXPECT_EQ(bools(isfinite(iv({1, 2}))), (std::vector<uint8_t>{1, 1}));
}

TEST(ElementwiseUnary, IntegerPaths) {
  Tensor a = iv({-3, 0, 5});
  EXPECT_EQ(neg(a).to_vector<int64_t>(), (I64{3, 0, -5}));
  EXPECT_EQ(neg(a).dtype(), DType::i64);
  EXPECT_EQ(abs(a).to_vector<int64_t>(), (I64{3, 0, 5}));
  EXPECT_EQ(sign(a).to_vector<int64_t>(), (I64{-1, 0, 1}));
  EXPECT_EQ(relu(a).to_vector<int64_t>(), (I64{0, 0, 5}));
  EXPECT_EQ(relu(a).dtype(), DType::i64);
  Tensor b = i32v({-7, 2});
  EXPECT_EQ(abs(b).dtype(), DType::i32);
  EXPECT_EQ(abs(b).to_vector<int32_t>(), (I32{7, 2}));
  // Wrap-around like torch, not UB.
  Tensor m = i32v({std::numeric_limits<int32_t>::min()});
  EXPECT_EQ(neg(m).to_vector<int32_t>(), (I32{std::numeric_limits<int32_t>::min()}));
}

TEST(ElementwiseUnary, MathPromotesIntegersToFloat) {
  Tensor a = iv({1, 4});
  for (auto f : {+[](const Tensor& t) { return exp(t); }, +[](const Tensor& t) { return log(t); },
                 +[](const Tensor& t) { return sqrt(t); }, +[](const Tensor& t) { return tanh(t); },
                 +[](const Tensor& t) { return sigmoid(t); },
                 +[](const Tensor& t) { return gelu(t); }, +[](const Tensor& t) { return silu(t); },
                 +[](const Tensor& t) { return erf(t); }, +[](const Tensor& t) { return rsqrt(t); },
                 +[](const Tensor& t) { return reciprocal(t); }}) {
    EXPECT_EQ(f(a).dtype(), DType::f32);
  }
  expect_near(sqrt(a), {1, 2});
  expect_near(sqrt(bv({1, 0})), {1, 0});
  EXPECT_EQ(sqrt(fv({4.f}).to(DType::bf16)).dtype(), DType::bf16);
}

TEST(ElementwiseUnary, SixteenBitFloats) {
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor x = fv({-1.f, 0.5f, 2.f}).to(t);
    Tensor e = exp(x);
    EXPECT_EQ(e.dtype(), t);
    // computed in float, then rounded once to 16 bits
    for (int i = 0; i < 3; ++i) {
      float v = std::exp(std::vector<float>{-1.f, 0.5f, 2.f}[i]);
      float want = t == DType::bf16 ? static_cast<float>(bf16_t(v)) : static_cast<float>(f16_t(v));
      EXPECT_EQ(e.to_vector<float>()[i], want) << dtype_name(t) << " element " << i;
    }
    expect_near(gelu(x),
                {0.5 * -1 * (1 + std::erf(-1 / std::sqrt(2.0))),
                 0.5 * 0.5 * (1 + std::erf(0.5 / std::sqrt(2.0))),
                 0.5 * 2 * (1 + std::erf(2 / std::sqrt(2.0)))},
                1e-2);
    expect_near(neg(x), {1, -0.5, -2});
    expect_near(relu(x), {0, 0.5, 2});
  }
}

// bf16 gelu and its gradient are the f32 values rounded once, bit for bit, over several chunks
// and threads' shares of a long tensor with special values (the kernel widens and narrows whole
// chunks with bit operations).
TEST(ElementwiseUnary, Bf16GeluAndItsGradientAreTheF32ValuesRoundedOnce) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = cstorch::testing::rt({5000}, 3, -6.0, 6.0).to_vector<float>();
  const std::vector<float> special = {0.f, -0.f, inf, -inf, std::nanf(""), 1e30f, -1e30f, 1e-39f};
  for (size_t i = 0; i < special.size(); ++i) v[i * 611] = special[i];
  Tensor x = from_vector(v, {5000}).to(DType::bf16);
  Tensor g = cstorch::testing::rt({5000}, 4).to(DType::bf16);
  auto same = [](const Tensor& a, const Tensor& b, const std::string& what) {
    ASSERT_EQ(a.dtype(), DType::bf16) << what;
    auto p = a.to_vector<float>(), q = b.to_vector<float>();
    for (size_t i = 0; i < p.size(); ++i) {
      if (!(std::isnan(p[i]) && std::isnan(q[i]))) {
        ASSERT_EQ(p[i], q[i]) << what << " element " << i;
      }
    }
  };
  for (bool tanh_form : {false, true}) {
    const std::string form = tanh_form ? "tanh form" : "erf form";
    same(gelu(x, tanh_form), gelu(x.to(DType::f32), tanh_form).to(DType::bf16), "gelu, " + form);
    Tensor xb = x.detach(), xf = x.to(DType::f32).detach();
    xb.set_requires_grad();
    xf.set_requires_grad();
    gelu(xb, tanh_form).backward(g);
    gelu(xf, tanh_form).backward(g.to(DType::f32));
    same(xb.grad(), xf.grad().to(DType::bf16), "gelu's gradient, " + form);
  }
}

TEST(ElementwiseUnary, LogicalNotAnyDtype) {
  EXPECT_EQ(bools(logical_not(fv({0.f, 2.f, -1.f}))), (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(bools(logical_not(iv({0, 3}))), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(bools(logical_not(bv({1, 0}))), (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(logical_not(iv({0})).dtype(), DType::boolean);
}

TEST(ElementwiseUnary, Errors) {
  expect_error([] { neg(bv({1})); }, {"neg", "bool"});
  expect_error([] { abs(bv({1})); }, {"abs", "bool"});
  expect_error([] { relu(bv({1})); }, {"relu", "bool"});
  // The shape rule itself rejects non-float inputs for float-only math.
  expect_error([] { detail::dispatch(ir::OpCode::Sqrt, ir::NoAttrs{}, {bv({1})}); },
               {"sqrt", "dtype bool is not supported"});
  expect_error([] { detail::dispatch(ir::OpCode::Exp, ir::NoAttrs{}, {iv({1})}); }, {"exp", "i64"});
  expect_error([] { exp(Tensor()); }, {"exp", "undefined"});
}

// ---------------------------------------------------------------------------------------------
// Cast.

TEST(ElementwiseCast, AllPairs) {
  Tensor x = fv({-2.7f, 0.f, 1.5f, 3.f});
  EXPECT_EQ(cast(x, DType::i64).to_vector<int64_t>(), (I64{-2, 0, 1, 3}));  // truncation
  EXPECT_EQ(cast(x, DType::i32).to_vector<int32_t>(), (I32{-2, 0, 1, 3}));
  EXPECT_EQ(bools(cast(x, DType::boolean)), (std::vector<uint8_t>{1, 0, 1, 1}));
  EXPECT_EQ(cast(x, DType::bf16).to_vector<float>(), (F{-2.703125f, 0.f, 1.5f, 3.f}));
  EXPECT_EQ(cast(x, DType::f16).to_vector<float>(), (F{-2.69921875f, 0.f, 1.5f, 3.f}));
  EXPECT_EQ(cast(cast(x, DType::bf16), DType::f16).to_vector<float>(),
            (F{-2.703125f, 0.f, 1.5f, 3.f}));
  EXPECT_EQ(cast(bv({1, 0}), DType::f32).to_vector<float>(), (F{1, 0}));
  EXPECT_EQ(cast(iv({5, -1}), DType::i32).to_vector<int32_t>(), (I32{5, -1}));
  EXPECT_EQ(cast(iv({5, 0}), DType::boolean).to_vector<uint8_t>(), (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ(cast(i32v({7}), DType::bf16).to_vector<float>(), (F{7}));
  // Same dtype: the same tensor.
  EXPECT_EQ(cast(x, DType::f32).impl(), x.impl());
  auto n = cast(x, DType::i32).node();
  EXPECT_EQ(n->attr<ir::CastAttrs>().to, DType::i32);
}

// The whole-array f32 <-> bf16 casts round as bf16_t does, bit for bit: ties to even, NaNs
// (of either sign and payload) stay NaN, infinities, subnormals, and values that round up into
// the next binade or to infinity.
TEST(ElementwiseCast, Bf16ArraysRoundAsTheElementConversion) {
  std::vector<uint32_t> bits = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                                0x7f800000u, 0xff800000u, 0x7fc00001u, 0xff800001u, 0x7f7fffffu,
                                0x00000001u, 0x807fffffu, 0x3fffffffu, 0x477fe000u};
  for (uint32_t i = 0; i < 4096; ++i) bits.push_back(i * 1048573u);  // spread over all floats
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), bits.size() * 4);
  const Tensor b = cast(from_vector(x, {static_cast<int64_t>(x.size())}), DType::bf16);
  const auto* got = static_cast<const uint16_t*>(b.data_ptr());
  for (size_t i = 0; i < x.size(); ++i) {
    const bf16_t want(x[i]);
    ASSERT_EQ(got[i], want.bits) << std::hex << "f32 bits 0x" << bits[i];
  }
  const auto back = cast(b, DType::f32).to_vector<float>();
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = static_cast<float>(bf16_t(x[i]));
    ASSERT_EQ(std::memcmp(&back[i], &want, 4), 0) << std::hex << "f32 bits 0x" << bits[i];
  }
}

// ---------------------------------------------------------------------------------------------
// Binary values, broadcasting and promotion.

TEST(ElementwiseBinary, ArithmeticF32) {
  Tensor a = fv({1, 2, 3, 4}, {2, 2});
  Tensor b = fv({2, 4, 8, 16}, {2, 2});
  EXPECT_EQ(add(a, b).to_vector<float>(), (F{3, 6, 11, 20}));
  EXPECT_EQ(sub(a, b).to_vector<float>(), (F{-1, -2, -5, -12}));
  EXPECT_EQ(mul(a, b).to_vector<float>(), (F{2, 8, 24, 64}));
  EXPECT_EQ(div(a, b).to_vector<float>(), (F{0.5, 0.5, 0.375, 0.25}));
  EXPECT_EQ(maximum(a, fv({2, 1, 5, 0}, {2, 2})).to_vector<float>(), (F{2, 2, 5, 4}));
  EXPECT_EQ(minimum(a, fv({2, 1, 5, 0}, {2, 2})).to_vector<float>(), (F{1, 1, 3, 0}));
  expect_near(pow(a, fv({0.5f, 2.f, -1.f, 1.5f}, {2, 2})), {1, 4, 1.0 / 3, 8});
  EXPECT_EQ((a + b).shape(), (Shape{2, 2}));
  EXPECT_EQ((a - b).to_vector<float>(), sub(a, b).to_vector<float>());
  EXPECT_EQ((a * b).to_vector<float>(), mul(a, b).to_vector<float>());
  EXPECT_EQ((a / b).to_vector<float>(), div(a, b).to_vector<float>());
  EXPECT_EQ((-a).to_vector<float>(), (F{-1, -2, -3, -4}));
}

TEST(ElementwiseBinary, MaximumMinimumNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  expect_near(maximum(fv({nan, 1.f}), fv({1.f, nan})), {NAN, NAN});
  expect_near(minimum(fv({nan, 1.f}), fv({1.f, nan})), {NAN, NAN});
}

TEST(ElementwiseBinary, ScalarOperands) {
  Tensor a = fv({1, 2, 3});
  EXPECT_EQ((a + 1.0).to_vector<float>(), (F{2, 3, 4}));
  EXPECT_EQ((a - 1.0).to_vector<float>(), (F{0, 1, 2}));
  EXPECT_EQ((a * 2.0).to_vector<float>(), (F{2, 4, 6}));
  EXPECT_EQ((a / 2.0).to_vector<float>(), (F{0.5, 1, 1.5}));
  EXPECT_EQ((1.0 + a).to_vector<float>(), (F{2, 3, 4}));
  EXPECT_EQ((10.0 - a).to_vector<float>(), (F{9, 8, 7}));
  EXPECT_EQ((2.0 * a).to_vector<float>(), (F{2, 4, 6}));
  EXPECT_EQ((6.0 / a).to_vector<float>(), (F{6, 3, 2}));
  // A 0-d tensor on either side, and a [1] tensor against a larger one.
  EXPECT_EQ(add(scalar_tensor(10), a).to_vector<float>(), (F{11, 12, 13}));
  EXPECT_EQ(sub(fv({10}), a).to_vector<float>(), (F{9, 8, 7}));
  EXPECT_EQ(add(scalar_tensor(1), scalar_tensor(2)).shape(), Shape{});
}

TEST(ElementwiseBinary, Broadcasting) {
  Tensor col = fv({1, 2, 3}, {3, 1});
  Tensor row = fv({10, 20, 30, 40}, {1, 4});
  Tensor s = add(col, row);
  EXPECT_EQ(s.shape(), (Shape{3, 4}));
  EXPECT_EQ(s.to_vector<float>(), (F{11, 21, 31, 41, 12, 22, 32, 42, 13, 23, 33, 43}));
  EXPECT_EQ(sub(row, col).to_vector<float>(), (F{9, 19, 29, 39, 8, 18, 28, 38, 7, 17, 27, 37}));
  // Trailing-dim broadcast: [2, 3] + [3]; leading: [2, 3] * [2, 1].
  Tensor m = fv({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(add(m, fv({10, 20, 30})).to_vector<float>(), (F{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(mul(m, fv({2, 3}, {2, 1})).to_vector<float>(), (F{2, 4, 6, 12, 15, 18}));
  // Rank 4 with a middle broadcast dim: [2, 1, 2, 2] + [3, 1, 1].
  Tensor x = fv({0, 1, 2, 3, 4, 5, 6, 7}, {2, 1, 2, 2});
  Tensor y = fv({100, 200, 300}, {3, 1, 1});
  Tensor z = add(x, y);
  EXPECT_EQ(z.shape(), (Shape{2, 3, 2, 2}));
  auto zv = z.to_vector<float>();
  for (int64_t i = 0; i < 2; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k)
        EXPECT_EQ(zv[(i * 3 + j) * 4 + k], static_cast<float>(i * 4 + k + 100 * (j + 1)));
}

TEST(ElementwiseBinary, LargeBroadcastIsThreadSafe) {
  // Large enough to split into parallel chunks that start mid-row.
  const int64_t r = 333, c = 1001;
  F av(static_cast<size_t>(r * c)), bv_(static_cast<size_t>(c)), cv(static_cast<size_t>(r));
  for (size_t i = 0; i < av.size(); ++i) av[i] = static_cast<float>(i);
  for (size_t i = 0; i < bv_.size(); ++i) bv_[i] = static_cast<float>(i);
  for (size_t i = 0; i < cv.size(); ++i) cv[i] = static_cast<float>(i);
  Tensor a = fv(av, {r, c});
  Tensor b = fv(bv_, {c});
  Tensor col = fv(cv, {r, 1});
  auto s = add(a, b).to_vector<float>();
  auto t = mul(col, b).to_vector<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) {
      ASSERT_EQ(s[i * c + j], static_cast<float>(i * c + j + j));
      ASSERT_EQ(t[i * c + j], static_cast<float>(i * j));
    }
}

TEST(ElementwiseBinary, IntegerPaths) {
  Tensor a = iv({7, -7, 3});
  Tensor b = iv({2, 2, -4});
  EXPECT_EQ(add(a, b).to_vector<int64_t>(), (I64{9, -5, -1}));
  EXPECT_EQ(sub(a, b).to_vector<int64_t>(), (I64{5, -9, 7}));
  EXPECT_EQ(mul(a, b).to_vector<int64_t>(), (I64{14, -14, -12}));
  EXPECT_EQ(maximum(a, b).to_vector<int64_t>(), (I64{7, 2, 3}));
  EXPECT_EQ(minimum(a, b).to_vector<int64_t>(), (I64{2, -7, -4}));
  EXPECT_EQ(add(a, b).dtype(), DType::i64);
  // True division: int / int gives f32.
  Tensor d = div(a, b);
  EXPECT_EQ(d.dtype(), DType::f32);
  EXPECT_EQ(d.to_vector<float>(), (F{3.5, -3.5, -0.75}));
  EXPECT_EQ((a / 2.0).dtype(), DType::f32);
  // Integer pow: exact, negative exponents as torch.
  EXPECT_EQ(pow(iv({3, -2, 2}), iv({4, 3, 0})).to_vector<int64_t>(), (I64{81, -8, 1}));
  EXPECT_EQ(pow(iv({1, -1, -1, 2}), iv({-3, -3, -2, -1})).to_vector<int64_t>(), (I64{1, -1, 1, 0}));
  EXPECT_EQ(pow(iv({3}), 2.0).dtype(), DType::i64);
  EXPECT_EQ(pow(iv({3}), 2.0).to_vector<int64_t>(), (I64{9}));
  EXPECT_EQ(pow(2.0, iv({3, 4})).to_vector<int64_t>(), (I64{8, 16}));
  // i32 paths
  Tensor c = i32v({5, 6});
  EXPECT_EQ(add(c, c).dtype(), DType::i32);
  EXPECT_EQ((c * 3.0).to_vector<int32_t>(), (I32{15, 18}));
  EXPECT_EQ((c + 1.0).dtype(), DType::i32);
  Tensor big = i32v({std::numeric_limits<int32_t>::max()});
  EXPECT_EQ(add(big, i32v({1})).to_vector<int32_t>(), (I32{std::numeric_limits<int32_t>::min()}));
}

TEST(ElementwiseBinary, BoolArithmetic) {
  Tensor a = bv({1, 1, 0, 0}), b = bv({1, 0, 1, 0});
  EXPECT_EQ(add(a, b).dtype(), DType::boolean);
  EXPECT_EQ(bools(add(a, b)), (std::vector<uint8_t>{1, 1, 1, 0}));
  EXPECT_EQ(bools(mul(a, b)), (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(bools(maximum(a, b)), (std::vector<uint8_t>{1, 1, 1, 0}));
  // bool tensor + int scalar -> i64 (torch)
  EXPECT_EQ((a + 1.0).dtype(), DType::i64);
  EXPECT_EQ((a + 1.0).to_vector<int64_t>(), (I64{2, 2, 1, 1}));
}

TEST(ElementwiseBinary, Promotion) {
  Tensor f = fv({1.5f, 2.f});
  Tensor h = f.to(DType::bf16);
  Tensor g = f.to(DType::f16);
  Tensor i = iv({1, 2});
  Tensor j = i32v({1, 2});
  EXPECT_EQ(add(f, i).dtype(), DType::f32);
  EXPECT_EQ(add(i, f).to_vector<float>(), (F{2.5, 4}));
  EXPECT_EQ(add(i, j).dtype(), DType::i64);
  EXPECT_EQ(add(h, g).dtype(), DType::f32);  // bf16 + f16
  EXPECT_EQ(add(h, f).dtype(), DType::f32);
  EXPECT_EQ(add(h, i).dtype(), DType::bf16);
  EXPECT_EQ(mul(bv({1, 0}), j).dtype(), DType::i32);
  // 0-d tensors do not promote a dimensioned tensor within a category (torch's result_type).
  EXPECT_EQ(mul(h, scalar_tensor(2.0)).dtype(), DType::bf16);
  EXPECT_EQ(add(j, scalar_tensor(2, DType::i64)).dtype(), DType::i32);
  EXPECT_EQ(add(j, scalar_tensor(2.5)).dtype(), DType::f32);
  EXPECT_EQ(add(bv({1}), scalar_tensor(2, DType::i32)).dtype(), DType::i32);
  // Scalars take the tensor's dtype; a fractional scalar with an int tensor gives f32.
  EXPECT_EQ((h * 3.0).dtype(), DType::bf16);
  EXPECT_EQ((i * 3.0).dtype(), DType::i64);
  EXPECT_EQ((i * 0.5).dtype(), DType::f32);
  EXPECT_EQ((i * 0.5).to_vector<float>(), (F{0.5, 1}));
  EXPECT_EQ(bools(i > 1.5), (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(bools(eq(i, fv({1.f, 2.5f}))), (std::vector<uint8_t>{1, 0}));
}

TEST(ElementwiseBinary, SixteenBitFloats) {
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor a = fv({1, 2, 3, 4}, {2, 2}).to(t);
    Tensor b = fv({0.5f, 0.25f}).to(t);
    Tensor s = add(a, b);
    EXPECT_EQ(s.dtype(), t);
    EXPECT_EQ(s.to_vector<float>(), (F{1.5, 2.25, 3.5, 4.25}));
    EXPECT_EQ(div(a, b).to_vector<float>(), (F{2, 8, 6, 16}));
    EXPECT_EQ(pow(a, 2.0).to_vector<float>(), (F{1, 4, 9, 16}));
    EXPECT_EQ(bools(a > 2.5), (std::vector<uint8_t>{0, 0, 1, 1}));
  }
  // bf16 rounding happens once, after the float computation.
  Tensor x = fv({1.f}).to(DType::bf16);
  Tensor y = fv({0.00390625f}).to(DType::bf16);  // 2^-8: 1 + 2^-8 is a tie in bf16 -> 1
  EXPECT_EQ(add(x, y).to_vector<float>(), (F{1.f}));
}

TEST(ElementwiseBinary, PowSpecialExponents) {
  Tensor a = fv({0.f, 1.f, 4.f, 9.f});
  expect_near(pow(a, 0.5), {0, 1, 2, 3});
  expect_near(pow(a, 2.0), {0, 1, 16, 81});
  expect_near(pow(a, 3.0), {0, 1, 64, 729});
  expect_near(pow(a, 1.0), {0, 1, 4, 9});
  expect_near(pow(a, -1.0), {INFINITY, 1, 0.25, 1.0 / 9});
  expect_near(pow(a, -0.5), {INFINITY, 1, 0.5, 1.0 / 3});
  expect_near(pow(a, -2.0), {INFINITY, 1, 1.0 / 16, 1.0 / 81});
  expect_near(pow(a, 0.0), {1, 1, 1, 1});
  expect_near(pow(a, 1.7), {0, 1, std::pow(4.0, 1.7), std::pow(9.0, 1.7)}, 1e-5);
  expect_near(pow(2.0, fv({0, 3, -1})), {1, 8, 0.5});
  expect_error([] { pow(iv({2}), -1.0); }, {"pow", "negative integer powers"});
}

TEST(ElementwiseBinary, Comparisons) {
  Tensor a = fv({1, 2, 3});
  Tensor b = fv({2, 2, 2});
  using B = std::vector<uint8_t>;
  EXPECT_EQ(bools(eq(a, b)), (B{0, 1, 0}));
  EXPECT_EQ(bools(ne(a, b)), (B{1, 0, 1}));
  EXPECT_EQ(bools(lt(a, b)), (B{1, 0, 0}));
  EXPECT_EQ(bools(le(a, b)), (B{1, 1, 0}));
  EXPECT_EQ(bools(gt(a, b)), (B{0, 0, 1}));
  EXPECT_EQ(bools(ge(a, b)), (B{0, 1, 1}));
  EXPECT_EQ(bools(a == b), (B{0, 1, 0}));
  EXPECT_EQ(bools(a != b), (B{1, 0, 1}));
  EXPECT_EQ(bools(a < b), (B{1, 0, 0}));
  EXPECT_EQ(bools(a <= b), (B{1, 1, 0}));
  EXPECT_EQ(bools(a > b), (B{0, 0, 1}));
  EXPECT_EQ(bools(a >= b), (B{0, 1, 1}));
  EXPECT_EQ(bools(a > 1.0), (B{0, 1, 1}));
  EXPECT_EQ(bools(a < 2.0), (B{1, 0, 0}));
  EXPECT_EQ(bools(a >= 2.0), (B{0, 1, 1}));
  EXPECT_EQ(bools(a <= 2.0), (B{1, 1, 0}));
  EXPECT_EQ(bools(a == 3.0), (B{0, 0, 1}));
  EXPECT_EQ(eq(a, b).dtype(), DType::boolean);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(bools(eq(fv({nan}), fv({nan}))), (B{0}));
  EXPECT_EQ(bools(ne(fv({nan}), fv({nan}))), (B{1}));
  // Integer and broadcast comparisons.
  Tensor i = iv({1, 5, 9});
  EXPECT_EQ(bools(gt(i, iv({4}))), (B{0, 1, 1}));
  Tensor m = lt(fv({1, 2, 3}, {3, 1}), fv({2, 3}, {1, 2}));
  EXPECT_EQ(m.shape(), (Shape{3, 2}));
  EXPECT_EQ(bools(m), (B{1, 1, 0, 1, 0, 0}));
  // Large i64 values compare exactly (no float round trip).
  int64_t big = (int64_t{1} << 60);
  EXPECT_EQ(bools(eq(iv({big}), iv({big + 1}))), (B{0}));
}

TEST(ElementwiseBinary, LogicalOps) {
  using B = std::vector<uint8_t>;
  Tensor a = bv({1, 1, 0, 0}), b = bv({1, 0, 1, 0});
  EXPECT_EQ(bools(logical_and(a, b)), (B{1, 0, 0, 0}));
  EXPECT_EQ(bools(logical_or(a, b)), (B{1, 1, 1, 0}));
  EXPECT_EQ(bools(logical_xor(a, b)), (B{0, 1, 1, 0}));
  // Any dtype, nonzero is true; mixed dtypes.
  Tensor f = fv({2.f, -1.f, 0.f, 0.f});
  Tensor i = iv({3, 0, 7, 0});
  EXPECT_EQ(bools(logical_and(f, i)), (B{1, 0, 0, 0}));
  EXPECT_EQ(bools(logical_or(f, i)), (B{1, 1, 1, 0}));
  EXPECT_EQ(bools(logical_xor(f, b)), (B{0, 1, 1, 0}));
  EXPECT_EQ(logical_and(f, i).dtype(), DType::boolean);
}

TEST(ElementwiseWhere, ValuesBroadcastAndPromotion) {
  Tensor c = bv({1, 0, 1});
  Tensor a = fv({1, 2, 3});
  Tensor b = fv({10, 20, 30});
  EXPECT_EQ(where(c, a, b).to_vector<float>(), (F{1, 20, 3}));
  EXPECT_EQ(where(c, a, -1.0).to_vector<float>(), (F{1, -1, 3}));
  EXPECT_EQ(where(c, -1.0, b).to_vector<float>(), (F{-1, 20, -1}));
  // cond [3, 1], a [1, 2], b scalar
  Tensor cc = from_vector(std::vector<uint8_t>{1, 0, 1}, {3, 1}, DType::boolean);
  Tensor w = where(cc, fv({5, 6}, {1, 2}), 0.0);
  EXPECT_EQ(w.shape(), (Shape{3, 2}));
  EXPECT_EQ(w.to_vector<float>(), (F{5, 6, 0, 0, 5, 6}));
  // cond broadcast along the last dim against full a and b.
  Tensor w2 = where(cc, fv({1, 2, 3, 4, 5, 6}, {3, 2}), fv({7, 8, 9, 10, 11, 12}, {3, 2}));
  EXPECT_EQ(w2.to_vector<float>(), (F{1, 2, 9, 10, 5, 6}));
  // dtypes: i64 with f32 -> f32; bf16 kept; i32 kept with whole scalars
  EXPECT_EQ(where(c, iv({1, 2, 3}), b).dtype(), DType::f32);
  EXPECT_EQ(where(c, a.to(DType::bf16), 0.0).dtype(), DType::bf16);
  EXPECT_EQ(where(c, i32v({1, 2, 3}), 0.0).to_vector<int32_t>(), (I32{1, 0, 3}));
  EXPECT_EQ(where(c, i32v({1, 2, 3}), 0.5).dtype(), DType::f32);
  EXPECT_EQ(bools(where(c, bv({0, 0, 0}), bv({1, 1, 1}))), (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(where(c, iv({1, 2, 3}), iv({-1, -2, -3})).to_vector<int64_t>(), (I64{1, -2, 3}));
}

TEST(ElementwiseWhere, Errors) {
  expect_error([] { where(fv({1}), fv({1}), fv({2})); },
               {"where: condition must be bool, got f32"});
  expect_error([] { where(bv({1, 0}), fv({1, 2, 3}), 0.0); }, {"where", "[2]", "[3]"});
}

TEST(ElementwiseClamp, Values) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = fv({-2, 0, 1, 5, nan});
  expect_near(clamp(x, 0.0, 2.0), {0, 0, 1, 2, NAN});
  expect_near(clamp(x, std::nullopt, 1.0), {-2, 0, 1, 1, NAN});
  expect_near(clamp(x, 1.0, std::nullopt), {1, 1, 1, 5, NAN});
  expect_near(clamp(x, 3.0, 1.0), {1, 1, 1, 1, NAN});  // lo > hi gives hi, as torch
  EXPECT_EQ(clamp(iv({-5, 5}), 0.0, 3.0).to_vector<int64_t>(), (I64{0, 3}));
  EXPECT_EQ(clamp(iv({-5, 5}), 0.0, 3.0).dtype(), DType::i64);
  expect_error([] { clamp(fv({1}), std::nullopt, std::nullopt); }, {"clamp"});
}

TEST(ElementwiseBinary, Errors) {
  expect_error(
      [] {
        add(fv({1, 2, 3, 4, 5, 6}, {2, 3}), fv({1, 2, 3, 4}));
      },
      {"add: shapes [2, 3] and [4] are not broadcastable (dim 1: 3 vs 4)"});
  expect_error([] { mul(fv({1, 2}), fv({1, 2, 3})); }, {"mul", "[2]", "[3]"});
  expect_error([] { sub(bv({1}), bv({0})); }, {"sub", "bool"});
  expect_error([] { pow(bv({1}), bv({0})); }, {"pow", "bool"});
  expect_error([] { gt(fv({1, 2}), fv({1, 2, 3})); }, {"gt", "[2]", "[3]"});
  expect_error([] { add(Tensor(), fv({1})); }, {"add", "undefined"});
  // The shape rules themselves reject mixed dtypes (the public ops promote first).
  expect_error(
      [] {
        detail::dispatch(ir::OpCode::Add, ir::NoAttrs{}, {fv({1}), iv({1})});
      },
      {"add", "f32", "i64"});
  expect_error(
      [] {
        detail::dispatch(ir::OpCode::Div, ir::NoAttrs{}, {iv({1}), iv({1})});
      },
      {"div", "i64"});
  // Broadcasting beyond the kernels' rank limit.
  Shape s9(9, 2), t9(9, 1);
  t9[0] = 2;
  expect_error([&] { add(ones(s9), ones(t9)); }, {"add", "more than 8 dims"});
  // ... but 9-d same-shape ops are fine.
  EXPECT_EQ(add(ones(s9), ones(s9)).numel(), 512);
}

TEST(ElementwiseBinary, EmptyTensors) {
  Tensor e = zeros({0, 3});
  EXPECT_EQ(add(e, fv({1, 2, 3})).shape(), (Shape{0, 3}));
  EXPECT_EQ(exp(e).numel(), 0);
  EXPECT_EQ(where(zeros({0}, DType::boolean), zeros({0}), 1.0).numel(), 0);
}

TEST(ElementwiseCopy, Identity) {
  Tensor x = fv({1, 2, 3});
  Tensor y = detail::dispatch(ir::OpCode::Copy, ir::NoAttrs{}, {x});
  EXPECT_EQ(y.to_vector<float>(), (F{1, 2, 3}));
  EXPECT_NE(y.data_ptr(), x.data_ptr());
}

TEST(ElementwiseKernels, InPlaceOutputAliasingAnInput) {
  // The compiler may write an elementwise op's result over a same-sized input (a state update
  // in place); every kernel path must read element i before writing it.
  Tensor a = fv({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = fv({10, 20, 30});
  Tensor out = add(a, b);  // a node with the right shapes for the kernel call
  auto n = out.node();
  n->inputs = {a.node(), b.node()};
  void* abuf = const_cast<void*>(a.data_ptr());
  const void* ins[] = {abuf, b.data_ptr()};
  cpu::kernel(ir::OpCode::Add)(ir::KernelContext{}, *n, ins, abuf);
  EXPECT_EQ(a.to_vector<float>(), (F{11, 22, 33, 14, 25, 36}));
  Tensor c = fv({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor d = fv({2, 2, 2, 2, 2, 2}, {2, 3});
  auto m = mul(c, d).node();
  m->inputs = {c.node(), d.node()};
  void* cbuf = const_cast<void*>(c.data_ptr());
  const void* ins2[] = {cbuf, d.data_ptr()};
  cpu::kernel(ir::OpCode::Mul)(ir::KernelContext{}, *m, ins2, cbuf);
  EXPECT_EQ(c.to_vector<float>(), (F{2, 4, 6, 8, 10, 12}));
}

// ---------------------------------------------------------------------------------------------
// Gradients.

TEST(ElementwiseGrad, UnaryHandValues) {
  Tensor x = fv({-1.f, 0.f, 2.f});
  x.set_requires_grad();
  abs(x).backward(ones({3}));
  EXPECT_EQ(x.grad().to_vector<float>(), (F{-1, 0, 1}));  // sign, 0 at 0

  Tensor y = fv({-1.f, 0.f, 2.f});
  y.set_requires_grad();
  relu(y).backward(fv({5, 5, 5}));
  EXPECT_EQ(y.grad().to_vector<float>(), (F{0, 0, 5}));  // 0 at 0, as torch

  Tensor z = fv({1.f, 4.f});
  z.set_requires_grad();
  sqrt(z).backward(ones({2}));
  expect_near(z.grad(), {0.5, 0.25});

  Tensor n = fv({1.f, -2.f});
  n.set_requires_grad();
  (-n).backward(ones({2}));
  EXPECT_EQ(n.grad().to_vector<float>(), (F{-1, -1}));
}

TEST(ElementwiseGrad, UnaryFiniteDifferences) {
  const F x0 = {-1.3f, -0.4f, 0.3f, 0.9f, 1.7f, 2.4f};
  const Shape s = {2, 3};
  const F pos = {0.3f, 0.5f, 0.9f, 1.3f, 2.f, 3.1f};
  check_grad([](const Tensor& x) { return exp(x); }, x0, s);
  check_grad([](const Tensor& x) { return tanh(x); }, x0, s);
  check_grad([](const Tensor& x) { return sigmoid(x); }, x0, s);
  check_grad([](const Tensor& x) { return gelu(x); }, x0, s);
  check_grad([](const Tensor& x) { return gelu(x, true); }, x0, s);
  check_grad([](const Tensor& x) { return silu(x); }, x0, s);
  check_grad([](const Tensor& x) { return erf(x); }, x0, s);
  check_grad([](const Tensor& x) { return abs(x); }, x0, s);
  check_grad([](const Tensor& x) { return relu(x); }, x0, s);
  check_grad([](const Tensor& x) { return neg(x); }, x0, s);
  check_grad([](const Tensor& x) { return log(x); }, pos, s);
  check_grad([](const Tensor& x) { return sqrt(x); }, pos, s);
  check_grad([](const Tensor& x) { return rsqrt(x); }, pos, s);
  check_grad([](const Tensor& x) { return reciprocal(x); }, pos, s);
  check_grad([](const Tensor& x) { return pow(x, 3.0); }, x0, s);
  check_grad([](const Tensor& x) { return pow(x, 2.5); }, pos, s);
  check_grad([](const Tensor& x) { return pow(2.0, x); }, x0, s);
  check_grad([](const Tensor& x) { return clamp(x, -0.5, 1.0); }, x0, s);
  check_grad([](const Tensor& x) { return x * x - 3.0 * x + 1.0; }, x0, s);
  check_grad([](const Tensor& x) { return 2.0 / x; }, pos, s);
  check_grad([](const Tensor& x) { return where(x > 0.5, x * x, -x); }, x0, s);
}

TEST(ElementwiseGrad, BinarySameShape) {
  Tensor a = fv({1.f, 2.f, 3.f});
  Tensor b = fv({4.f, 0.5f, -2.f});
  a.set_requires_grad();
  b.set_requires_grad();
  Tensor g = fv({1.f, 2.f, 3.f});
  div(a, b).backward(g);
  expect_near(a.grad(), {1 / 4.0, 2 / 0.5, 3 / -2.0});
  expect_near(b.grad(), {-1 * 1 / 16.0, -2 * 2 / 0.25, -3 * 3 / 4.0});

  Tensor c = fv({1.f, 2.f}), d = fv({3.f, 5.f});
  c.set_requires_grad();
  d.set_requires_grad();
  (c * d + c - d).backward(ones({2}));
  EXPECT_EQ(c.grad().to_vector<float>(), (F{4, 6}));
  EXPECT_EQ(d.grad().to_vector<float>(), (F{0, 1}));
}

TEST(ElementwiseGrad, PowBothInputs) {
  Tensor a = fv({0.f, 2.f, 3.f, 0.f});
  Tensor e = fv({2.f, 3.f, 0.f, 0.f});
  a.set_requires_grad();
  e.set_requires_grad();
  pow(a, e).backward(ones({4}));
  // d/da = e * a^(e-1), 0 where e == 0
  expect_near(a.grad(), {0, 12, 0, 0});
  // d/de = a^e log a, 0 where a == 0 and e >= 0
  expect_near(e.grad(), {0, 8 * std::log(2.0), std::log(3.0), 0});
}

TEST(ElementwiseGrad, MaximumMinimumTies) {
  Tensor a = fv({1.f, 2.f, 3.f});
  Tensor b = fv({2.f, 2.f, 1.f});
  a.set_requires_grad();
  b.set_requires_grad();
  maximum(a, b).backward(fv({4, 4, 4}));
  EXPECT_EQ(a.grad().to_vector<float>(), (F{0, 2, 4}));
  EXPECT_EQ(b.grad().to_vector<float>(), (F{4, 2, 0}));
  Tensor c = fv({1.f, 2.f, 3.f});
  Tensor d = fv({2.f, 2.f, 1.f});
  c.set_requires_grad();
  d.set_requires_grad();
  minimum(c, d).backward(fv({4, 4, 4}));
  EXPECT_EQ(c.grad().to_vector<float>(), (F{4, 2, 0}));
  EXPECT_EQ(d.grad().to_vector<float>(), (F{0, 2, 4}));
}

TEST(ElementwiseGrad, WhereAndCast) {
  Tensor c = bv({1, 0, 1});
  Tensor a = fv({1, 2, 3}), b = fv({4, 5, 6});
  a.set_requires_grad();
  b.set_requires_grad();
  where(c, a, b).backward(fv({7, 8, 9}));
  EXPECT_EQ(a.grad().to_vector<float>(), (F{7, 0, 9}));
  EXPECT_EQ(b.grad().to_vector<float>(), (F{0, 8, 0}));

  Tensor x = fv({1.5f, 2.5f});
  x.set_requires_grad();
  Tensor y = cast(x, DType::bf16);
  EXPECT_TRUE(y.requires_grad());
  cast(y * 2.0, DType::f32).backward(ones({2}));
  EXPECT_EQ(x.grad().dtype(), DType::f32);
  EXPECT_EQ(x.grad().to_vector<float>(), (F{2, 2}));
  // Integer results carry no gradient.
  EXPECT_FALSE(cast(x, DType::i64).requires_grad());
  EXPECT_FALSE((x > 1.0).requires_grad());
}

TEST(ElementwiseGrad, GeluGradMatchesFormula) {
  for (bool approx : {false, true}) {
    Tensor x = fv({-2.f, -0.5f, 0.f, 0.5f, 2.f});
    x.set_requires_grad();
    gelu(x, approx).backward(ones({5}));
    auto g = x.grad().to_vector<double>();
    int i = 0;
    for (double v : {-2.0, -0.5, 0.0, 0.5, 2.0}) {
      double want;
      if (!approx) {
        want = 0.5 * (1 + std::erf(v / std::sqrt(2.0))) +
               v * std::exp(-0.5 * v * v) / std::sqrt(2 * M_PI);
      } else {
        double k = std::sqrt(2 / M_PI), t = std::tanh(k * (v + 0.044715 * v * v * v));
        want = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
      }
      EXPECT_NEAR(g[i++], want, 1e-5) << "approx=" << approx << " x=" << v;
    }
  }
}

TEST(ElementwiseGrad, Broadcast) {
  Tensor a = fv({1, 2, 3}, {3, 1});
  Tensor b = fv({10, 20, 30, 40}, {1, 4});
  a.set_requires_grad();
  b.set_requires_grad();
  (a * b).backward(ones({3, 4}));
  EXPECT_EQ(a.grad().shape(), (Shape{3, 1}));
  EXPECT_EQ(a.grad().to_vector<float>(), (F{100, 100, 100}));
  EXPECT_EQ(b.grad().shape(), (Shape{1, 4}));
  EXPECT_EQ(b.grad().to_vector<float>(), (F{6, 6, 6, 6}));

  Tensor x = fv({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor bias = fv({0.5f, 1.f, 2.f});
  x.set_requires_grad();
  bias.set_requires_grad();
  (x / bias - bias).backward(ones({2, 3}));
  expect_near(bias.grad(), {-(1 + 4) / 0.25 - 2, -(2 + 5) / 1.0 - 2, -(3 + 6) / 4.0 - 2});

  Tensor c = from_vector(std::vector<uint8_t>{1, 0}, {2, 1}, DType::boolean);
  Tensor w = fv({1, 2, 3});
  w.set_requires_grad();
  where(c, w, 0.0).backward(ones({2, 3}));
  EXPECT_EQ(w.grad().to_vector<float>(), (F{1, 1, 1}));
}

TEST(ElementwiseGrad, ScalarOperandsGetNoGradient) {
  Tensor x = fv({1.f, 2.f});
  x.set_requires_grad();
  Tensor y = (x * 3.0 + 1.0) / 2.0;
  y.backward(ones({2}));
  EXPECT_EQ(x.grad().to_vector<float>(), (F{1.5, 1.5}));
}
