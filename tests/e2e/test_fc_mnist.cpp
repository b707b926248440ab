// End to end: the FC-MNIST example trains on generated digits, prints a falling loss and
// reaches at least 95% test accuracy.
#include <gtest/gtest.h>

#include "e2e/e2e_util.h"

#include <array>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>

using e2e::run;

TEST(FcMnist, TrainsToNinetyFivePercentWithFallingLoss) {
  auto dir = e2e::temp_dir("cstorch_e2e", "mnist");
  int status = 0;
  std::string out = run(std::string(CSTORCH_BINARY_DIR) +
                            "/fc_mnist --epochs 1 --log-every 100 --data-dir " + dir.string(),
                        &status);
  ASSERT_EQ(status, 0) << out;
  std::regex loss_re(R"(step\s+(\d+)\s+loss\s+([0-9.]+))");
  std::vector<float> losses;
  for (std::sregex_iterator it(out.begin(), out.end(), loss_re), end; it != end; ++it)
    losses.push_back(std::stof((*it)[2]));
  ASSERT_GE(losses.size(), 5u) << out;
  EXPECT_GT(losses.front(), 2.0f) << out;  // ~ln(10) at the start
  float tail = 0;
  for (size_t i = losses.size() - 3; i < losses.size(); ++i) tail += losses[i] / 3;
  EXPECT_LT(tail, 0.25f * losses.front()) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(test accuracy: ([0-9.]+)%)"))) << out;
  EXPECT_GE(std::stof(m[1]), 95.0f) << out;
  // A second run reads the files written by the first (no regeneration).
  out = run(std::string(CSTORCH_BINARY_DIR) + "/fc_mnist --epochs 1 --log-every 1000 --data-dir " +
                dir.string(),
            &status);
  EXPECT_EQ(out.find("generated"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

TEST(FcMnist, CorruptDataFileIsAClearError) {
  auto dir = e2e::temp_dir("cstorch_e2e", "corrupt");
  int status = 0;
  run(std::string(CSTORCH_BINARY_DIR) + "/make_digits --out " + dir.string() +
          " --train 200 --test 100",
      &status);
  ASSERT_EQ(status, 0);
  std::filesystem::resize_file(dir / "train-images-idx3-ubyte", 1000);  // truncate
  std::string out = run(
      std::string(CSTORCH_BINARY_DIR) + "/fc_mnist --epochs 1 --data-dir " + dir.string(), &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("train-images-idx3-ubyte"), std::string::npos) << out;
  EXPECT_NE(out.find("error:"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}
