// Regressions found by the libFuzzer targets (fuzz/, scripts/fuzz.sh): each input is the
// reduced form of what a target found, and the reader must answer it with a cstorch::Error
// naming the file (before the fix, each crashed, hung or threw another exception type).
#include <gtest/gtest.h>

#include "cstorch/config.h"
#include "cstorch/data/tokenizer.h"
#include "modelzoo/config_view.h"
#include "unit/test_util.h"

namespace cs = cstorch;
using cs::testing::expect_error;
using cs::testing::write_file;

namespace {
std::filesystem::path dir() {
  static auto d = cs::testing::temp_dir("cstorch_fuzzfind", "data");
  return d;
}
std::string put(const std::string& name, const std::string& text) {
  auto p = dir() / name;
  write_file(p, text);
  return p.string();
}
}  // namespace

// vocab.json with a number beyond double range: nlohmann's parser throws out_of_range (not a
// parse_error), which escaped from_files as a bare json exception.
TEST(FuzzFindings, BpeVocabularyNumberOutOfRange) {
  auto merges = put("merges.txt", "");
  expect_error(
      [&] { cs::data::BpeTokenizer::from_files(put("huge.json", "{\"a\": 2e828}"), merges); },
      {"huge.json", "not valid JSON", "2e828"});
}

// A config whose text is not UTF-8 (here a lone 0xBF byte in a value, then in a key): yaml-cpp
// passes the bytes through, and the first message or record that wrote the value out failed
// with nlohmann's type_error 316 instead of naming the key.
TEST(FuzzFindings, ConfigThatIsNotUtf8) {
  expect_error([&] { cs::parse_config("optimizer:\n  name: \"SGD\xbf\"\n"); },
               {"config: ", "'optimizer.name'", "line 2", "not valid UTF-8"});
  expect_error([&] { cs::parse_config("optimizer:\n  lr: 1\n  n\xbf: 1\n"); },
               {"a key under 'optimizer'", "line 3", "not valid UTF-8"});
  auto path = put("bad.yaml", "train_input: {batch_size: 8}\nmodel: {name: \"m\xbf\"}\n");
  expect_error([&] { cs::load_config_file(path); }, {"bad.yaml", "'model.name'", "UTF-8"});
  // Valid multi-byte text is kept.
  EXPECT_EQ(cs::parse_config("name: caf\xc3\xa9")["name"], "caf\xc3\xa9");
}

// A Config made in code can still hold such a string: an error that shows the value must
// name the key rather than fail while writing the message.
TEST(FuzzFindings, ConfigViewErrorShowsInvalidUtf8) {
  cs::Config c = {{"steps", std::string("1\xbf")}};
  modelzoo::ConfigView v(c, "");
  expect_error([&] { v.at("steps").as_int(); }, {"steps", "expected an integer"});
}
