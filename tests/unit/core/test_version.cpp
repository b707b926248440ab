#include <gtest/gtest.h>

#include <cctype>
#include <string>

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
