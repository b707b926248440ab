// End to end: the custom optimizer / scheduler example trains (loss falls by 100x), its
// learning rate follows the user's schedule inside the traced step, and its state dict holds
// the user's state names. Also FC-MNIST in mixed precision: bf16 reaches the same 95% target as
// f32, and f16 with dynamic loss scaling trains (one epoch on fewer examples to stay fast).
#include <gtest/gtest.h>

#include "e2e/e2e_util.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>

using e2e::run;

TEST(CustomOptimizer, ExampleTrainsWithUserOptimizerAndSchedule) {
  int status = 0;
  std::string out = run(
      std::string(CSTORCH_BINARY_DIR) + "/custom_optimizer --steps 300 --log-every 10", &status);
  ASSERT_EQ(status, 0) << out;
  std::regex re(R"(step\s+(\d+)\s+loss\s+([0-9.]+)\s+lr\s+([0-9.]+))");
  std::vector<int> steps;
  std::vector<double> losses, lrs;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    steps.push_back(std::stoi((*it)[1]));
    losses.push_back(std::stod((*it)[2]));
    lrs.push_back(std::stod((*it)[3]));
  }
  ASSERT_GE(losses.size(), 20u) << out;
  EXPECT_LT(losses.back(), losses.front() / 100) << out;
  // The printed lr is the value after scheduler.step() at step s, i.e. the schedule at s + 1:
  // warmup (s + 2) * 0.02 / 20 while s + 1 < 20, then 0.02 * sqrt(20 / (s + 1)).
  for (size_t i = 0; i < steps.size(); ++i) {
    double s = steps[i] + 1;
    double want = s < 20 ? (s + 1) * 0.02 / 20 : 0.02 * std::sqrt(20 / s);
    EXPECT_NEAR(lrs[i], want, 2e-6) << "step " << steps[i];
  }
  EXPECT_NE(out.find("optimizer state of parameter 0: momentum, step"), std::string::npos) << out;
  EXPECT_NE(out.find("scheduler last_epoch: 300"), std::string::npos) << out;
}

TEST(MixedPrecision, FcMnistBf16ReachesTheF32TargetAndF16Trains) {
  auto dir = e2e::temp_dir("cstorch_e2e", "mnist_amp");
  int status = 0;
  std::string out = run(std::string(CSTORCH_BINARY_DIR) +
                            "/fc_mnist --epochs 1 --log-every 300 "
                            "--precision bf16 --data-dir " +
                            dir.string(),
                        &status);
  ASSERT_EQ(status, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(test accuracy: ([0-9.]+)%)"))) << out;
  EXPECT_GE(std::stof(m[1]), 95.0f) << out;
  out = run(std::string(CSTORCH_BINARY_DIR) +
                "/fc_mnist --epochs 1 --log-every 300 "
                "--precision f16 --data-dir " +
                dir.string(),
            &status);
  ASSERT_EQ(status, 0) << out;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(test accuracy: ([0-9.]+)%)"))) << out;
  EXPECT_GE(std::stof(m[1]), 95.0f) << out;
  EXPECT_NE(out.find("loss scale"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}
