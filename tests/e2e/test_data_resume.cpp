// End to end: restartable data across processes. Run 100 steps; separately run 60 steps that
// save the loader position at step 39 from a checkpoint closure (the client is running ahead
// by then), restore it in a new process and run steps 40..99: the batch ids of every step are
// identical to the uninterrupted run's.
#include <gtest/gtest.h>

#include "e2e/e2e_util.h"

#include <array>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

using e2e::run;

namespace {
// The "step S ids ..." lines, in order.
std::vector<std::string> step_lines(const std::string& out) {
  std::vector<std::string> r;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("step ", 0) == 0) r.push_back(line);
  return r;
}
}  // namespace

TEST(DataResume, ResumedProcessSeesTheSameBatches) {
  auto dir = e2e::temp_dir("cstorch_e2e", "data_resume");
  const std::string bin = CSTORCH_BINARY_DIR "/data_resume";
  int status = 0;
  auto full = run(bin + " --max-steps 100", &status);
  ASSERT_EQ(status, 0) << full;
  auto ref = step_lines(full);
  ASSERT_EQ(ref.size(), 100u) << full;
  EXPECT_EQ(ref[99].rfind("step 99 ids ", 0), 0u) << ref[99];

  auto first =
      run(bin + " --max-steps 60 --checkpoint-steps 40 --save-dir " + dir.string(), &status);
  ASSERT_EQ(status, 0) << first;
  auto a = step_lines(first);
  ASSERT_EQ(a.size(), 60u) << first;
  ASSERT_TRUE(std::filesystem::exists(dir / "data_39.json")) << first;
  auto second = run(bin + " --max-steps 100 --load " + (dir / "data_39.json").string(), &status);
  ASSERT_EQ(status, 0) << second;
  auto b = step_lines(second);
  ASSERT_EQ(b.size(), 60u) << second;
  std::vector<std::string> resumed(a.begin(), a.begin() + 40);
  resumed.insert(resumed.end(), b.begin(), b.end());
  EXPECT_EQ(resumed, ref);

  // A different worker count cannot resume that position: a clear error.
  auto bad =
      run(bin + " --max-steps 100 --workers 3 --load " + (dir / "data_39.json").string(), &status);
  EXPECT_NE(status, 0) << bad;
  EXPECT_NE(bad.find("saved with 2 workers but this DataLoader has 3"), std::string::npos) << bad;
  std::filesystem::remove_all(dir);
}
