// Unit tests of matmul and linear: known values, batched broadcasting, transpose flags, torch's
// 1-d rules, 16-bit inputs, error messages, and gradients against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "core/internal.h"
#include "cstorch/tensor.h"
#include "unit/test_util.h"

using namespace cstorch;
using namespace cstorch::testing;

namespace {

// Host reference of op(A) @ op(B) with broadcast batch dims (A, B rank >= 2).
D ref_matmul(const F& a, const Shape& sa, const F& b, const Shape& sb, bool ta, bool tb,
             Shape* out_shape) {
  const size_t ra = sa.size(), rb = sb.size();
  int64_t m = ta ? sa[ra - 1] : sa[ra - 2], k = ta ? sa[ra - 2] : sa[ra - 1];
  int64_t n = tb ? sb[rb - 2] : sb[rb - 1];
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  size_t nb = std::max(ba.size(), bb.size());
  while (ba.size() < nb) ba.insert(ba.begin(), 1);
  while (bb.size() < nb) bb.insert(bb.begin(), 1);
  Shape bo(nb);
  for (size_t i = 0; i < nb; ++i) bo[i] = std::max(ba[i], bb[i]);
  *out_shape = bo;
  out_shape->push_back(m);
  out_shape->push_back(n);
  D out;
  for (int64_t bi = 0; bi < numel(bo); ++bi) {
    int64_t rem = bi, oa = 0, ob = 0, sta = 1, stb = 1;
    for (int64_t d = static_cast<int64_t>(nb) - 1; d >= 0; --d) {
      int64_t c = rem % bo[d];
      rem /= bo[d];
      if (ba[d] != 1) oa += c * sta;
      if (bb[d] != 1) ob += c * stb;
      sta *= ba[d];
      stb *= bb[d];
    }
    const float* A = a.data() + oa * m * k;
    const float* B = b.data() + ob * k * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t p = 0; p < k; ++p)
          s += static_cast<double>(ta ? A[p * m + i] : A[i * k + p]) *
               (tb ? B[j * k + p] : B[p * n + j]);
        out.push_back(s);
      }
  }
  return out;
}

Tensor mm_flags(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  return detail::dispatch(ir::OpCode::Matmul, ir::MatmulAttrs{ta, tb}, {a, b});
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST(LinalgMatmul, KnownValues2D) {
  Tensor a = from_vector(F{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector(F{7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = matmul(a, b);
  EXPECT_EQ(c.shape(), (Shape{2, 2}));
  EXPECT_EQ(c.to_vector<float>(), (F{58, 64, 139, 154}));
  EXPECT_EQ(c.dtype(), DType::f32);
}

TEST(LinalgMatmul, BatchedBroadcastAndTransposeFlags) {
  struct Case {
    Shape sa, sb;
  };
  // Includes the folded paths (shared B), broadcast A, broadcast batch dims of size 1, many
  // small batches (parallel over batches) and a larger GEMM.
  for (Case cs : {Case{{2, 1, 3, 4}, {5, 4, 2}}, Case{{2, 3, 4}, {4, 5}}, Case{{3, 4}, {2, 4, 5}},
                  Case{{1, 3, 4}, {6, 4, 5}}, Case{{64, 8, 8}, {64, 8, 8}},
                  Case{{2, 1, 4, 3}, {1, 3, 3, 2}}, Case{{70, 130}, {130, 90}}}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        // Swap the stored last two dims for the transposed reads.
        Shape sa = cs.sa, sb = cs.sb;
        if (ta) std::swap(sa[sa.size() - 1], sa[sa.size() - 2]);
        if (tb) std::swap(sb[sb.size() - 1], sb[sb.size() - 2]);
        F av = rvals(numel(sa), -1, 1, 1), bv = rvals(numel(sb), -1, 1, 2);
        Shape want_shape;
        D want = ref_matmul(av, sa, bv, sb, ta, tb, &want_shape);
        Tensor c = mm_flags(from_vector(av, sa), from_vector(bv, sb), ta, tb);
        std::string what =
            shape_str(sa) + (ta ? "^T" : "") + " @ " + shape_str(sb) + (tb ? "^T" : "");
        EXPECT_EQ(c.shape(), want_shape) << what;
        expect_close(c.to_vector<double>(), want, 1e-5, what);
        if (!ta && !tb) {
          Tensor c2 = matmul(from_vector(av, sa), from_vector(bv, sb));
          expect_close(c2.to_vector<double>(), want, 1e-5, what);
        }
      }
  }
}

TEST(LinalgMatmul, OneDimensionalRules) {
  Tensor v = from_vector(F{1, 2, 3}, {3});
  Tensor w = from_vector(F{4, 5, 6}, {3});
  Tensor m = from_vector(F{1, 0, 2, 1, 0, 3}, {3, 2});   // [3, 2]
  Tensor mt = from_vector(F{1, 2, 0, 0, 1, 3}, {2, 3});  // [2, 3]
  Tensor dot = matmul(v, w);
  EXPECT_EQ(dot.shape(), Shape{});
  EXPECT_EQ(dot.item<float>(), 32);
  Tensor vm = matmul(v, m);
  EXPECT_EQ(vm.shape(), (Shape{2}));
  EXPECT_EQ(vm.to_vector<float>(), (F{5, 11}));
  Tensor mv = matmul(mt, v);
  EXPECT_EQ(mv.shape(), (Shape{2}));
  EXPECT_EQ(mv.to_vector<float>(), (F{5, 11}));
  Tensor bm = rt({4, 3, 2});
  Tensor vb = matmul(v, bm);
  EXPECT_EQ(vb.shape(), (Shape{4, 2}));
  Tensor bv = matmul(rt({4, 2, 3}), v);
  EXPECT_EQ(bv.shape(), (Shape{4, 2}));
  Shape s;
  D want =
      ref_matmul(v.to_vector<float>(), {1, 3}, bm.to_vector<float>(), {4, 3, 2}, false, false, &s);
  expect_close(vb.to_vector<double>(), want, 1e-6, "v @ batched");
}

TEST(LinalgMatmul, SixteenBitInputs) {
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor a = rt({2, 5, 7}).to(t), b = rt({7, 3}, 2).to(t);
    Tensor c = matmul(a, b);
    EXPECT_EQ(c.dtype(), t);
    Shape s;
    D want =
        ref_matmul(a.to_vector<float>(), {2, 5, 7}, b.to_vector<float>(), {7, 3}, false, false, &s);
    expect_close(c.to_vector<double>(), want, t == DType::bf16 ? 1e-2 : 2e-3, dtype_name(t));
  }
}

TEST(LinalgMatmul, EmptyDims) {
  Tensor c = matmul(zeros({2, 0}), zeros({0, 3}));
  EXPECT_EQ(c.shape(), (Shape{2, 3}));
  EXPECT_EQ(c.to_vector<float>(), F(6, 0.f));
  EXPECT_EQ(matmul(zeros({0, 4}), zeros({4, 3})).shape(), (Shape{0, 3}));
  EXPECT_EQ(matmul(zeros({3, 0, 4}), zeros({4, 3})).shape(), (Shape{3, 0, 3}));
}

TEST(LinalgMatmul, Errors) {
  EXPECT_ERROR(matmul(zeros({2, 3}), zeros({4, 5})),
               "matmul: shapes [2, 3] and [4, 5] cannot be multiplied (3 != 4)");
  EXPECT_ERROR(matmul(zeros({3}), zeros({4})), "matmul", "[3]", "[4]");
  EXPECT_ERROR(matmul(zeros({2, 2, 3}), zeros({3, 3, 2})), "matmul", "broadcast");
  EXPECT_ERROR(matmul(zeros({2, 3}, DType::i64), zeros({3, 2}, DType::i64)), "matmul", "i64");
  EXPECT_ERROR(matmul(zeros({2, 3}), zeros({3, 2}, DType::bf16)), "matmul", "f32", "bf16");
  EXPECT_ERROR(matmul(scalar_tensor(1), zeros({3})), "matmul", "1-d");
}

// ---------------------------------------------------------------------------------------------
TEST(LinalgLinear, KnownValuesAndShapes) {
  Tensor x = from_vector(F{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor w = from_vector(F{1, 0, 1, 0, 1, 0}, {2, 3});
  Tensor b = from_vector(F{10, 20}, {2});
  EXPECT_EQ(linear(x, w).to_vector<float>(), (F{4, 2, 10, 5}));
  EXPECT_EQ(linear(x, w, b).to_vector<float>(), (F{14, 22, 20, 25}));
  Tensor x1 = from_vector(F{1, 2, 3}, {3});
  EXPECT_EQ(linear(x1, w, b).shape(), (Shape{2}));
  EXPECT_EQ(linear(x1, w, b).to_vector<float>(), (F{14, 22}));
  Tensor x3 = rt({2, 4, 3});
  Tensor y3 = linear(x3, w, b);
  EXPECT_EQ(y3.shape(), (Shape{2, 4, 2}));
  Shape s;
  D want = ref_matmul(x3.to_vector<float>(), {8, 3}, w.to_vector<float>(), {2, 3}, false, true, &s);
  D got = y3.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i] + (i % 2 ? 20 : 10), 1e-5);
  // 16-bit and an empty contraction (the bias alone).
  Tensor yb = linear(x.to(DType::bf16), w.to(DType::bf16), b.to(DType::bf16));
  EXPECT_EQ(yb.dtype(), DType::bf16);
  EXPECT_EQ(yb.to_vector<float>(), (F{14, 22, 20, 25}));
  EXPECT_EQ(linear(zeros({2, 0}), zeros({2, 0}), b).to_vector<float>(), (F{10, 20, 10, 20}));
}

TEST(LinalgLinear, Errors) {
  EXPECT_ERROR(linear(zeros({4, 3}), zeros({5, 6})), "linear", "[4, 3]", "[5, 6]");
  EXPECT_ERROR(linear(zeros({4, 3}), zeros({3})), "linear", "weight");
  EXPECT_ERROR(linear(zeros({4, 3}), zeros({5, 3}), zeros({4})), "linear", "bias");
  EXPECT_ERROR(linear(zeros({4, 3}, DType::i32), zeros({5, 3}, DType::i32)), "linear", "i32");
  EXPECT_ERROR(linear(zeros({4, 3}), zeros({5, 3}, DType::f16)), "linear", "f16");
}

// ---------------------------------------------------------------------------------------------
TEST(LinalgGrad, Matmul) {
  auto f = [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); };
  check_grad(f, {rt({3, 4}), rt({4, 2}, 2)});
  check_grad(f, {rt({2, 1, 3, 4}), rt({5, 4, 2}, 2)});  // broadcast batch: sum_to
  check_grad(f, {rt({3, 4}), rt({2, 4, 2}, 2)});
  check_grad(f, {rt({2, 2, 3, 4}), rt({4, 2}, 2)});  // shared 2-d B: folded weight gradient
  check_grad(f, {rt({4}), rt({4}, 2)});
  check_grad(f, {rt({4}), rt({2, 4, 3}, 2)});
  check_grad(f, {rt({2, 3, 4}), rt({4}, 2)});
}

TEST(LinalgGrad, MatmulTransposeFlags) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      Shape sa = ta ? Shape{2, 4, 3} : Shape{2, 3, 4};
      Shape sb = tb ? Shape{5, 4} : Shape{4, 5};
      if (ta) sb.insert(sb.begin(), 2);  // exercise a batched B with transposed reads too
      check_grad([&](const std::vector<Tensor>& v) { return mm_flags(v[0], v[1], ta, tb); },
                 {rt(sa), rt(sb, 2)});
    }
}

TEST(LinalgGrad, Linear) {
  auto fb = [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); };
  auto fn = [](const std::vector<Tensor>& v) { return linear(v[0], v[1]); };
  check_grad(fb, {rt({4, 3}), rt({2, 3}, 2), rt({2}, 3)});
  check_grad(fb, {rt({2, 3, 3}), rt({2, 3}, 2), rt({2}, 3)});
  check_grad(fb, {rt({3}), rt({2, 3}, 2), rt({2}, 3)});
  check_grad(fn, {rt({4, 3}), rt({5, 3}, 2)});
}
