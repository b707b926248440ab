// Unit tests of the shape and indexing ops: known values per dtype, edge cases (negative dims,
// size-0 dims, 0-d tensors, empty slices), error messages, and gradients.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>

#include "cstorch/runtime.h"
#include "cstorch/tensor.h"
#include "unit/test_util.h"

using namespace cstorch;
using namespace cstorch::testing;

namespace {

// 0, 1, 2, ... in row-major order, of any dtype (exact in bf16 up to 256).
Tensor iota(Shape s, DType t) {
  return arange(0, static_cast<double>(numel(s)), 1, t).reshape(s);
}
Tensor iota_f(Shape s) {
  return iota(s, DType::f32);
}
Tensor iota_i(Shape s) {
  return iota(s, DType::i64);
}

I range_i(int64_t n) {
  I v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

Shape strides_of(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (int64_t d = static_cast<int64_t>(s.size()) - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

I naive_permute(const I& x, const Shape& s, const I& p) {
  Shape os(p.size());
  for (size_t k = 0; k < p.size(); ++k) os[k] = s[p[k]];
  Shape ist = strides_of(s);
  I out(static_cast<size_t>(numel(os)));
  for (int64_t o = 0; o < numel(os); ++o) {
    int64_t rem = o, off = 0;
    for (int64_t k = static_cast<int64_t>(os.size()) - 1; k >= 0; --k) {
      off += (rem % os[k]) * ist[p[k]];
      rem /= os[k];
    }
    out[o] = x[off];
  }
  return out;
}

I naive_expand(const I& x, const Shape& s, const Shape& os) {
  int64_t lead = static_cast<int64_t>(os.size() - s.size());
  Shape ist = strides_of(s);
  I out(static_cast<size_t>(numel(os)));
  for (int64_t o = 0; o < numel(os); ++o) {
    int64_t rem = o, off = 0;
    for (int64_t k = static_cast<int64_t>(os.size()) - 1; k >= 0; --k) {
      int64_t c = rem % os[k];
      rem /= os[k];
      if (k >= lead && s[k - lead] != 1) off += c * ist[k - lead];
    }
    out[o] = x[off];
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
TEST(ShapeReshape, ValuesAndInferredDim) {
  auto a = iota_f({2, 3});
  auto r = reshape(a, {3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_EQ(r.to_vector<float>(), (F{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(a.reshape({-1}).shape(), (Shape{6}));
  EXPECT_EQ(a.view({1, 6, 1}).shape(), (Shape{1, 6, 1}));
  // Eager reshape aliases the input's storage.
  EXPECT_EQ(r.data_ptr(), a.data_ptr());
  // Same shape: the input itself, no new node.
  EXPECT_EQ(reshape(a, {2, 3}).impl(), a.impl());
  EXPECT_EQ(reshape(a, {2, -1}).impl(), a.impl());
}

TEST(ShapeReshape, DTypesZeroDAndEmpty) {
  EXPECT_EQ(iota_i({2, 2}).reshape({4}).to_vector<int64_t>(), (I{0, 1, 2, 3}));
  EXPECT_EQ(bv({1, 0, 1, 1}, {4}).reshape({2, 2}).to_vector<uint8_t>(), (B{1, 0, 1, 1}));
  auto s = scalar_tensor(7);
  EXPECT_EQ(s.reshape({1, 1}).shape(), (Shape{1, 1}));
  EXPECT_EQ(s.reshape({-1}).shape(), (Shape{1}));
  EXPECT_EQ(fv({3}, {1, 1}).reshape({}).item<float>(), 3.f);
  auto e = zeros({0, 3});
  EXPECT_EQ(e.reshape({3, 0}).shape(), (Shape{3, 0}));
  EXPECT_EQ(e.reshape({-1, 3}).shape(), (Shape{0, 3}));
}

TEST(ShapeReshape, Errors) {
  auto a = zeros({2, 3});
  EXPECT_ERROR(reshape(a, {4, -1}),
               "reshape: cannot reshape a tensor of shape [2, 3] (6 elements) into [4, -1]");
  EXPECT_ERROR(reshape(a, {4, 2}), "reshape", "[2, 3]", "[4, 2]");
  EXPECT_ERROR(reshape(a, {-1, -1}), "reshape", "only one");
  EXPECT_ERROR(reshape(a, {-2, -3}), "reshape", "invalid");
  EXPECT_ERROR(reshape(zeros({0, 3}), {-1, 0}), "reshape", "ambiguous");
}

// ---------------------------------------------------------------------------------------------
TEST(ShapePermute, TransposeValues) {
  auto a = iota_f({2, 3});
  auto t = transpose(a, 0, 1);
  EXPECT_EQ(t.shape(), (Shape{3, 2}));
  EXPECT_EQ(t.to_vector<float>(), (F{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(a.t().to_vector<float>(), (F{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(transpose(a, -1, -2).to_vector<float>(), (F{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(transpose(a, 1, 1).impl(), a.impl());
  EXPECT_EQ(permute(a, {0, 1}).impl(), a.impl());
  EXPECT_EQ(permute(a, {-2, -1}).impl(), a.impl());
  auto s = scalar_tensor(1);
  EXPECT_EQ(transpose(s, 0, -1).impl(), s.impl());
  EXPECT_EQ(permute(s, {}).impl(), s.impl());
}

TEST(ShapePermute, AllPermutationsOf4D) {
  // Shapes with size-1 dims exercise the dim collapsing; the permutations hit every kernel
  // path (block copy, batched transpose, general walk).
  for (Shape s : {Shape{2, 3, 4, 5}, Shape{3, 1, 4, 2}, Shape{1, 5, 1, 3}, Shape{2, 2, 2, 2}}) {
    I x = range_i(numel(s));
    I p = {0, 1, 2, 3};
    do {
      I want = naive_permute(x, s, p);
      for (DType t : {DType::i64, DType::f32, DType::bf16, DType::i32}) {
        auto out = permute(iota(s, t), p);
        EXPECT_EQ(out.dtype(), t);
        EXPECT_EQ(out.to_vector<int64_t>(), want)
            << shape_str(s) << " perm " << shape_str(p) << " " << dtype_name(t);
      }
    } while (std::next_permutation(p.begin(), p.end()));
  }
}

TEST(ShapePermute, LargeTransposesAndBool) {
  // Sizes that are not multiples of the tile, and big enough to run in parallel.
  for (Shape s : {Shape{67, 45}, Shape{3, 129, 257}, Shape{600, 700}}) {
    I x = range_i(numel(s));
    I p(s.size());
    std::iota(p.begin(), p.end(), 0);
    std::swap(p[p.size() - 1], p[p.size() - 2]);
    EXPECT_EQ(permute(iv(x, s), p).to_vector<int64_t>(), naive_permute(x, s, p)) << shape_str(s);
  }
  Shape s{16, 64, 8, 32};
  I x = range_i(numel(s));
  for (I p : {I{0, 2, 1, 3}, I{3, 1, 2, 0}, I{2, 0, 3, 1}})
    EXPECT_EQ(permute(iv(x, s), p).to_vector<int64_t>(), naive_permute(x, s, p));
  auto b = bv({1, 0, 0, 1, 1, 0}, {2, 3});
  EXPECT_EQ(b.t().to_vector<uint8_t>(), (B{1, 1, 0, 1, 0, 0}));
  EXPECT_EQ(permute(zeros({0, 3, 2}), {2, 0, 1}).shape(), (Shape{2, 0, 3}));
}

TEST(ShapePermute, Errors) {
  auto a = zeros({2, 3});
  EXPECT_ERROR(permute(a, {0, 0}), "permute: [0, 0] is not a permutation of 2 dims");
  EXPECT_ERROR(permute(a, {0}), "permute", "[0]", "2 dims");
  EXPECT_ERROR(permute(a, {0, 2}), "permute");
  EXPECT_ERROR(transpose(a, 0, 2), "transpose", "dim 2");
  EXPECT_ERROR(transpose(zeros({3}), 0, 1), "transpose");
}

// ---------------------------------------------------------------------------------------------
TEST(ShapeExpand, Values) {
  EXPECT_EQ(fv({1, 2, 3}, {3, 1}).expand({3, 2}).to_vector<float>(), (F{1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(fv({1, 2, 3}, {3}).expand({2, 3}).to_vector<float>(), (F{1, 2, 3, 1, 2, 3}));
  EXPECT_EQ(fv({1, 2}, {2, 1}).expand({-1, 2}).to_vector<float>(), (F{1, 1, 2, 2}));
  EXPECT_EQ(scalar_tensor(5, DType::i64).expand({2, 2}).to_vector<int64_t>(), (I{5, 5, 5, 5}));
  EXPECT_EQ(bv({1, 0}, {1, 2}).expand({2, 2}).to_vector<uint8_t>(), (B{1, 0, 1, 0}));
  EXPECT_EQ(broadcast_to(fv({4}, {1}), {3}).to_vector<float>(), (F{4, 4, 4}));
  EXPECT_EQ(zeros({0, 1}).expand({0, 3}).shape(), (Shape{0, 3}));
  EXPECT_EQ(zeros({1}).expand({4, 0, 1}).shape(), (Shape{4, 0, 1}));
  auto a = zeros({2, 3});
  EXPECT_EQ(expand(a, {2, 3}).impl(), a.impl());
  EXPECT_EQ(expand(a, {-1, -1}).impl(), a.impl());
}

TEST(ShapeExpand, AgainstNaive) {
  std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 1, 3, 1}, {4, 2, 5, 3, 6}}, {{1, 1}, {7, 9}},
      {{3, 1, 1}, {3, 4, 5}},          {{1, 4}, {300, 4}},
      {{5, 1, 7}, {5, 3, 7}},          {{1, 2, 1, 2}, {2, 2, 3, 2}},
      {{256, 1}, {256, 300}},          {{1, 300}, {2, 256, 300}}};
  for (auto& [s, os] : cases) {
    I x = range_i(numel(s));
    for (DType t : {DType::i64, DType::f16, DType::i32}) {
      auto out = iota(s, t).expand(os);
      EXPECT_EQ(out.to_vector<int64_t>(), naive_expand(x, s, os))
          << shape_str(s) << " -> " << shape_str(os) << " " << dtype_name(t);
    }
  }
}

TEST(ShapeExpand, Errors) {
  EXPECT_ERROR(zeros({2, 3}).expand({4, 3}), "expand", "[2, 3]", "[4, 3]");
  EXPECT_ERROR(zeros({2, 3}).expand({3}), "expand", "fewer dims");
  EXPECT_ERROR(zeros({3}).expand({-1, 3}), "expand", "leading");
  EXPECT_ERROR(broadcast_to(zeros({2}), {3}), "expand");
}

// ---------------------------------------------------------------------------------------------
TEST(ShapeSqueeze, SqueezeUnsqueezeFlatten) {
  auto a = zeros({1, 3, 1, 2});
  EXPECT_EQ(squeeze(a).shape(), (Shape{3, 2}));
  EXPECT_EQ(squeeze(a, 2).shape(), (Shape{1, 3, 2}));
  EXPECT_EQ(squeeze(a, -4).shape(), (Shape{3, 1, 2}));
  EXPECT_EQ(squeeze(a, 1).impl(), a.impl());  // a non-1 dim is left alone
  EXPECT_EQ(squeeze(zeros({1, 1})).shape(), (Shape{}));
  auto s = scalar_tensor(2);
  EXPECT_EQ(squeeze(s).impl(), s.impl());
  EXPECT_EQ(squeeze(s, 0).impl(), s.impl());
  EXPECT_EQ(unsqueeze(s, 0).shape(), (Shape{1}));
  EXPECT_EQ(unsqueeze(zeros({2, 3}), -1).shape(), (Shape{2, 3, 1}));
  EXPECT_EQ(unsqueeze(zeros({2, 3}), 1).shape(), (Shape{2, 1, 3}));
  EXPECT_EQ(unsqueeze(zeros({2, 3}), -3).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(iota_f({2, 2}).unsqueeze(0).to_vector<float>(), (F{0, 1, 2, 3}));
  EXPECT_ERROR(unsqueeze(zeros({2, 3}), 3), "unsqueeze");
  EXPECT_ERROR(squeeze(zeros({2, 3}), 2), "squeeze");

  auto f = zeros({2, 3, 4, 5});
  EXPECT_EQ(flatten(f).shape(), (Shape{120}));
  EXPECT_EQ(flatten(f, 1).shape(), (Shape{2, 60}));
  EXPECT_EQ(flatten(f, 1, 2).shape(), (Shape{2, 12, 5}));
  EXPECT_EQ(f.flatten(-2).shape(), (Shape{2, 3, 20}));
  EXPECT_EQ(flatten(f, 2, 2).impl(), f.impl());
  EXPECT_EQ(flatten(s).shape(), (Shape{1}));
  EXPECT_ERROR(flatten(f, 2, 1), "flatten");
}

// ---------------------------------------------------------------------------------------------
TEST(ShapeSlice, PythonBounds) {
  auto a = iota_i({6});
  auto v = [&](int64_t b, int64_t e, int64_t st = 1) {
    return slice(a, 0, b, e, st).to_vector<int64_t>();
  };
  EXPECT_EQ(v(1, 4), (I{1, 2, 3}));
  EXPECT_EQ(v(-2, 6), (I{4, 5}));
  EXPECT_EQ(v(-100, 2), (I{0, 1}));
  EXPECT_EQ(v(4, 100), (I{4, 5}));
  EXPECT_EQ(v(1, -1), (I{1, 2, 3, 4}));
  EXPECT_EQ(v(0, 6, 2), (I{0, 2, 4}));
  EXPECT_EQ(v(1, 6, 2), (I{1, 3, 5}));
  EXPECT_EQ(v(0, 100, 4), (I{0, 4}));
  EXPECT_EQ(v(5, 6, 3), (I{5}));
  EXPECT_EQ(v(4, 2), I{});
  EXPECT_EQ(v(7, 9), I{});
  EXPECT_EQ(slice(a, 0, 4, 2).shape(), (Shape{0}));
  EXPECT_EQ(slice(a, 0, 0, 6).impl(), a.impl());
  EXPECT_EQ(slice(a, -1, -100, 100).impl(), a.impl());
}

TEST(ShapeSlice, DimsAndDTypes) {
  auto a = iota_f({2, 3, 4});
  EXPECT_EQ(slice(a, 1, 1, 3).to_vector<float>(),
            (F{4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23}));
  EXPECT_EQ(slice(a, -1, 1, 4, 2).to_vector<float>(),
            (F{1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}));
  EXPECT_EQ(slice(a, 1, 0, 3, 2).to_vector<float>(),
            (F{0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 22, 23}));
  EXPECT_EQ(slice(a, 0, 1, 2).shape(), (Shape{1, 3, 4}));
  EXPECT_EQ(slice(bv({1, 0, 1, 0}, {2, 2}), 1, 0, 1).to_vector<uint8_t>(), (B{1, 1}));
  EXPECT_EQ(slice(iota({3, 2}, DType::bf16), 0, 2, 3).to_vector<float>(), (F{4, 5}));
  EXPECT_EQ(slice(zeros({0, 4}), 1, 1, 3).shape(), (Shape{0, 2}));
  EXPECT_EQ(slice(a, 2, 3, 1).shape(), (Shape{2, 3, 0}));
  // Large enough to run in parallel.
  auto big = iota_i({512, 300});
  auto sl = slice(big, 1, 10, 290, 7).to_vector<int64_t>();
  ASSERT_EQ(sl.size(), 512u * 40u);
  EXPECT_EQ(sl[0], 10);
  EXPECT_EQ(sl[39], 10 + 39 * 7);
  EXPECT_EQ(sl[40 * 511 + 5], 300 * 511 + 10 + 5 * 7);
  auto rows = slice(big, 0, 100, 400, 3).to_vector<int64_t>();
  EXPECT_EQ(rows[300 * 99 + 1], 300 * (100 + 99 * 3) + 1);
}

TEST(ShapeSlice, Errors) {
  EXPECT_ERROR(slice(zeros({3}), 0, 0, 2, 0), "slice", "step");
  EXPECT_ERROR(slice(zeros({3}), 0, 0, 2, -1), "slice", "step");
  EXPECT_ERROR(slice(scalar_tensor(1), 0, 0, 1), "slice", "0-d");
  EXPECT_ERROR(slice(zeros({3}), 1, 0, 1), "slice", "dim 1");
}

TEST(ShapeSlice, Split) {
  auto a = iota_i({5, 2});
  auto p = split(a, 2);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].to_vector<int64_t>(), (I{0, 1, 2, 3}));
  EXPECT_EQ(p[2].shape(), (Shape{1, 2}));
  EXPECT_EQ(p[2].to_vector<int64_t>(), (I{8, 9}));
  auto q = split(a, {1, 0, 4}, 0);
  ASSERT_EQ(q.size(), 3u);
  EXPECT_EQ(q[1].shape(), (Shape{0, 2}));
  EXPECT_EQ(q[2].shape(), (Shape{4, 2}));
  auto c = split(a, 1, -1);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[1].to_vector<int64_t>(), (I{1, 3, 5, 7, 9}));
  EXPECT_EQ(split(a, 10)[0].impl(), a.impl());
  EXPECT_EQ(split(zeros({0}), 3).size(), 1u);
  EXPECT_ERROR(split(a, {2, 2}), "split", "sum to 4", "size 5");
  EXPECT_ERROR(split(a, 0), "split");
}

// ---------------------------------------------------------------------------------------------
TEST(ShapeCat, Values) {
  auto a = iota_f({2, 2}), b = fv({10, 11}, {1, 2});
  EXPECT_EQ(cat({a, b}).to_vector<float>(), (F{0, 1, 2, 3, 10, 11}));
  EXPECT_EQ(cat({a, b.t()}, 1).to_vector<float>(), (F{0, 1, 10, 2, 3, 11}));
  EXPECT_EQ(cat({a, b.t(), a}, -1).shape(), (Shape{2, 5}));
  EXPECT_EQ(cat({a, b.t(), a}, -1).to_vector<float>(), (F{0, 1, 10, 0, 1, 2, 3, 11, 2, 3}));
  EXPECT_EQ(cat({a}).impl(), a.impl());
  EXPECT_EQ(cat({zeros({0, 2}), a, zeros({0, 2})}).to_vector<float>(), (F{0, 1, 2, 3}));
  EXPECT_EQ(cat({zeros({0}), a}).shape(), (Shape{2, 2}));  // PyTorch's legacy skip of [0]
  EXPECT_EQ(cat({iota_i({2}), iota_i({3})}).to_vector<int64_t>(), (I{0, 1, 0, 1, 2}));
  EXPECT_EQ(cat({bv({1}, {1}), bv({0, 1}, {2})}).to_vector<uint8_t>(), (B{1, 0, 1}));
  EXPECT_EQ(cat({iota({2, 1}, DType::f16), iota({2, 1}, DType::f16)}, 1).to_vector<float>(),
            (F{0, 0, 1, 1}));
  // Many inputs along an inner dim, large enough to run in parallel.
  std::vector<Tensor> parts;
  for (int k = 0; k < 70; ++k) parts.push_back(full({300, 1, 3}, k, DType::i64));
  auto big = cat(parts, 1).to_vector<int64_t>();
  ASSERT_EQ(big.size(), 300u * 70u * 3u);
  EXPECT_EQ(big[70 * 3 * 299 + 3 * 69 + 2], 69);
  EXPECT_EQ(big[70 * 3 * 17 + 3 * 5 + 1], 5);
}

TEST(ShapeCat, StackAndErrors) {
  auto a = fv({1, 2}, {2}), b = fv({3, 4}, {2});
  EXPECT_EQ(stack({a, b}).shape(), (Shape{2, 2}));
  EXPECT_EQ(stack({a, b}).to_vector<float>(), (F{1, 2, 3, 4}));
  EXPECT_EQ(stack({a, b}, 1).to_vector<float>(), (F{1, 3, 2, 4}));
  EXPECT_EQ(stack({a, b}, -1).to_vector<float>(), (F{1, 3, 2, 4}));
  EXPECT_EQ(stack({scalar_tensor(1), scalar_tensor(2)}).to_vector<float>(), (F{1, 2}));
  EXPECT_EQ(stack({a}).shape(), (Shape{1, 2}));
  EXPECT_ERROR(stack({a, zeros({3})}), "stack", "[2]", "[3]");
  EXPECT_ERROR(cat({zeros({2, 3}), zeros({3, 3})}, 1),
               "cat: tensors must have the same shape except in dim 1; got [2, 3] and [3, 3]");
  EXPECT_ERROR(cat({zeros({2, 3}), zeros({3})}), "cat", "[2, 3]", "[3]");
  EXPECT_ERROR(cat({scalar_tensor(1), scalar_tensor(2)}), "cat", "zero-dimensional");
  EXPECT_ERROR(cat({}), "cat", "non-empty");
  EXPECT_ERROR(cat({zeros({2}), zeros({2})}, 1), "cat", "dim 1");
}

TEST(ShapeCat, PromotesDTypes) {
  auto c = cat({iota_i({2}), fv({0.5f}, {1})});
  EXPECT_EQ(c.dtype(), DType::f32);
  EXPECT_EQ(c.to_vector<float>(), (F{0, 1, 0.5f}));
}

// ---------------------------------------------------------------------------------------------
TEST(ShapeIndex, IndexSelect) {
  auto w = iota_f({4, 3});
  auto e = index_select(w, 0, iv({3, 0, 3}, {3}));
  EXPECT_EQ(e.shape(), (Shape{3, 3}));
  EXPECT_EQ(e.to_vector<float>(), (F{9, 10, 11, 0, 1, 2, 9, 10, 11}));
  auto c = index_select(w, -1, from_vector(std::vector<int32_t>{2, 0}, {2}));
  EXPECT_EQ(c.to_vector<float>(), (F{2, 0, 5, 3, 8, 6, 11, 9}));
  EXPECT_EQ(index_select(w, 0, iv({}, {0})).shape(), (Shape{0, 3}));
  EXPECT_EQ(index_select(w, 1, iv({1}, {})).shape(), (Shape{4, 1}));  // a 0-d index
  EXPECT_EQ(index_select(iota_i({3}), 0, iv({2, 2}, {2})).to_vector<int64_t>(), (I{2, 2}));
  EXPECT_EQ(index_select(bv({0, 1}, {2}), 0, iv({1, 0}, {2})).to_vector<uint8_t>(), (B{1, 0}));
  auto s = index_select(scalar_tensor(4), 0, iv({0}, {1}));
  EXPECT_EQ(s.shape(), Shape{});
  EXPECT_EQ(s.item<float>(), 4.f);
  // Embedding-sized lookup, parallel.
  auto table = iota_i({1000, 64});
  I ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7919) % 1000);
  auto got = index_select(table, 0, iv(ids, {4096})).to_vector<int64_t>();
  EXPECT_EQ(got[64 * 4095 + 63], ids[4095] * 64 + 63);
  EXPECT_EQ(got[64 * 1234 + 5], ids[1234] * 64 + 5);
}

TEST(ShapeIndex, IndexSelectErrors) {
  auto w = zeros({3, 2});
  EXPECT_ERROR(index_select(w, 0, iv({0, 5}, {2})).to_vector<float>(), "index_select", "index 5",
               "size 3", "[0, 3)");
  EXPECT_ERROR(index_select(w, 0, iv({-1}, {1})), "index_select", "index -1");
  EXPECT_ERROR(index_select(w, 0, fv({0}, {1})), "index_select", "i32 or i64", "f32");
  EXPECT_ERROR(index_select(w, 0, iv({0, 1}, {1, 2})), "index_select", "1-d");
  EXPECT_ERROR(index_select(w, 2, iv({0}, {1})), "index_select", "dim 2");
}

TEST(ShapeIndex, IndexAdd) {
  auto a = zeros({3, 2});
  auto r = index_add(a, 0, iv({2, 0, 2}, {3}), fv({1, 2, 3, 4, 5, 6}, {3, 2}));
  EXPECT_EQ(r.to_vector<float>(), (F{3, 4, 0, 0, 6, 8}));  // duplicates accumulate
  auto c = index_add(iota_i({2, 3}), 1, iv({0, 0}, {2}), iv({1, 10, 100, 1000}, {2, 2}));
  EXPECT_EQ(c.to_vector<int64_t>(), (I{11, 1, 2, 1103, 4, 5}));
  auto b = index_add(bv({0, 0, 1}, {3}), 0, iv({1}, {1}), bv({1}, {1}));
  EXPECT_EQ(b.to_vector<uint8_t>(), (B{0, 1, 1}));
  auto h = index_add(full({2}, 1, DType::bf16), 0, iv({1}, {1}), full({1}, 0.5, DType::bf16));
  EXPECT_EQ(h.to_vector<float>(), (F{1, 1.5f}));
  // Parallel over columns with many duplicates.
  I ids(2000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i % 10);
  auto big = index_add(zeros({10, 100}), 0, iv(ids, {2000}), ones({2000, 100})).to_vector<float>();
  EXPECT_EQ(big, F(1000, 200.f));
  EXPECT_ERROR(index_add(a, 0, iv({3}, {1}), zeros({1, 2})).to_vector<float>(), "index_add",
               "index 3");
  EXPECT_ERROR(index_add(a, 0, iv({0}, {1}), zeros({2, 2})), "index_add", "[1, 2]", "[2, 2]");
  EXPECT_ERROR(index_add(a, 0, iv({0}, {1}), zeros({1, 2}, DType::i64)), "index_add", "dtype");
}

TEST(ShapeIndex, Gather) {
  auto t = fv({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(gather(t, 1, iv({0, 0, 1, 0}, {2, 2})).to_vector<float>(), (F{1, 1, 4, 3}));
  EXPECT_EQ(gather(t, 0, iv({1, 0, 0, 0}, {2, 2})).to_vector<float>(), (F{3, 2, 1, 2}));
  auto a = iota_i({3, 4});
  auto g = gather(a, -1, iv({3, 1}, {2, 1}));  // index smaller than the tensor
  EXPECT_EQ(g.shape(), (Shape{2, 1}));
  EXPECT_EQ(g.to_vector<int64_t>(), (I{3, 5}));
  EXPECT_EQ(gather(a, 0, iv({2, 2, 2, 2}, {1, 4})).to_vector<int64_t>(), (I{8, 9, 10, 11}));
  EXPECT_EQ(gather(scalar_tensor(3), 0, iv({0}, {})).item<float>(), 3.f);
  EXPECT_EQ(gather(bv({0, 1}, {2}), 0, iv({1, 1, 0}, {3})).to_vector<uint8_t>(), (B{1, 1, 0}));
  EXPECT_EQ(gather(a, 1, iv({}, {3, 0})).shape(), (Shape{3, 0}));
  EXPECT_ERROR(gather(a, 1, iv({4}, {1, 1})).to_vector<int64_t>(), "gather", "index 4", "[0, 4)");
  EXPECT_ERROR(gather(a, 1, iv({0}, {1})), "gather", "same number of dims");
  EXPECT_ERROR(gather(a, 1, iv({0, 0, 0, 0}, {4, 1})), "gather", "[4, 1]", "[3, 4]");
  EXPECT_ERROR(gather(a, 1, fv({0}, {1, 1})), "gather", "i32 or i64");
}

TEST(ShapeIndex, ScatterAdd) {
  // The example of torch.Tensor.scatter_add_.
  auto src = ones({2, 5});
  auto index = iv({0, 1, 2, 0, 0, 0, 1, 2, 2, 2}, {2, 5});
  EXPECT_EQ(scatter_add(zeros({3, 5}), 0, index, src).to_vector<float>(),
            (F{2, 0, 0, 1, 1, 0, 2, 0, 0, 0, 0, 0, 2, 1, 1}));
  // Index smaller than src: only the covered part of src is added.
  auto r = scatter_add(iota_i({2, 3}), 1, iv({2, 2}, {2, 1}), iv({10, 20, 30, 40, 50, 60}, {2, 3}));
  EXPECT_EQ(r.to_vector<int64_t>(), (I{0, 1, 12, 3, 4, 45}));
  auto b = scatter_add(bv({0, 0}, {2}), 0, iv({1, 1}, {2}), bv({1, 0}, {2}));
  EXPECT_EQ(b.to_vector<uint8_t>(), (B{0, 1}));
  // Parallel over the dims before `dim`, with duplicates along it.
  I idx(300 * 50);
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i % 5);
  auto big =
      scatter_add(zeros({300, 5}), 1, iv(idx, {300, 50}), ones({300, 50})).to_vector<float>();
  EXPECT_EQ(big, F(1500, 10.f));
  EXPECT_ERROR(scatter_add(zeros({2}), 0, iv({2}, {1}), ones({1})).to_vector<float>(),
               "scatter_add", "index 2", "[0, 2)");
  EXPECT_ERROR(scatter_add(zeros({2}), 0, iv({0, 1}, {2}), ones({1})), "scatter_add", "src");
  EXPECT_ERROR(scatter_add(zeros({2}), 0, iv({0}, {1}), ones({1}, DType::i64)), "scatter_add",
               "dtype");
}

// ---------------------------------------------------------------------------------------------
TEST(ShapeTri, TriuTril) {
  auto a = ones({3, 4}, DType::i64);
  EXPECT_EQ(triu(a).to_vector<int64_t>(), (I{1, 1, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1}));
  EXPECT_EQ(tril(a).to_vector<int64_t>(), (I{1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0}));
  EXPECT_EQ(triu(a, 1).to_vector<int64_t>(), (I{0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1}));
  EXPECT_EQ(tril(a, -1).to_vector<int64_t>(), (I{0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0}));
  EXPECT_EQ(tril(a, 10).to_vector<int64_t>(), I(12, 1));
  EXPECT_EQ(triu(a, -10).to_vector<int64_t>(), I(12, 1));
  EXPECT_EQ(triu(a, 10).to_vector<int64_t>(), I(12, 0));
  auto m = tril(ones({2, 2, 2}, DType::boolean)).to_vector<uint8_t>();
  EXPECT_EQ(m, (B{1, 0, 1, 1, 1, 0, 1, 1}));
  EXPECT_EQ(triu(iota_f({2, 2})).to_vector<float>(), (F{0, 1, 0, 3}));
  EXPECT_EQ(tril(zeros({0, 3})).shape(), (Shape{0, 3}));
  EXPECT_ERROR(triu(zeros({3})), "triu", "at least 2 dims");
  EXPECT_ERROR(tril(scalar_tensor(1)), "tril");
}

// ---------------------------------------------------------------------------------------------
TEST(ShapeMisc, SumToAndMaskedFill) {
  auto a = iota_f({2, 3});
  EXPECT_EQ(sum_to(a, {2, 3}).impl(), a.impl());
  EXPECT_ERROR(sum_to(a, {1, 2, 3}), "sum_to");
  EXPECT_ERROR(masked_fill(a, zeros({2, 3}), 1), "masked_fill", "bool");
  EXPECT_EQ(sum_to(a, {3}).to_vector<float>(), (F{3, 5, 7}));
  EXPECT_EQ(sum_to(a, {1, 3}).to_vector<float>(), (F{3, 5, 7}));
  EXPECT_EQ(sum_to(a, {2, 1}).to_vector<float>(), (F{3, 12}));
  EXPECT_EQ(sum_to(a, {}).item<float>(), 15.f);
  EXPECT_EQ(sum_to(a, {1}).to_vector<float>(), (F{15}));
  EXPECT_EQ(sum_to(zeros({2, 0}), {2, 1}).to_vector<float>(), (F{0, 0}));
  EXPECT_ERROR(sum_to(a, {2}), "sum_to", "[2, 3]", "[2]");
  auto mf = masked_fill(a, bv({1, 0, 1}, {3}), -1);
  EXPECT_EQ(mf.to_vector<float>(), (F{-1, 1, -1, -1, 4, -1}));
  EXPECT_EQ(masked_fill(iota_i({2}), bv({0, 1}, {2}), 7).to_vector<int64_t>(), (I{0, 7}));
  EXPECT_EQ(masked_fill(iota_i({2}), bv({0, 1}, {2}), 7).dtype(), DType::i64);
  EXPECT_ERROR(masked_fill(a, bv({1, 0}, {2}), 1), "masked_fill", "[2, 3]", "[2]");
}

// ---------------------------------------------------------------------------------------------
// Gradients on small hand-checkable cases; `g` is explicit so each rule is seen directly.

TEST(ShapeGrad, ReshapePermute) {
  auto x = iota_f({2, 3}).set_requires_grad();
  reshape(x, {3, 2}).backward(fv({1, 2, 3, 4, 5, 6}, {3, 2}));
  EXPECT_EQ(x.grad().shape(), (Shape{2, 3}));
  EXPECT_EQ(x.grad().to_vector<float>(), (F{1, 2, 3, 4, 5, 6}));
  auto y = iota_f({2, 3}).set_requires_grad();
  y.t().backward(fv({1, 2, 3, 4, 5, 6}, {3, 2}));  // g^T
  EXPECT_EQ(y.grad().to_vector<float>(), (F{1, 3, 5, 2, 4, 6}));
  auto z = iota_f({1, 2, 3}).set_requires_grad();
  auto gz = iota_f({3, 1, 2});
  permute(z, {2, 0, 1}).backward(gz);
  EXPECT_EQ(z.grad().to_vector<float>(), (F{0, 2, 4, 1, 3, 5}));  // z.grad[0,i,k] = gz[k,0,i]
}

TEST(ShapeGrad, SliceAndCat) {
  auto x = iota_f({5}).set_requires_grad();
  slice(x, 0, 1, 3).backward(fv({7, 8}, {2}));
  EXPECT_EQ(x.grad().to_vector<float>(), (F{0, 7, 8, 0, 0}));
  auto y = iota_f({2, 5}).set_requires_grad();
  slice(y, 1, 0, 5, 2).backward(fv({1, 2, 3, 4, 5, 6}, {2, 3}));
  EXPECT_EQ(y.grad().to_vector<float>(), (F{1, 0, 2, 0, 3, 4, 0, 5, 0, 6}));
  auto w = iota_f({4}).set_requires_grad();
  slice(w, 0, 3, 4).backward(fv({9}, {1}));
  EXPECT_EQ(w.grad().to_vector<float>(), (F{0, 0, 0, 9}));

  auto a = zeros({2, 1}).set_requires_grad();
  auto b = zeros({2, 2}).set_requires_grad();
  auto c = zeros({2, 1});  // no grad wanted
  cat({a, b, c}, 1).backward(iota_f({2, 4}));
  EXPECT_EQ(a.grad().to_vector<float>(), (F{0, 4}));
  EXPECT_EQ(b.grad().to_vector<float>(), (F{1, 2, 5, 6}));
  EXPECT_FALSE(c.grad().defined());
  auto s0 = fv({1}, {1}).set_requires_grad();
  auto s1 = fv({2}, {1}).set_requires_grad();
  stack({s0, s1}).backward(fv({3, 4}, {2, 1}));
  EXPECT_EQ(s0.grad().to_vector<float>(), (F{3}));
  EXPECT_EQ(s1.grad().to_vector<float>(), (F{4}));
  auto sp = iota_f({3}).set_requires_grad();
  split(sp, 2)[1].backward(fv({5}, {1}));
  EXPECT_EQ(sp.grad().to_vector<float>(), (F{0, 0, 5}));
}

TEST(ShapeGrad, Indexing) {
  auto w = zeros({3, 2}).set_requires_grad();  // embedding backward: duplicates accumulate
  index_select(w, 0, iv({2, 0, 2}, {3})).backward(fv({1, 2, 3, 4, 5, 6}, {3, 2}));
  EXPECT_EQ(w.grad().to_vector<float>(), (F{3, 4, 0, 0, 6, 8}));

  auto a = zeros({3}).set_requires_grad();
  auto src = zeros({2}).set_requires_grad();
  index_add(a, 0, iv({2, 2}, {2}), src).backward(fv({1, 2, 3}, {3}));
  EXPECT_EQ(a.grad().to_vector<float>(), (F{1, 2, 3}));
  EXPECT_EQ(src.grad().to_vector<float>(), (F{3, 3}));

  auto t = zeros({2, 2}).set_requires_grad();
  gather(t, 1, iv({0, 0, 1, 0}, {2, 2})).backward(fv({1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(t.grad().to_vector<float>(), (F{3, 0, 4, 3}));

  auto s2 = zeros({2, 2}).set_requires_grad();
  // index [[0, 2]] covers only the first row of src: the second row gets zero gradient.
  scatter_add(zeros({1, 3}), 1, iv({0, 2}, {1, 2}), s2).backward(fv({5, 6, 7}, {1, 3}));
  EXPECT_EQ(s2.grad().to_vector<float>(), (F{5, 7, 0, 0}));
  auto b2 = zeros({1, 3}).set_requires_grad();
  scatter_add(b2, 1, iv({1}, {1, 1}), zeros({1, 1})).backward(fv({1, 2, 3}, {1, 3}));
  EXPECT_EQ(b2.grad().to_vector<float>(), (F{1, 2, 3}));
}

TEST(ShapeGrad, TriAndExpand) {
  auto x = zeros({2, 2}).set_requires_grad();
  triu(x).backward(fv({1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(x.grad().to_vector<float>(), (F{1, 2, 0, 4}));
  auto y = zeros({2, 2}).set_requires_grad();
  tril(y, -1).backward(fv({1, 2, 3, 4}, {2, 2}));
  EXPECT_EQ(y.grad().to_vector<float>(), (F{0, 0, 3, 0}));

  auto e = zeros({2, 1}).set_requires_grad();
  e.expand({3, 2, 2}).backward(iota_f({3, 2, 2}));
  // sum over the new leading dim and the broadcast last dim: (0+1)+(4+5)+(8+9), (2+3)+...
  EXPECT_EQ(e.grad().shape(), (Shape{2, 1}));
  EXPECT_EQ(e.grad().to_vector<float>(), (F{27, 39}));
}

// ---------------------------------------------------------------------------------------------
// The same ops recorded in a traced step, compiled and replayed, give the eager values.

TEST(ShapeTraced, MatchesEagerAndReplays) {
  auto w = iota_f({4, 3}).set_requires_grad();
  auto body = [&](const Tensor& ids) {
    auto e = index_select(w, 0, ids);                           // [5, 3]
    auto t = e.t().reshape({3, 5});                             // permute, reshape
    auto parts = split(t, {2, 3}, 1);                           // slices
    auto y = cat({parts[1], slice(parts[0], 1, 0, 2, 1)}, -1);  // [3, 5]
    y = triu(y.unsqueeze(0).expand({2, 3, 5}), 1);              // [2, 3, 5]
    auto g = gather(y, 2, iv({4, 0, 2, 1, 1, 3}, {2, 3, 1}));   // [2, 3, 1]
    auto sa = scatter_add(zeros({2, 3, 2}), 2, iv({1, 0, 1, 0, 0, 1}, {2, 3, 1}), g);
    auto ia = index_add(sa, 1, iv({2, 2}, {2}), slice(sa, 1, 0, 3, 2));
    auto loss = sum(mul(ia, ia)) + sum(mul(y, y));
    loss.backward();
    return loss;
  };
  Tensor ids1 = iv({3, 0, 2, 3, 1}, {5}), ids2 = iv({1, 1, 0, 2, 3}, {5});
  float l1 = body(ids1).item<float>();
  auto g1 = w.grad().to_vector<float>();
  w.set_grad(Tensor());
  float l2 = body(ids2).item<float>();
  w.set_grad(Tensor());

  auto step = trace(body, "shape_ops");
  auto t1 = step(ids1);
  EXPECT_FLOAT_EQ(t1.item<float>(), l1);
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().to_vector<float>(), g1);
  EXPECT_FLOAT_EQ(step(ids2).item<float>(), l2);
  EXPECT_EQ(runtime_stats().traces >= 1, true);
}

TEST(ShapeTraced, IndexErrorAtRunTime) {
  auto table = iota_f({4, 2});
  auto step = trace([&](const Tensor& ids) { return index_select(table, 0, ids); }, "lookup");
  EXPECT_EQ(step(iv({1, 3}, {2})).to_vector<float>(), (F{2, 3, 6, 7}));
  EXPECT_ERROR(
      {
        auto bad = step(iv({1, 9}, {2}));
        bad.to_vector<float>();
      },
      "index_select", "index 9", "[0, 4)");
}
