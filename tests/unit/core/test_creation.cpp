#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "cstorch/tensor.h"

using namespace cstorch;

TEST(Creation, FullZerosOnesArange) {
  auto z = zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.to_vector<float>(), std::vector<float>(6, 0.f));
  EXPECT_EQ(full({2}, 2.5, DType::bf16).to_vector<float>(), (std::vector<float>{2.5f, 2.5f}));
  EXPECT_EQ(arange(5).to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1, 2, 0.25, DType::f32).to_vector<float>(),
            (std::vector<float>{1, 1.25, 1.5, 1.75}));
  auto v = from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2});
  EXPECT_THROW(v.item<float>(), Error);
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
}

// Integer tensors print exactly (token ids and indices of more than six digits).
TEST(Creation, ToStringPrintsIntegersExactly) {
  auto t = from_vector(std::vector<int64_t>{123456789, 9007199254740993, -7}, {3});
  EXPECT_EQ(t.to_string(),
            "Tensor(shape=[3], dtype=i64, values=[123456789, 9007199254740993, -7])");
  auto u = from_vector(std::vector<int32_t>{-2147483647 - 1, 5}, {2});
  EXPECT_EQ(u.to_string(), "Tensor(shape=[2], dtype=i32, values=[-2147483648, 5])");
  EXPECT_EQ(from_vector(std::vector<float>{0.5f, 1e9f}, {2}).to_string(),
            "Tensor(shape=[2], dtype=f32, values=[0.5, 1e+09])");
}

// A shape whose size overflows is refused by the op that makes it (zeros({2^61, 8}) read as an
// empty tensor and crashed a reduction; expand to 2^40 x 2^30 gave numel 0).
TEST(Creation, ShapesBeyondMemoryAreRefusedByTheirOp) {
  auto expect_refused = [](const std::function<void()>& f, const std::string& op) {
    try {
      f();
      ADD_FAILURE() << op << ": no error";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(op + ": the result's shape"), std::string::npos) << m;
      EXPECT_NE(m.find("more elements than memory can hold"), std::string::npos) << m;
    }
  };
  expect_refused([] { (void)zeros({int64_t{1} << 61, 8}); }, "full");
  expect_refused([] { (void)ones({1, 1}).expand({int64_t{1} << 40, int64_t{1} << 30}); }, "expand");
  expect_refused([] { (void)randn({int64_t{1} << 62, 4}); }, "rand_normal");
  EXPECT_EQ(zeros({int64_t{1} << 40, 0}).numel(), 0);  // an empty result of any other dim is fine
}
