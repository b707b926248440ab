// Unit tests of the reductions: every dim subset against a host double reference, keepdim and
// negative dims, accuracy of long sums and of var, empty and 0-d inputs, NaN, argmax, error
// messages, and gradients against central finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "cstorch/tensor.h"
#include "unit/test_util.h"

using namespace cstorch;
using namespace cstorch::testing;

namespace {

// Host reference: reduce `x` of shape `s` over `dims` (sorted, non-negative).
enum class Op { Sum, Mean, Max, Min, Var1, Var0, Lse, Norm2, Norm1, Norm3 };
D ref_reduce(const F& x, const Shape& s, const I& dims, Op op) {
  const int nd = static_cast<int>(s.size());
  auto red = [&](int d) {
    for (auto r : dims)
      if (r == d) return true;
    return false;
  };
  int64_t nout = 1;
  for (int d = 0; d < nd; ++d)
    if (!red(d)) nout *= s[d];
  std::vector<D> groups(static_cast<size_t>(nout));
  for (int64_t i = 0; i < static_cast<int64_t>(x.size()); ++i) {
    int64_t rem = i, o = 0, mul = 1;
    for (int d = nd - 1; d >= 0; --d) {
      int64_t c = rem % s[d];
      rem /= s[d];
      if (!red(d)) {
        o += c * mul;
        mul *= s[d];
      }
    }
    groups[o].push_back(x[i]);
  }
  D out;
  for (auto& g : groups) {
    double n = static_cast<double>(g.size()), sum = 0, mx = -INFINITY, mn = INFINITY;
    for (double v : g) {
      sum += v;
      mx = std::max(mx, v);
      mn = std::min(mn, v);
    }
    double mean = sum / n, ss = 0, se = 0, s1 = 0, s3 = 0;
    for (double v : g) {
      ss += (v - mean) * (v - mean);
      se += std::exp(v - mx);
      s1 += std::fabs(v);
      s3 += std::pow(std::fabs(v), 3);
    }
    switch (op) {
      case Op::Sum:
        out.push_back(sum);
        break;
      case Op::Mean:
        out.push_back(mean);
        break;
      case Op::Max:
        out.push_back(mx);
        break;
      case Op::Min:
        out.push_back(mn);
        break;
      case Op::Var1:
        out.push_back(ss / (n - 1));
        break;
      case Op::Var0:
        out.push_back(ss / n);
        break;
      case Op::Lse:
        out.push_back(mx + std::log(se));
        break;
      case Op::Norm2: {
        double q = 0;
        for (double v : g) q += v * v;
        out.push_back(std::sqrt(q));
        break;
      }
      case Op::Norm1:
        out.push_back(s1);
        break;
      case Op::Norm3:
        out.push_back(std::cbrt(s3));
        break;
    }
  }
  return out;
}

Tensor run_op(const Tensor& x, const I& dims, Op op, bool keepdim) {
  switch (op) {
    case Op::Sum:
      return sum(x, dims, keepdim);
    case Op::Mean:
      return mean(x, dims, keepdim);
    case Op::Max:
      return amax(x, dims, keepdim);
    case Op::Min:
      return amin(x, dims, keepdim);
    case Op::Var1:
      return var(x, dims, 1, keepdim);
    case Op::Var0:
      return var(x, dims, 0, keepdim);
    case Op::Lse:
      return logsumexp(x, dims, keepdim);
    case Op::Norm2:
      return norm(x, 2, dims, keepdim);
    case Op::Norm1:
      return norm(x, 1, dims, keepdim);
    case Op::Norm3:
      return norm(x, 3, dims, keepdim);
  }
  return Tensor();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST(ReduceValues, EveryDimSubsetMatchesReference) {
  // Shapes with size-1 dims and dims long enough to exercise the tiled column path.
  for (Shape s : {Shape{3, 4, 5}, Shape{2, 1, 3, 70}, Shape{4, 3, 2, 5}}) {
    F x = rvals(numel(s), -2, 2, 3);
    Tensor t = from_vector(x, s);
    const int nd = static_cast<int>(s.size());
    for (int mask = 1; mask < (1 << nd); ++mask) {
      I dims;
      for (int d = 0; d < nd; ++d)
        if (mask & (1 << d)) dims.push_back(d);
      for (Op op : {Op::Sum, Op::Mean, Op::Max, Op::Min, Op::Var1, Op::Var0, Op::Lse, Op::Norm2,
                    Op::Norm1, Op::Norm3}) {
        std::string what = shape_str(s) + " dims " + shape_str(dims) + " op " +
                           std::to_string(static_cast<int>(op));
        Tensor y = run_op(t, dims, op, false);
        Shape want_shape;
        for (int d = 0; d < nd; ++d)
          if (!(mask & (1 << d))) want_shape.push_back(s[d]);
        EXPECT_EQ(y.shape(), want_shape) << what;
        expect_close(y.to_vector<double>(), ref_reduce(x, s, dims, op), 2e-6, what);
      }
    }
  }
}

TEST(ReduceValues, KnownSumsKeepdimNegativeDims) {
  Tensor x = arange(0, 24, 1, DType::f32).reshape({2, 3, 4});
  EXPECT_FLOAT_EQ(sum(x).item<float>(), 276);
  EXPECT_EQ(sum(x).shape(), Shape{});
  Tensor s1 = sum(x, {1});
  EXPECT_EQ(s1.shape(), (Shape{2, 4}));
  EXPECT_EQ(s1.to_vector<float>(), (F{12, 15, 18, 21, 48, 51, 54, 57}));
  EXPECT_EQ(sum(x, {1}, true).shape(), (Shape{2, 1, 4}));
  EXPECT_EQ(sum(x, {-1}).to_vector<float>(), (F{6, 22, 38, 54, 70, 86}));
  EXPECT_EQ(x.sum({-1, 0}).to_vector<float>(), (F{60, 92, 124}));
  // Non-contiguous reduced dims: {0, 2} of [2, 3, 4].
  EXPECT_EQ(sum(x, {0, 2}).to_vector<float>(), (F{60, 92, 124}));
  EXPECT_EQ(sum(x, {2, 0}, true).shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(x.mean({1}).to_vector<float>(), (F{4, 5, 6, 7, 16, 17, 18, 19}));
  EXPECT_EQ(amax(x, {0, 2}).to_vector<float>(), (F{15, 19, 23}));
  EXPECT_EQ(amin(x, {-2}, true).to_vector<float>(), (F{0, 1, 2, 3, 12, 13, 14, 15}));
  EXPECT_EQ(max(x).item<float>(), 23);
  EXPECT_EQ(min(x).item<float>(), 0);
  Tensor v = from_vector(F{1, 2, 3, 4}, {4});
  EXPECT_FLOAT_EQ(var(v).item<float>(), 5.f / 3);
  EXPECT_FLOAT_EQ(var(v, {}, 0).item<float>(), 1.25f);
  EXPECT_FLOAT_EQ(norm(from_vector(F{3, -4}, {2})).item<float>(), 5);
  EXPECT_FLOAT_EQ(norm(from_vector(F{3, -4}, {2}), 1).item<float>(), 7);
  EXPECT_NEAR(logsumexp(from_vector(F{0, 0}, {2}), {0}).item<float>(), std::log(2.0), 1e-7);
}

TEST(ReduceValues, IntegerAndBoolDTypes) {
  Tensor xi = from_vector(I{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor s = sum(xi, {1});
  EXPECT_EQ(s.dtype(), DType::i64);
  EXPECT_EQ(s.to_vector<int64_t>(), (I{6, 15}));
  Tensor x32 = from_vector(std::vector<int32_t>{7, -2, 3}, {3});
  EXPECT_EQ(sum(x32).dtype(), DType::i64);
  EXPECT_EQ(sum(x32).item<int64_t>(), 8);
  EXPECT_EQ(amax(x32).dtype(), DType::i32);
  EXPECT_EQ(amax(x32).item<int64_t>(), 7);
  EXPECT_EQ(amin(x32).item<int64_t>(), -2);
  Tensor b = from_vector(std::vector<uint8_t>{1, 0, 1, 1}, {4}, DType::boolean);
  EXPECT_EQ(sum(b).dtype(), DType::i64);
  EXPECT_EQ(sum(b).item<int64_t>(), 3);
  EXPECT_EQ(amax(b).dtype(), DType::boolean);
  EXPECT_TRUE(amax(b).item<bool>());
  EXPECT_FALSE(amin(b).item<bool>());
  EXPECT_ERROR(mean(xi), "mean", "i64", "floating-point");
  EXPECT_ERROR(var(xi), "var", "i64");
  EXPECT_ERROR(logsumexp(xi, {0}), "logsumexp", "i64");
  EXPECT_ERROR(norm(xi), "norm", "i64");
}

TEST(ReduceValues, SixteenBitFloats) {
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor x = arange(0, 12, 1, t).reshape({3, 4});
    EXPECT_EQ(sum(x, {1}).dtype(), t);
    EXPECT_EQ(sum(x, {1}).to_vector<float>(), (F{6, 22, 38}));
    EXPECT_EQ(mean(x, {0}).to_vector<float>(), (F{4, 5, 6, 7}));
    EXPECT_EQ(amax(x, {0}).to_vector<float>(), (F{8, 9, 10, 11}));
    EXPECT_NEAR(var(x).item<float>(), 13.0, 0.1);
  }
}

TEST(ReduceAccuracy, LongSumsStayAccurate) {
  // 1e5 and 2e6 elements (the latter splits rows across threads): within 1e-6 relative.
  for (int64_t n : {int64_t{100000}, int64_t{2000000}}) {
    F x = rvals(n, 0, 1, 5);
    double want = 0;
    for (float v : x) want += v;
    Tensor t = from_vector(x, {n});
    EXPECT_NEAR(sum(t).item<double>(), want, 1e-6 * want) << n;
    EXPECT_NEAR(mean(t).item<double>(), want / n, 1e-6 * want / n) << n;
    // The same data as tall columns (split column path) and as rows.
    Tensor cols = t.reshape({n / 4, 4});
    D cs = sum(cols, {0}).to_vector<double>();
    D want_cols(4, 0.0);
    for (int64_t i = 0; i < n; ++i) want_cols[i % 4] += x[i];
    for (int j = 0; j < 4; ++j) EXPECT_NEAR(cs[j], want_cols[j], 1e-6 * want_cols[j]);
    Tensor rows = t.reshape({4, n / 4});
    D rs = sum(rows, {1}).to_vector<double>();
    for (int j = 0; j < 4; ++j) {
      double w = 0;
      for (int64_t i = 0; i < n / 4; ++i) w += x[j * (n / 4) + i];
      EXPECT_NEAR(rs[j], w, 1e-6 * w);
    }
  }
}

TEST(ReduceAccuracy, TwoPassVarianceWithLargeMean) {
  // Values 1e4 + small spread: a one-pass E[x^2] - E[x]^2 loses every digit in f32 or double
  // accumulation of float squares; two passes keep the variance exact to float rounding.
  const int64_t n = 100000;
  F x = rvals(n, -1, 1, 9);
  for (auto& v : x) v += 10000.f;
  double m = 0;
  for (float v : x) m += v;
  m /= n;
  double ss = 0;
  for (float v : x) ss += (v - m) * (v - m);
  Tensor t = from_vector(x, {n});
  EXPECT_NEAR(var(t).item<double>(), ss / (n - 1), 1e-5 * ss / (n - 1));
  EXPECT_NEAR(var(t.reshape({100, 1000}), {1}).to_vector<double>()[0],
              ref_reduce(F(x.begin(), x.begin() + 1000), {1000}, {0}, Op::Var1)[0], 1e-4);
}

TEST(ReduceValues, EmptyZeroDAndSpecialValues) {
  Tensor e = zeros({0, 3});
  EXPECT_EQ(sum(e, {0}).to_vector<float>(), (F{0, 0, 0}));
  EXPECT_EQ(sum(e, {1}).shape(), (Shape{0}));
  EXPECT_TRUE(std::isnan(mean(e).item<float>()));
  EXPECT_EQ(logsumexp(e, {0}).to_vector<float>()[0], -INFINITY);
  EXPECT_EQ(norm(e, 2, {0}).to_vector<float>(), (F{0, 0, 0}));
  EXPECT_EQ(amax(e, {1}).shape(), (Shape{0}));
  EXPECT_ERROR(amax(e, {0}), "amax", "size 0", "[0, 3]");
  EXPECT_ERROR(amin(e), "amin");
  EXPECT_ERROR(argmax(e), "argmax", "empty");
  EXPECT_ERROR(argmax(e, 0), "argmax", "dim 0");
  EXPECT_EQ(argmax(e, 1).shape(), (Shape{0}));

  Tensor s = scalar_tensor(2.5);
  EXPECT_EQ(sum(s).item<float>(), 2.5f);
  EXPECT_EQ(sum(s, {0}).shape(), Shape{});
  EXPECT_EQ(sum(s, {-1}, true).shape(), Shape{});
  EXPECT_EQ(amax(s).item<float>(), 2.5f);
  EXPECT_EQ(argmax(s).item<int64_t>(), 0);
  EXPECT_EQ(argmax(s, 0).item<int64_t>(), 0);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor xn = from_vector(F{1, nan, 3, 4}, {2, 2});
  D mx = amax(xn, {1}).to_vector<double>();
  EXPECT_TRUE(std::isnan(mx[0]));
  EXPECT_EQ(mx[1], 4);
  EXPECT_TRUE(std::isnan(amin(xn, {0}).to_vector<double>()[1]));
  EXPECT_EQ(argmax(xn, 1).to_vector<int64_t>(), (I{1, 1}));
  EXPECT_EQ(argmax(from_vector(F{1, 5, nan, nan}, {4})).item<int64_t>(), 2);
  // logsumexp with infinities: no inf - inf.
  EXPECT_EQ(logsumexp(from_vector(F{-INFINITY, -INFINITY}, {2}), {0}).item<float>(), -INFINITY);
  EXPECT_EQ(logsumexp(from_vector(F{INFINITY, 1}, {2}), {0}).item<float>(), INFINITY);
  EXPECT_NEAR(logsumexp(from_vector(F{1000, 1000}, {2}), {0}).item<float>(), 1000 + std::log(2.0),
              1e-3);
  // var of one element with correction 1: 0/0.
  EXPECT_TRUE(std::isnan(var(from_vector(F{3}, {1})).item<float>()));
}

TEST(ReduceArgmax, FirstMaximumDimsAndKeepdim) {
  Tensor x = from_vector(F{1, 7, 7, 2, 9, 0, 9, 3}, {2, 4});
  EXPECT_EQ(argmax(x).item<int64_t>(), 4);
  EXPECT_EQ(argmax(x).dtype(), DType::i64);
  EXPECT_EQ(argmax(x).shape(), Shape{});
  EXPECT_EQ(argmax(x, std::nullopt, true).shape(), (Shape{1, 1}));
  EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), (I{1, 0}));
  EXPECT_EQ(argmax(x, -1, true).shape(), (Shape{2, 1}));
  EXPECT_EQ(argmax(x, 0).to_vector<int64_t>(), (I{1, 0, 1, 1}));
  // Column path (dim not last) with more columns than one tile.
  Shape s{3, 5, 130};
  F v = rvals(numel(s), -1, 1, 4);
  Tensor t = from_vector(v, s);
  I got = argmax(t, 1).to_vector<int64_t>();
  for (int64_t o = 0; o < 3; ++o)
    for (int64_t j = 0; j < 130; ++j) {
      int64_t best = 0;
      for (int64_t r = 1; r < 5; ++r)
        if (v[(o * 5 + r) * 130 + j] > v[(o * 5 + best) * 130 + j]) best = r;
      EXPECT_EQ(got[o * 130 + j], best);
    }
  Tensor xi = from_vector(I{3, -1, 8, 8}, {4});
  EXPECT_EQ(argmax(xi).item<int64_t>(), 2);
  EXPECT_ERROR(argmax(x, 2), "argmax", "dim 2");
}

TEST(ReduceErrors, MessagesNameTheOp) {
  Tensor x = zeros({2, 3});
  EXPECT_ERROR(sum(x, {2}), "sum", "dim 2");
  EXPECT_ERROR(mean(x, {-3}), "mean");
  EXPECT_ERROR(amax(x, {0, 0}), "amax", "more than once");
  EXPECT_ERROR(var(x, {5}), "var");
  EXPECT_ERROR(norm(x, 0), "norm", "p");
  EXPECT_ERROR(norm(x, INFINITY), "norm", "p");
  EXPECT_ERROR(norm(x, -1), "norm");
  EXPECT_ERROR(logsumexp(x, {3}), "logsumexp");
}

// ---------------------------------------------------------------------------------------------
TEST(ReduceGrad, SumMeanOverDimSets) {
  Tensor x = rt({2, 3, 4});
  for (I dims : {I{}, I{1}, I{0, 2}, I{-1}})
    for (bool keep : {false, true}) {
      check_grad([&](const std::vector<Tensor>& v) { return sum(v[0], dims, keep); }, {x});
      check_grad([&](const std::vector<Tensor>& v) { return mean(v[0], dims, keep); }, {x});
    }
}

TEST(ReduceGrad, MaxMinDistinctValuesAndTies) {
  // A permutation of well-separated values: no ties, finite differences are exact.
  F v(24);
  for (int i = 0; i < 24; ++i) v[i] = static_cast<float>((i * 7) % 24) * 0.1f;
  Tensor x = from_vector(v, {2, 3, 4});
  for (I dims : {I{}, I{1}, I{0, 2}})
    for (bool keep : {false, true}) {
      check_grad([&](const std::vector<Tensor>& a) { return amax(a[0], dims, keep); }, {x});
      check_grad([&](const std::vector<Tensor>& a) { return amin(a[0], dims, keep); }, {x});
    }
  // Ties share the gradient evenly.
  Tensor t = from_vector(F{1, 3, 3, 2, 5, 5, 5, 0}, {2, 4});
  t.set_requires_grad();
  amax(t, {1}).backward(from_vector(F{1, 3}, {2}));
  EXPECT_EQ(t.grad().to_vector<float>(), (F{0, 0.5, 0.5, 0, 1, 1, 1, 0}));
  Tensor u = from_vector(F{2, 2, 4}, {3});
  u.set_requires_grad();
  amin(u).backward();
  EXPECT_EQ(u.grad().to_vector<float>(), (F{0.5, 0.5, 0}));
}

TEST(ReduceGrad, VarLogSumExp) {
  Tensor x = rt({3, 4, 2});
  for (I dims : {I{}, I{1}, I{0, 2}})
    for (bool keep : {false, true}) {
      check_grad([&](const std::vector<Tensor>& a) { return var(a[0], dims, 1, keep); }, {x});
      check_grad([&](const std::vector<Tensor>& a) { return var(a[0], dims, 0, keep); }, {x});
      check_grad([&](const std::vector<Tensor>& a) { return logsumexp(a[0], dims, keep); }, {x});
    }
}

TEST(ReduceGrad, NormForSeveralP) {
  // Values away from 0 so |x|^p is smooth within the finite-difference step.
  F v = rvals(12, 0.2, 1.5, 6);
  for (int i = 0; i < 12; i += 3) v[i] = -v[i];
  Tensor x = from_vector(v, {3, 4});
  for (double p : {2.0, 1.0, 3.0, 1.5, 0.5})
    for (I dims : {I{}, I{1}, I{0}})
      check_grad([&](const std::vector<Tensor>& a) { return norm(a[0], p, dims); }, {x});
  // torch gives 0 (not NaN) where the norm is 0.
  Tensor z = zeros({2, 3});
  z.set_requires_grad();
  norm(z, 2, {1}).backward(ones({2}));
  EXPECT_EQ(z.grad().to_vector<float>(), F(6, 0.f));
  Tensor z3 = zeros({3});
  z3.set_requires_grad();
  norm(z3, 3).backward();
  EXPECT_EQ(z3.grad().to_vector<float>(), F(3, 0.f));
}

TEST(ReduceGrad, ArgmaxHasNoGradient) {
  Tensor x = rt({3});
  x.set_requires_grad();
  EXPECT_FALSE(argmax(x).requires_grad());
}
