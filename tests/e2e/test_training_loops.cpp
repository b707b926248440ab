// End to end: the custom-loop example programs with small step counts.
// - full_training: configure(checkpoint_steps) and a range-for over the DataLoader that saves
//   from a step closure whenever i % checkpoint_steps == 0; checkpoints land in model_dir; a
//   second run resumes from one.
// - full_evaluation: loads a checkpoint from model_dir and reports the accuracy computed in the
//   traced step.
// - custom_training_loop: the CSX backend, a DataExecutor and a checkpoint closure.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "e2e/e2e_util.h"

using e2e::run;
namespace fs = std::filesystem;

namespace {

std::string bin(const std::string& name) {
  return std::string(CSTORCH_BINARY_DIR) + "/" + name;
}

std::vector<float> numbers_after(const std::string& out, const std::string& prefix) {
  std::vector<float> r;
  std::regex re(prefix + R"(([-0-9.e]+))");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
    r.push_back(std::stof((*it)[1]));
  return r;
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> r;
  for (const auto& e : fs::directory_iterator(dir)) r.push_back(e.path().filename().string());
  std::sort(r.begin(), r.end());
  return r;
}

// A scratch folder with 3000 / 500 synthetic digits in data/; compile reports stay inside it.
struct Scratch {
  fs::path dir;
  std::string env;
  explicit Scratch(const std::string& name) : dir(e2e::temp_dir("cstorch_e2e", name)) {
    int status = 0;
    std::string out =
        run(bin("make_digits") + " --out " + (dir / "data").string() + " --train 3000 --test 500",
            &status);
    EXPECT_EQ(status, 0) << out;
    env = "cd " + dir.string() + " && CSTORCH_DEFAULT_COMPILE_DIR=" + (dir / "compile").string() +
          " ";
  }
  ~Scratch() { fs::remove_all(dir); }
};

}  // namespace

TEST(TrainingLoops, FullTrainingSavesAtTheConfiguredStepsAndResumes) {
  Scratch s("full_training");
  const std::string schedule =
      " --optimizer-args '{lr: 0.05, momentum: 0.9}' --learning-rate '{scheduler: CosineDecay, "
      "initial_learning_rate: 0.05, end_learning_rate: 0.0, total_iters: 60}'";
  int status = 0;
  std::string out = run(s.env + bin("full_training") +
                            " --model-dir md --data-dir data --num-steps 60 --checkpoint-steps 25 "
                            "--batch-size 32" +
                            schedule,
                        &status);
  ASSERT_EQ(status, 0) << out;
  auto losses = numbers_after(out, "Loss: ");
  ASSERT_EQ(losses.size(), 60u) << out;
  EXPECT_GT(losses.front(), 2.0f) << out;
  EXPECT_LT(losses.back(), 0.5f * losses.front()) << out;
  // i % 25 == 0 for i in 0..59: steps 0, 25 and 50, in model_dir.
  EXPECT_EQ(
      files_in(s.dir / "md"),
      (std::vector<std::string>{"checkpoint_0.mdl", "checkpoint_25.mdl", "checkpoint_50.mdl"}));

  // Resume from a checkpoint (a relative path is read from model_dir): the scheduler and the
  // optimizer continue where step 50 left them, and the steps are counted on from it (named from
  // 0 again, the resumed run wrote over checkpoint_0.mdl).
  const std::string before = cstorch::testing::read_file(s.dir / "md" / "checkpoint_0.mdl");
  out = run(s.env + bin("full_training") +
                " --model-dir md --data-dir data --num-steps 3 --checkpoint-steps 2 "
                "--checkpoint-path checkpoint_50.mdl --batch-size 32" +
                schedule,
            &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("Loaded checkpoint_50.mdl (global step 50)"), std::string::npos) << out;
  EXPECT_EQ(numbers_after(out, "Loss: ").size(), 3u) << out;
  EXPECT_EQ(files_in(s.dir / "md"),
            (std::vector<std::string>{"checkpoint_0.mdl", "checkpoint_25.mdl", "checkpoint_50.mdl",
                                      "checkpoint_51.mdl", "checkpoint_53.mdl"}));
  EXPECT_EQ(cstorch::testing::read_file(s.dir / "md" / "checkpoint_0.mdl"), before);

  out = run(s.env + bin("full_evaluation") +
                " --model-dir md --data-dir data --checkpoint checkpoint_50.mdl --num-steps 5",
            &status);
  ASSERT_EQ(status, 0) << out;
  auto accuracy = numbers_after(out, "Eval Accuracy: ");
  ASSERT_EQ(accuracy.size(), 1u) << out;
  EXPECT_GT(accuracy[0], 0.6f) << out;  // 10% is chance
  EXPECT_LE(accuracy[0], 1.0f) << out;
  EXPECT_NE(out.find("(mean over 5 steps)"), std::string::npos) << out;
}

TEST(TrainingLoops, CustomTrainingLoopSavesInItsCheckpointClosure) {
  Scratch s("custom_loop");
  int status = 0;
  std::string out = run(s.env + bin("custom_training_loop") +
                            " --data-dir data --num-steps 25 --checkpoint-steps 10 --batch-size 32",
                        &status);
  ASSERT_EQ(status, 0) << out;
  std::regex re(R"(Train Loss (\d+): ([0-9.]+))");
  std::vector<float> losses;
  int64_t expected_step = 0;
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) {
    EXPECT_EQ(std::stoll((*it)[1]), expected_step++) << out;
    losses.push_back(std::stof((*it)[2]));
  }
  ASSERT_EQ(losses.size(), 25u) << out;
  EXPECT_LT(losses.back(), losses.front()) << out;
  // Saved after 10 and 20 steps (the DataExecutor's checkpoint steps 9 and 19).
  EXPECT_TRUE(fs::exists(s.dir / "checkpoint_10.mdl")) << out;
  EXPECT_TRUE(fs::exists(s.dir / "checkpoint_20.mdl")) << out;
  EXPECT_FALSE(fs::exists(s.dir / "checkpoint_25.mdl")) << out;
}
