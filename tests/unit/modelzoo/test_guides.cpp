// The guides in docs/ quote source files that the suite builds and runs (examples/external/ by
// scripts/test_install.sh, the `install_test` entry). A quoted block is marked
// `<!-- file: PATH -->` on the line before its fence; these tests keep every such block equal
// to its file, so a guide never shows code that no longer builds.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "unit/test_util.h"

namespace fs = std::filesystem;

namespace {

// Each marked block of a Markdown file: {path named by the marker, the block's text}.
std::multimap<std::string, std::string> quoted_files(const fs::path& doc) {
  const std::string text = cstorch::testing::read_file(doc);
  std::multimap<std::string, std::string> out;
  const std::string marker = "<!-- file: ";
  for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) {
    const size_t name_end = text.find(" -->\n", at);
    EXPECT_NE(name_end, std::string::npos) << doc << ": unterminated marker";
    if (name_end == std::string::npos) break;
    const std::string path = text.substr(at + marker.size(), name_end - at - marker.size());
    const size_t fence = name_end + 5;
    EXPECT_EQ(text.compare(fence, 3, "```"), 0) << doc << ": no fence after the marker of " << path;
    const size_t body = text.find('\n', fence) + 1;
    const size_t close = text.find("\n```\n", body - 1);
    EXPECT_NE(close, std::string::npos) << doc << ": unclosed block for " << path;
    if (close == std::string::npos) break;
    out.emplace(path, text.substr(body, close + 1 - body));
  }
  return out;
}

}  // namespace

TEST(Guides, QuotedFilesAreTheFilesWordForWord) {
  const fs::path root = CSTORCH_SOURCE_DIR;
  int blocks = 0;
  for (const auto& e : fs::directory_iterator(root / "docs")) {
    if (e.path().extension() != ".md") continue;
    for (const auto& [path, block] : quoted_files(e.path())) {
      ++blocks;
      ASSERT_TRUE(fs::exists(root / path)) << e.path() << " quotes a missing file " << path;
      EXPECT_EQ(block, cstorch::testing::read_file(root / path))
          << e.path().filename() << " quotes " << path << " differently from the file";
    }
  }
  // The program and plugin guides quote four files between them.
  EXPECT_GE(blocks, 4);
}

TEST(Guides, ProgramAndPluginGuidesQuoteTheExternalExample) {
  const fs::path docs = fs::path(CSTORCH_SOURCE_DIR) / "docs";
  auto program = quoted_files(docs / "your-own-program.md");
  EXPECT_EQ(program.count("examples/external/mlp_adamw.cpp"), 1u);
  EXPECT_EQ(program.count("examples/external/CMakeLists.txt"), 1u);
  auto plugin = quoted_files(docs / "plugin-model.md");
  EXPECT_EQ(plugin.count("examples/external/regression_plugin.cpp"), 1u);
  EXPECT_EQ(plugin.count("examples/external/regression.yaml"), 1u);
}
