#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "cstorch/version.h"

// The header's macros and the CMake project version are kept by hand in two places: they must
// agree, or a program compiled against one header would report another library's version.
TEST(Version, MacrosMatchTheLibrary) {
  std::string expected = std::to_string(CSTORCH_VERSION_MAJOR) + "." +
                         std::to_string(CSTORCH_VERSION_MINOR) + "." +
                         std::to_string(CSTORCH_VERSION_PATCH);
  EXPECT_EQ(cstorch::version(), expected);
}

TEST(Version, GitCommitIsHexOrUnknown) {
  std::string commit = cstorch::git_commit();
  if (commit == "unknown") return;  // a source tree that is not a git checkout
  EXPECT_EQ(commit.size(), 12u);
  for (char c : commit) EXPECT_TRUE(std::isxdigit(static_cast<unsigned char>(c))) << commit;
}

// The commit is read at every build, not once at configure time: after a commit and a rebuild
// the run records must name the new commit. The test suite is built from the checkout it runs
// in, so the commit is that checkout's HEAD ("unknown" where git reads none).
TEST(Version, GitCommitIsTheCheckoutsHead) {
  const std::string cmd =
      fmt::format("git -C '{}' rev-parse --short=12 HEAD 2>/dev/null", CSTORCH_SOURCE_DIR);
  std::string head;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[64];
    while (fgets(buf, sizeof buf, p)) head += buf;
    if (pclose(p) != 0) head.clear();
  }
  while (!head.empty() && std::isspace(static_cast<unsigned char>(head.back()))) head.pop_back();
  EXPECT_EQ(cstorch::git_commit(), head.empty() ? std::string("unknown") : head);
}
