// Unit tests of the nn functions: softmax / log_softmax over any dim, nll_loss and
// cross_entropy (hand-computed values with ignore_index and label smoothing), mse_loss,
// layer_norm, embedding, dropout, error messages, and gradients against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "core/internal.h"
#include "cstorch/runtime.h"
#include "cstorch/tensor.h"
#include "ops/vjp.h"
#include "unit/test_util.h"

using namespace cstorch;
using namespace cstorch::testing;

namespace {

// Host softmax of `x` [outer, C, inner] along C.
D ref_softmax(const F& x, int64_t outer, int64_t C, int64_t inner, bool log) {
  D y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      double m = -INFINITY, s = 0;
      for (int64_t c = 0; c < C; ++c) m = std::max(m, double(x[(o * C + c) * inner + j]));
      for (int64_t c = 0; c < C; ++c) s += std::exp(x[(o * C + c) * inner + j] - m);
      for (int64_t c = 0; c < C; ++c) {
        double v = x[(o * C + c) * inner + j] - m;
        y[(o * C + c) * inner + j] = log ? v - std::log(s) : std::exp(v) / s;
      }
    }
  return y;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST(NNSoftmax, EveryDimMatchesReference) {
  Shape s{3, 4, 70};
  F x = rvals(numel(s), -3, 3, 2);
  Tensor t = from_vector(x, s);
  for (int64_t dim = 0; dim < 3; ++dim) {
    int64_t outer = 1, inner = 1;
    for (int64_t i = 0; i < dim; ++i) outer *= s[i];
    for (int64_t i = dim + 1; i < 3; ++i) inner *= s[i];
    for (bool log : {false, true}) {
      Tensor y = log ? log_softmax(t, dim) : softmax(t, dim);
      EXPECT_EQ(y.shape(), s);
      expect_close(y.to_vector<double>(), ref_softmax(x, outer, s[dim], inner, log), 1e-6,
                   "dim " + std::to_string(dim));
      Tensor yn = log ? log_softmax(t, dim - 3) : softmax(t, dim - 3);
      EXPECT_EQ(yn.to_vector<float>(), y.to_vector<float>());
    }
  }
}

TEST(NNSoftmax, KnownValuesLargeInputsAndDTypes) {
  Tensor x = from_vector(F{0, 0, 1000, 1000}, {2, 2});
  EXPECT_EQ(softmax(x, 1).to_vector<float>(), (F{0.5, 0.5, 0.5, 0.5}));
  D ls = log_softmax(x, 1).to_vector<double>();
  for (double v : ls) EXPECT_NEAR(v, -std::log(2.0), 1e-6);
  Tensor y = softmax(from_vector(F{1, 2, 3}, {3}), 0);
  D want = ref_softmax({1, 2, 3}, 1, 3, 1, false);
  expect_close(y.to_vector<double>(), want, 1e-7);
  EXPECT_NEAR(want[2], 0.66524096, 1e-7);
  EXPECT_FLOAT_EQ(softmax(scalar_tensor(3), 0).item<float>(), 1);
  EXPECT_FLOAT_EQ(log_softmax(scalar_tensor(3), -1).item<float>(), 0);
  // A -inf logit gets probability 0 (log-probability -inf).
  Tensor m = from_vector(F{0, -INFINITY}, {2});
  EXPECT_EQ(softmax(m, 0).to_vector<float>(), (F{1, 0}));
  EXPECT_EQ(log_softmax(m, 0).to_vector<float>()[1], -INFINITY);
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor h = softmax(from_vector(F{1, 2, 3, 4}, {2, 2}).to(t), 0);
    EXPECT_EQ(h.dtype(), t);
    D ref = ref_softmax({1, 2, 3, 4}, 1, 2, 2, false);
    expect_close(h.to_vector<double>(), ref, 1e-2, dtype_name(t));
  }
  EXPECT_EQ(softmax(zeros({0, 3}), 1).shape(), (Shape{0, 3}));
}

TEST(NNSoftmax, LargeRowsRunInParallel) {
  Shape s{512, 300};
  F x = rvals(numel(s), -5, 5, 3);
  Tensor t = from_vector(x, s);
  expect_close(softmax(t, 1).to_vector<double>(), ref_softmax(x, 512, 300, 1, false), 1e-6);
  expect_close(log_softmax(t, 0).to_vector<double>(), ref_softmax(x, 1, 512, 300, true), 1e-6);
}

TEST(NNSoftmax, Errors) {
  EXPECT_ERROR(softmax(zeros({2, 3}), 2), "softmax", "dim 2");
  EXPECT_ERROR(log_softmax(zeros({2, 3}), -3), "log_softmax");
  EXPECT_ERROR(softmax(zeros({2, 3}, DType::i64), 1), "softmax", "i64");
}

// ---------------------------------------------------------------------------------------------
TEST(NNLoss, NllLossReductionsAndIgnoreIndex) {
  Tensor lp = from_vector(F{-1, -2, -3, -0.5, -1.5, -2.5, -4, -5, -6}, {3, 3});
  Tensor t = iv({2, 0, -100}, {3});
  EXPECT_EQ(nll_loss(lp, t, -100, Reduction::None).to_vector<float>(), (F{3, 0.5, 0}));
  EXPECT_FLOAT_EQ(nll_loss(lp, t, -100, Reduction::Sum).item<float>(), 3.5);
  EXPECT_FLOAT_EQ(nll_loss(lp, t).item<float>(), 1.75);  // ignored target not in the mean
  EXPECT_FLOAT_EQ(nll_loss(lp, iv({2, 0, 1}, {3})).item<float>(), (3 + 0.5 + 5) / 3.0);
  // ignore_index may be a valid class.
  EXPECT_FLOAT_EQ(nll_loss(lp, iv({2, 0, 1}, {3}), 0).item<float>(), 4);
  // Every target ignored: 0/0 = NaN for the mean, 0 for the sum.
  Tensor all = iv({-100, -100, -100}, {3});
  EXPECT_TRUE(std::isnan(nll_loss(lp, all).item<float>()));
  EXPECT_EQ(nll_loss(lp, all, -100, Reduction::Sum).item<float>(), 0);
  // i32 targets, a 1-d input with a 0-d target.
  EXPECT_FLOAT_EQ(nll_loss(lp, from_vector(std::vector<int32_t>{1, 1, 1}, {3})).item<float>(),
                  (2 + 1.5 + 5) / 3.0);
  Tensor one = nll_loss(from_vector(F{-1, -2}, {2}), iv({1}, {}), -100, Reduction::None);
  EXPECT_EQ(one.shape(), Shape{});
  EXPECT_EQ(one.item<float>(), 2);
}

TEST(NNLoss, NllLossSpatial) {
  // [N=2, C=3, d=2]: target [2, 2].
  Tensor lp = arange(0, 12, 1, DType::f32).reshape({2, 3, 2}) * -1.0;
  Tensor t = iv({0, 2, 1, -100}, {2, 2});
  Tensor none = nll_loss(lp, t, -100, Reduction::None);
  EXPECT_EQ(none.shape(), (Shape{2, 2}));
  // lp[n, c, j] = -(6n + 2c + j)
  EXPECT_EQ(none.to_vector<float>(), (F{0, 5, 8, 0}));
  EXPECT_FLOAT_EQ(nll_loss(lp, t).item<float>(), 13.0 / 3);
}

TEST(NNLoss, CrossEntropyHandComputed) {
  Tensor logits = from_vector(F{1, 2, 3, 0, 0, 0, 3, 1, 0}, {3, 3});
  Tensor t = iv({2, -100, 0}, {3});
  // Without smoothing: mean of -log_softmax at the two valid targets.
  EXPECT_NEAR(cross_entropy(logits, t).item<float>(), 0.2887259920003329, 1e-6);
  // label_smoothing 0.3: (1 - 0.3) * nll + 0.3 / 3 * (-sum of log-probs), ignored row 0.
  EXPECT_NEAR(cross_entropy(logits, t, -100, 0.3).item<float>(), 0.6887259920003328, 1e-6);
  EXPECT_NEAR(cross_entropy(logits, t, -100, 0.3, Reduction::Sum).item<float>(), 1.3774519840006656,
              1e-6);
  Tensor none = cross_entropy(logits, t, -100, 0.3, Reduction::None);
  EXPECT_EQ(none.shape(), (Shape{3}));
  expect_close(none.to_vector<double>(), {0.70760596444438, 0.0, 0.6698460195562856}, 1e-6);
  // A 1-d input: the class dim is 0.
  EXPECT_NEAR(cross_entropy(from_vector(F{1, 2, 3}, {3}), iv({2}, {}), -100, 0.3).item<float>(),
              0.70760596444438, 1e-6);
  // Class dim 1 of a [N, C, d] input.
  Tensor l3 = rt({2, 4, 3});
  Tensor t3 = iv({0, 3, 1, 2, -100, 0}, {2, 3});
  EXPECT_NEAR(cross_entropy(l3, t3).item<float>(), nll_loss(log_softmax(l3, 1), t3).item<float>(),
              1e-6);
}

TEST(NNLoss, MseLoss) {
  Tensor a = from_vector(F{1, 2, 3, 4}, {2, 2});
  Tensor b = from_vector(F{1, 0, 5, 1}, {2, 2});
  EXPECT_FLOAT_EQ(mse_loss(a, b).item<float>(), (0 + 4 + 4 + 9) / 4.0);
  EXPECT_FLOAT_EQ(mse_loss(a, b, Reduction::Sum).item<float>(), 17);
  EXPECT_EQ(mse_loss(a, b, Reduction::None).to_vector<float>(), (F{0, 4, 4, 9}));
  EXPECT_ERROR(mse_loss(iv({1}, {1}), iv({1}, {1})), "mse_loss", "i64");
  // A target that broadcasts the input to another shape (a [4, 1] prediction against [4]
  // targets gave a [4, 4] comparison without a word); a scalar target keeps the input's shape.
  EXPECT_ERROR(mse_loss(ones({4, 1}), ones({4})), "mse_loss: the input [4, 1]",
               "the target [4] broadcast to [4, 4]");
  EXPECT_FLOAT_EQ(mse_loss(ones({4, 1}), zeros({})).item<float>(), 1.0f);
  // A target broadcast into the input's shape is computed, with a warning (as PyTorch does),
  // once for each pair of shapes.
  ::testing::internal::CaptureStderr();
  EXPECT_FLOAT_EQ(mse_loss(ones({3, 5}), zeros({3, 1})).item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(mse_loss(ones({3, 5}), zeros({3, 1})).item<float>(), 1.0f);
  const std::string warned = ::testing::internal::GetCapturedStderr();
  const std::string want =
      "warning: mse_loss: the target [3, 1] is broadcast to the input's shape [3, 5]";
  EXPECT_NE(warned.find(want), std::string::npos) << warned;
  EXPECT_EQ(warned.find(want, warned.find(want) + 1), std::string::npos) << warned;
}

TEST(NNLoss, Errors) {
  Tensor lp = zeros({4, 3});
  EXPECT_ERROR(nll_loss(lp, iv({0, 1, 2}, {3})),
               "nll_loss: target has shape [3] but input has batch size 4");
  EXPECT_ERROR(cross_entropy(lp, zeros({4})),
               "cross_entropy: target must be an integer class index tensor (i32/i64), got f32");
  EXPECT_ERROR(nll_loss(lp, iv({0, 1, 2, 3}, {4})), "nll_loss", "target value 3", "3 classes");
  EXPECT_ERROR(nll_loss(lp, iv({0, -1, 2, 1}, {4})), "nll_loss", "-1");
  EXPECT_ERROR(cross_entropy(lp, iv({0, 1, 7, 1}, {4})), "nll_loss", "7");
  EXPECT_ERROR(nll_loss(zeros({2, 3, 5}), iv({0, 1}, {2})), "nll_loss", "[2]", "[2, 3, 5]");
  EXPECT_ERROR(nll_loss(zeros({3}), iv({0}, {1})), "nll_loss", "0-d");
  EXPECT_ERROR(nll_loss(scalar_tensor(1), iv({0}, {})), "nll_loss");
  EXPECT_ERROR(cross_entropy(lp, iv({0, 1, 2, 1}, {4}), -100, 1.5), "cross_entropy",
               "label_smoothing");
  EXPECT_ERROR(nll_loss(zeros({4, 3}, DType::i64), iv({0, 1, 2, 1}, {4})), "nll_loss", "i64");
}

// ---------------------------------------------------------------------------------------------
TEST(NNLayerNorm, ValuesAndErrors) {
  Tensor x = from_vector(F{1, 2, 3, 4, 2, 2, 2, 6}, {2, 4});
  Tensor y = layer_norm(x, {4});
  // Row 0: mean 2.5, biased var 1.25.
  D want;
  for (double v : {1, 2, 3, 4}) want.push_back((v - 2.5) / std::sqrt(1.25 + 1e-5));
  for (double v : {2, 2, 2, 6}) want.push_back((v - 3) / std::sqrt(3 + 1e-5));
  expect_close(y.to_vector<double>(), want, 1e-6);
  Tensor w = from_vector(F{1, 2, 3, 4}, {4}), b = from_vector(F{0, 1, 0, 1}, {4});
  D yw = layer_norm(x, {4}, w, b).to_vector<double>();
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(yw[i], want[i] * (1 + i % 4) + (i % 2), 1e-5);
  // Over the last two dims.
  Tensor x3 = rt({2, 3, 4});
  Tensor y3 = layer_norm(x3, {3, 4});
  D m = mean(y3, {1, 2}).to_vector<double>();
  D v = var(y3, {1, 2}, 0).to_vector<double>();
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(m[i], 0, 1e-6);
    EXPECT_NEAR(v[i], 1, 1e-3);
  }
  EXPECT_ERROR(layer_norm(zeros({2, 4}), {5}),
               "layer_norm: normalized_shape [5] does not match the trailing dims of input shape "
               "[2, 4]");
  EXPECT_ERROR(layer_norm(zeros({2, 4}), {2, 4, 1}), "layer_norm");
  EXPECT_ERROR(layer_norm(zeros({2, 4}), {}), "layer_norm");
  EXPECT_ERROR(layer_norm(zeros({2, 4}), {4}, zeros({3})), "layer_norm", "weight");
  EXPECT_ERROR(layer_norm(zeros({2, 4}), {4}, Tensor(), zeros({2})), "layer_norm", "bias");
}

// On the CPU an f32 layer_norm is one LayerNorm op (its gradients LayerNormGrad and
// LayerNormParamGrad); it agrees with the same function built from mean, var and elementwise ops
// (what it is on a backend without the kernels), forward and backward, to f32 rounding: the
// composition rounds at every op, the kernel once per step of its row formula, so 1e-5 relative
// to the size of the values (rows of 520, past one f32 block of the row sums; weight and bias
// gradients summed over 70 rows). Its results are bitwise the same at 1 and 2 threads.
TEST(NNLayerNorm, OneOpOnTheCpuAgreeingWithItsComposition) {
  const int64_t R = 70, Dn = 520;
  auto leaf = [](const Shape& s, uint32_t seed, double lo, double hi) {
    Tensor t = rt(s, seed, lo, hi);
    t.set_requires_grad(true);
    return t;
  };
  const Tensor r = rt({R, Dn}, 9);  // the loss's weights: every element of dy differs
  struct Run {
    Tensor y, dx, dw, db;
  };
  auto run = [&](bool fused, bool affine) {
    Tensor x = leaf({R, Dn}, 3, -2, 3), w = leaf({Dn}, 4, 0.5, 1.5), b = leaf({Dn}, 5, -1, 1);
    Tensor y;
    if (fused) {
      y = affine ? layer_norm(x, {Dn}, w, b) : layer_norm(x, {Dn});
      EXPECT_EQ(y.impl()->node->op, ir::OpCode::LayerNorm);
    } else {
      const Tensor m = mean(x, {1}, true), v = var(x, {1}, 0, true);
      y = mul(sub(x, m), rsqrt(v + 1e-5));
      if (affine) y = add(mul(y, w), b);
    }
    sum(mul(y, r)).backward();
    return Run{y, x.grad(), affine ? w.grad() : Tensor(), affine ? b.grad() : Tensor()};
  };
  for (bool affine : {true, false}) {
    const Run f = run(true, affine), c = run(false, affine);
    auto near = [](const Tensor& got, const Tensor& want, const char* what) {
      const D g = got.to_vector<double>(), w = want.to_vector<double>();
      ASSERT_EQ(g.size(), w.size()) << what;
      double scale = 0;
      for (double v : w) scale = std::max(scale, std::fabs(v));
      for (size_t i = 0; i < g.size(); ++i)
        ASSERT_NEAR(g[i], w[i], 1e-5 * scale) << what << " at " << i;
    };
    near(f.y, c.y, "y");
    near(f.dx, c.dx, "dx");
    if (affine) {
      near(f.dw, c.dw, "dweight");
      near(f.db, c.db, "dbias");
    }
  }
  const int threads = get_num_threads();
  set_num_threads(1);
  const Run one = run(true, true);
  set_num_threads(2);
  const Run two = run(true, true);
  set_num_threads(threads);
  EXPECT_EQ(one.y.to_vector<float>(), two.y.to_vector<float>());
  EXPECT_EQ(one.dx.to_vector<float>(), two.dx.to_vector<float>());
  EXPECT_EQ(one.dw.to_vector<float>(), two.dw.to_vector<float>());
  EXPECT_EQ(one.db.to_vector<float>(), two.db.to_vector<float>());
}

TEST(NNEmbedding, LookupShapesAndErrors) {
  Tensor w = arange(0, 8, 1, DType::f32).reshape({4, 2});
  Tensor idx = iv({3, 0, 3, 1}, {2, 2});
  Tensor e = embedding(idx, w);
  EXPECT_EQ(e.shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(e.to_vector<float>(), (F{6, 7, 0, 1, 6, 7, 2, 3}));
  EXPECT_EQ(embedding(from_vector(std::vector<int32_t>{2}, {1}), w).to_vector<float>(), (F{4, 5}));
  EXPECT_EQ(embedding(iv({1}, {}), w).shape(), (Shape{2}));
  EXPECT_ERROR(embedding(zeros({2}), w), "embedding", "f32");
  EXPECT_ERROR(embedding(idx, zeros({4})), "embedding", "2-d");
}

TEST(NNDropout, ModesAndScaling) {
  Tensor x = ones({1000});
  EXPECT_EQ(dropout(x, 0.5, false).impl(), x.impl());
  EXPECT_EQ(dropout(x, 0.0).impl(), x.impl());
  // p = 1 drops everything (as in PyTorch, which allows it).
  EXPECT_EQ(dropout(x, 1.0).to_vector<float>(), F(1000, 0.f));
  EXPECT_ERROR(dropout(x, 1.5), "dropout", "p must be in [0, 1]");
  EXPECT_ERROR(dropout(x, -0.1), "dropout", "p");
  manual_seed(7);
  F y = dropout(x, 0.25).to_vector<float>();
  int kept = 0;
  for (float v : y) {
    EXPECT_TRUE(v == 0.f || std::fabs(v - 1 / 0.75f) < 1e-6) << v;
    kept += v != 0.f;
  }
  EXPECT_GT(kept, 650);
  EXPECT_LT(kept, 850);
  // The gradient is the same mask and scale.
  Tensor l = ones({50});
  l.set_requires_grad();
  Tensor d = dropout(l, 0.5);
  d.backward(ones({50}));
  EXPECT_EQ(l.grad().to_vector<float>(), d.to_vector<float>());
}

// ---------------------------------------------------------------------------------------------
TEST(NNGrad, SoftmaxLogSoftmax) {
  for (int64_t dim : {0, 1, -1}) {
    check_grad([&](const std::vector<Tensor>& v) { return softmax(v[0], dim); }, {rt({3, 4, 2})});
    check_grad([&](const std::vector<Tensor>& v) { return log_softmax(v[0], dim); },
               {rt({3, 4, 2})});
  }
}

TEST(NNGrad, NllLossAndCrossEntropy) {
  Tensor t = iv({1, -100, 3, 0}, {4});
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None}) {
    check_grad([&](const std::vector<Tensor>& v) { return nll_loss(v[0], v[1], -100, r); },
               {rt({4, 5}), t});
    for (double eps : {0.0, 0.2})
      check_grad(
          [&](const std::vector<Tensor>& v) { return cross_entropy(v[0], v[1], -100, eps, r); },
          {rt({4, 5}), t});
  }
  Tensor t3 = iv({0, 3, 1, 2, -100, 0}, {2, 3});
  check_grad([&](const std::vector<Tensor>& v) { return cross_entropy(v[0], v[1], -100, 0.1); },
             {rt({2, 4, 3}), t3});
  check_grad([&](const std::vector<Tensor>& v) { return nll_loss(v[0], v[1]); },
             {rt({5}), iv({2}, {})});
}

TEST(NNGrad, NllLossGradIsTheTransposeOfNllLoss) {
  // <NllLossGrad(g), G> == <g, NllLoss(G)> for every reduction: the double-backward rule.
  Tensor t = iv({1, -100, 3, 0}, {4});
  for (auto red : {ir::Reduction::Mean, ir::Reduction::Sum, ir::Reduction::None}) {
    ir::LossAttrs at{-100, red, 5};
    Tensor g = red == ir::Reduction::None ? rt({4}, 3) : rt({}, 3);
    Tensor dlp = detail::dispatch(ir::OpCode::NllLossGrad, at, {g, t});
    EXPECT_EQ(dlp.shape(), (Shape{4, 5}));
    Tensor G = rt({4, 5}, 4);
    ops::VjpArgs args{*dlp.node(), {g, t}, dlp, G, {true, false}};
    auto back = ops::vjp_of(ir::OpCode::NllLossGrad)(args);
    double lhs = sum(mul(dlp, G)).item<double>(), rhs = sum(mul(g, back[0])).item<double>();
    EXPECT_NEAR(lhs, rhs, 1e-6);
  }
}

TEST(NNGrad, MseLayerNormEmbedding) {
  for (Reduction r : {Reduction::Mean, Reduction::Sum, Reduction::None})
    check_grad([&](const std::vector<Tensor>& v) { return mse_loss(v[0], v[1], r); },
               {rt({3, 4}), rt({3, 4}, 2)});
  check_grad([](const std::vector<Tensor>& v) { return layer_norm(v[0], {4}, v[1], v[2]); },
             {rt({3, 4}), rt({4}, 2), rt({4}, 3)});
  check_grad(
      [](const std::vector<Tensor>& v) {
        return layer_norm(v[0], {2, 3});
      },
      {rt({2, 2, 3})});
  check_grad([](const std::vector<Tensor>& v) { return embedding(v[0], v[1]); },
             {iv({3, 0, 3, 1, 3, 2}, {2, 3}), rt({5, 2})});
}

TEST(NNGrad, LogSoftmaxGradMatchesItsFormulaAndHasAGradient) {
  // The op computes g - exp(y) * sum(g, dim); rows (last dim) and strided (dim 0) layouts.
  for (int64_t dim : {1, 0}) {
    Tensor g = rt({3, 5}, 7), y = log_softmax(rt({3, 5}, 8), dim);
    Tensor dx = detail::dispatch(ir::OpCode::LogSoftmaxGrad, ir::DimAttrs{dim}, {g, y});
    Tensor want = sub(g, mul(exp(y), sum(g, {dim}, true)));
    EXPECT_LT(max(abs(sub(dx, want))).item<double>(), 1e-6) << "dim " << dim;
    // Its own gradient rule (double backward through log_softmax), by finite differences.
    check_grad(
        [dim](const std::vector<Tensor>& v) {
          return detail::dispatch(ir::OpCode::LogSoftmaxGrad, ir::DimAttrs{dim}, {v[0], v[1]});
        },
        {rt({3, 5}, 9), rt({3, 5}, 10)});
  }
}
