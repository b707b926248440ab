// Fused scaled-dot-product attention against the same maths written with plain ops
// (matmul, softmax), forward and every gradient; dropout masks; layouts; errors. The reference
// rows against PyTorch are in tests/reference/op_table.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "cstorch/nn/functional.h"
#include "cstorch/runtime.h"
#include "unit/test_util.h"

using namespace cstorch;
using namespace cstorch::testing;
namespace NF = cstorch::nn::functional;

namespace {

struct Case {
  int64_t B, H, Tq, Tk, D, Dv;
  bool causal = false;
  int64_t offset = 0;
  Shape bias;  // empty: none
  Shape mask;  // empty: none
  double scale = 0;
};

// Causal visibility of [Tq, Tk] as a bool tensor.
Tensor causal_mask(int64_t Tq, int64_t Tk, int64_t off) {
  B v(static_cast<size_t>(Tq * Tk));
  for (int64_t i = 0; i < Tq; ++i)
    for (int64_t j = 0; j < Tk; ++j) v[static_cast<size_t>(i * Tk + j)] = j <= i + off;
  return from_vector(v, {Tq, Tk}, DType::boolean);
}

// softmax(q k^T * scale + bias, masked) [* keep] @ v with plain ops.
Tensor composite(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias,
                 const Tensor& mask, const Case& c, double scale, const Tensor& keep = Tensor()) {
  Tensor s = matmul(q, k.transpose(-1, -2)) * scale;
  if (bias.defined()) s = s + bias;
  if (mask.defined()) s = where(mask, s, -INFINITY);
  if (c.causal) s = where(causal_mask(c.Tq, c.Tk, c.offset), s, -INFINITY);
  Tensor p = softmax(s, -1);
  if (keep.defined()) p = p * keep;
  return matmul(p, v);
}

// A bool mask with no fully masked row of [B, H, Tq, Tk] (column 0 always visible).
Tensor mask_of(const Shape& s, uint32_t seed) {
  F r = rvals(numel(s), 0, 1, seed);
  B v(r.size());
  const int64_t tk = s.back();
  for (size_t i = 0; i < r.size(); ++i) v[i] = (static_cast<int64_t>(i) % tk == 0) || r[i] < 0.6f;
  return from_vector(v, s, DType::boolean);
}

void check_case(const Case& c, double tol = 2e-5) {
  SCOPED_TRACE(fmt::format("B{} H{} Tq{} Tk{} D{} Dv{} causal{} off{} bias{} mask{}", c.B, c.H,
                           c.Tq, c.Tk, c.D, c.Dv, c.causal, c.offset, shape_str(c.bias),
                           shape_str(c.mask)));
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
  Tensor q = rt({c.B, c.H, c.Tq, c.D}, 1, -1.5, 1.5), k = rt({c.B, c.H, c.Tk, c.D}, 2, -1.5, 1.5),
         v = rt({c.B, c.H, c.Tk, c.Dv}, 3);
  Tensor bias = c.bias.empty() ? Tensor() : rt(c.bias, 4, -2, 2);
  Tensor mask = c.mask.empty() ? Tensor() : mask_of(c.mask, 5);
  Tensor g = rt({c.B, c.H, c.Tq, c.Dv}, 6);
  std::vector<Tensor> a{q, k, v}, b{q, k, v};
  if (bias.defined()) a.push_back(bias), b.push_back(bias);
  for (auto* set : {&a, &b})
    for (auto& t : *set) {
      t = from_vector(t.to_vector<float>(), t.shape());
      t.set_requires_grad();
    }
  NF::AttentionOptions o;
  if (bias.defined()) o.bias = a[3];
  o.attn_mask = mask;
  o.is_causal = c.causal;
  o.causal_offset = c.offset;
  if (c.scale > 0) o.scale = c.scale;
  Tensor y = NF::scaled_dot_product_attention(a[0], a[1], a[2], o);
  Tensor yr = composite(b[0], b[1], b[2], bias.defined() ? b[3] : Tensor(), mask, c, scale);
  expect_close(y.to_vector<double>(), yr.to_vector<double>(), tol, "forward");
  y.backward(g);
  yr.backward(g);
  const char* names[] = {"dq", "dk", "dv", "dbias"};
  for (size_t i = 0; i < a.size(); ++i)
    expect_close(a[i].grad().to_vector<double>(), b[i].grad().to_vector<double>(), tol, names[i]);
}

}  // namespace

TEST(Attention, MatchesCompositeSmall) {
  check_case({2, 3, 5, 7, 4, 6});
  check_case({1, 2, 9, 9, 8, 8, true});
  check_case({1, 2, 5, 7, 4, 3, true});                    // top-left causal, Tq < Tk
  check_case({1, 2, 7, 5, 4, 3, true, 2});                 // causal with an offset, Tq > Tk
  check_case({2, 2, 6, 6, 4, 4, false, 0, {1, 2, 6, 6}});  // T5-style bias
  check_case({2, 2, 6, 6, 4, 4, false, 0, {2, 1, 1, 6}, {2, 1, 6, 6}});  // broadcast bias + mask
  check_case({2, 2, 3, 5, 4, 4, false, 0, {}, {2, 1, 1, 5}});            // key padding
  check_case({1, 1, 4, 4, 3, 3, false, 0, {4}, {}, 0.3});  // explicit scale, bias [Tk]
}

TEST(Attention, MatchesCompositeMultiTile) {
  // Tq > 64 (several query blocks), Tk > 512 (several key tiles: online softmax in the forward,
  // recomputed statistics in the backward).
  check_case({1, 2, 70, 600, 8, 5, false, 0, {1, 2, 70, 600}}, 5e-5);
  check_case({1, 2, 70, 600, 8, 5, true, 530, {}, {1, 1, 1, 600}}, 5e-5);
  check_case({2, 1, 130, 515, 4, 4, true, 385}, 5e-5);
}

TEST(Attention, FullyMaskedRowIsZeroWithZeroGrad) {
  Tensor q = rt({1, 1, 2, 4}, 1), k = rt({1, 1, 3, 4}, 2), v = rt({1, 1, 3, 2}, 3);
  q.set_requires_grad();
  Tensor mask = bv({0, 0, 0, 1, 0, 1}, {1, 1, 2, 3});
  Tensor y = NF::scaled_dot_product_attention(q, k, v, mask);
  D yv = y.to_vector<double>();
  EXPECT_EQ(yv[0], 0.0);
  EXPECT_EQ(yv[1], 0.0);
  y.sum().backward();
  D gq = q.grad().to_vector<double>();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(gq[i], 0.0);
}

TEST(Attention, HeadsLastLayoutMatches) {
  Tensor q = rt({2, 5, 3, 4}, 1), k = rt({2, 7, 3, 4}, 2), v = rt({2, 7, 3, 6}, 3);
  NF::AttentionOptions o;
  o.heads_last = true;
  o.is_causal = true;
  o.causal_offset = 2;
  Tensor y = NF::scaled_dot_product_attention(q, k, v, o);
  NF::AttentionOptions p = o;
  p.heads_last = false;
  Tensor yr =
      NF::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), p)
          .transpose(1, 2);
  expect_close(y.to_vector<double>(), yr.to_vector<double>(), 1e-6);
  check_grad(
      [&](const std::vector<Tensor>& x) {
        return NF::scaled_dot_product_attention(x[0], x[1], x[2], o);
      },
      {q, k, v});
}

// Dropout: read the keep mask through v = identity (the output is then the dropped
// probabilities), then check a real v and its gradients against the composite with that mask,
// eager and traced from the same generator state.
TEST(Attention, DropoutMatchesCompositeWithItsMask) {
  const int64_t Tq = 6, Tk = 9;
  const double p = 0.3;
  Tensor q = rt({2, 2, Tq, 4}, 1, -2, 2), k = rt({2, 2, Tk, 4}, 2, -2, 2), v = rt({2, 2, Tk, 5}, 3);
  F eye(static_cast<size_t>(Tk * Tk), 0.f);
  for (int64_t i = 0; i < Tk; ++i) eye[static_cast<size_t>(i * Tk + i)] = 1.f;
  Tensor I = expand(fv(eye, {1, 1, Tk, Tk}), {2, 2, Tk, Tk});
  manual_seed(7);
  Tensor st = rng_state();
  Tensor probs = NF::scaled_dot_product_attention(q, k, I, Tensor(), p);
  Tensor keep = cast(ne(probs, zeros({})), DType::f32) * (1.0 / (1.0 - p));
  D kv = keep.to_vector<double>();
  double kept = 0;
  for (double x : kv) kept += x != 0;
  EXPECT_NEAR(kept / static_cast<double>(kv.size()), 1 - p, 0.1);
  // The dropped probabilities are softmax * keep exactly.
  Case c{2, 2, Tq, Tk, 4, 5};
  expect_close(probs.to_vector<double>(),
               composite(q, k, I, Tensor(), Tensor(), c, 0.5, keep).to_vector<double>(), 1e-6);

  auto leaves = [&] {
    std::vector<Tensor> r;
    for (const Tensor* t : {&q, &k, &v}) {
      Tensor l = from_vector(t->to_vector<float>(), t->shape());
      l.set_requires_grad();
      r.push_back(l);
    }
    return r;
  };
  auto ref = leaves();
  Tensor yr = composite(ref[0], ref[1], ref[2], Tensor(), Tensor(), c, 0.5, keep);
  yr.sum().backward();
  for (bool traced : {false, true}) {
    SCOPED_TRACE(traced ? "traced" : "eager");
    set_rng_state(st);
    auto x = leaves();
    Tensor y;
    if (traced) {
      auto step = trace([&] {
        Tensor out = NF::scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), p);
        out.sum().backward();
        return out;
      });
      y = step();
    } else {
      y = NF::scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), p);
      y.sum().backward();
    }
    expect_close(y.to_vector<double>(), yr.to_vector<double>(), 2e-5, "forward");
    for (int i = 0; i < 3; ++i)
      expect_close(x[i].grad().to_vector<double>(), ref[i].grad().to_vector<double>(), 2e-5,
                   "grad");
  }
  // The generator advanced: the next call draws another mask.
  Tensor again = NF::scaled_dot_product_attention(q, k, I, Tensor(), p);
  EXPECT_NE(again.to_vector<float>(), probs.to_vector<float>());
}

TEST(Attention, Errors) {
  Tensor q = rt({2, 3, 5, 4}), k = rt({2, 3, 7, 4}), v = rt({2, 3, 7, 6});
  EXPECT_ERROR(NF::scaled_dot_product_attention(rt({3, 5, 4}), k, v),
               "scaled_dot_product_attention", "4-d f32", "[3, 5, 4]");
  EXPECT_ERROR(NF::scaled_dot_product_attention(q, rt({2, 3, 7, 5}), v), "do not agree",
               "[2, 3, 7, 5]");
  EXPECT_ERROR(NF::scaled_dot_product_attention(q, k, rt({2, 3, 6, 6})), "do not agree");
  EXPECT_ERROR(NF::scaled_dot_product_attention(q, k, v, mask_of({2, 1, 5, 6}, 1)), "mask",
               "[2, 1, 5, 6]", "does not broadcast", "[2, 3, 5, 7]");
  EXPECT_ERROR(NF::scaled_dot_product_attention(q, k, v, rt({4, 5, 7})), "bias", "[4, 5, 7]");
  EXPECT_ERROR(NF::scaled_dot_product_attention(q, k, v, Tensor(), 1.0), "dropout_p", "[0, 1)");
  EXPECT_ERROR(NF::scaled_dot_product_attention(q, k, v, Tensor(), 0, false, -1.0), "scale");
  EXPECT_ERROR(NF::scaled_dot_product_attention(q, k, v, iv({1, 2}, {2})), "attn_mask",
               "bool or f32");
}
