// A broken reference fails the suite: the reference tests run again in a child process with a
// `python` whose torch import works but whose reference scripts crash, and every test that
// needs a script must fail (a skip would let a broken reference pass unnoticed).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "ref_util.h"

namespace cstorch::reftest {
namespace {

TEST(ReferenceHarness, AReferenceScriptThatCrashesFailsTheTest) {
  auto dir = make_temp_dir("ref_harness");
  const auto python = dir / "python";
  {
    // `-c 'import torch ...'` (the availability probe) succeeds; a script crashes.
    std::ofstream f(python);
    f << "#!/bin/sh\nif [ \"$1\" = \"-c\" ]; then echo 2.0.0; exit 0; fi\n"
         "echo 'Traceback: simulated crash of' \"$1\" >&2\nexit 3\n";
  }
  std::filesystem::permissions(python, std::filesystem::perms::owner_all);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  std::string out;
  const int rc = run_command("CSTORCH_PYTHON=" + shell_quote(python.string()) + " " +
                                 shell_quote(self) + " --gtest_filter='TransformerModels.*'",
                             &out);
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("simulated crash of"), std::string::npos) << out;
  EXPECT_NE(out.find("2 FAILED TESTS"), std::string::npos) << out;
  EXPECT_EQ(out.find("[  SKIPPED ]"), std::string::npos) << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cstorch::reftest
