#include <gtest/gtest.h>

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
