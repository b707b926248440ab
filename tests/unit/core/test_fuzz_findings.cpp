// Regressions found by the libFuzzer targets (fuzz/, scripts/fuzz.sh): each input is the
// reduced form of what a target found, and the reader must answer it with a cstorch::Error
// naming the file (before the fix, each crashed, hung or threw another exception type).
#include <gtest/gtest.h>

#include <chrono>

#include "cstorch/checkpoint.h"
#include "cstorch/config.h"
#include "cstorch/data/arrays.h"
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

// A JSON Lines document with a number beyond double range (found by the arrays target once it
// read JSON Lines): the reader caught only nlohmann's parse_error, and the parser's
// out_of_range escaped without the file or the line.
TEST(FuzzFindings, JsonLinesNumberOutOfRange) {
  const std::string v = (dir() / "jsonl_vocab.json").string();
  const std::string m = (dir() / "jsonl_merges.txt").string();
  cs::data::train_bpe({" the cat"}, {.vocab_size = 280, .min_frequency = 1}, v, m);
  const auto tok = cs::data::BpeTokenizer::from_files(v, m);
  expect_error(
      [&] {
        cs::data::tokenize_jsonl({put("big.jsonl", "{\"text\": \"the\"}\n7774e77577\n")}, tok,
                                 "text", 0, 0);
      },
      {"big.jsonl:2:", "invalid JSON", "number overflow"});
}

// vocab.json whose one token has a huge id (found in a CI fuzzing run): the id table was sized
// by the largest id, so a 20-byte file allocated gigabytes before any check.
TEST(FuzzFindings, BpeVocabularyIdFarBeyondTheTokenCount) {
  auto merges = put("merges.txt", "");
  expect_error(
      [&] {
        cs::data::BpeTokenizer::from_files(put("sparse.json", "{\"a\": 2000000000}"), merges);
      },
      {"sparse.json", "largest id is 2000000000", "1 tokens", "below 65552"});
  // Ids with gaps within the limit still load.
  auto ok =
      cs::data::BpeTokenizer::from_files(put("gaps.json", "{\"a\": 0, \"b\": 60000}"), merges);
  (void)ok;
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

namespace {
void put_u16(std::string& s, uint16_t v) {
  s.append(reinterpret_cast<const char*>(&v), 2);
}
void put_u32(std::string& s, uint32_t v) {
  s.append(reinterpret_cast<const char*>(&v), 4);
}
// A stored (uncompressed) zip holding one record, as torch.save writes them (little-endian
// host).
std::string zip_one(const std::string& name, const std::string& data) {
  const uint32_t crc = cs::testing::crc32_of(data), size = static_cast<uint32_t>(data.size());
  std::string z;
  put_u32(z, 0x04034b50);
  for (uint16_t v : {20, 0, 0, 0, 0}) put_u16(z, v);  // version, flags, stored, time, date
  put_u32(z, crc);
  put_u32(z, size);
  put_u32(z, size);
  put_u16(z, static_cast<uint16_t>(name.size()));
  put_u16(z, 0);
  z += name + data;
  const auto central = static_cast<uint32_t>(z.size());
  put_u32(z, 0x02014b50);
  for (uint16_t v : {20, 20, 0, 0, 0, 0}) put_u16(z, v);
  put_u32(z, crc);
  put_u32(z, size);
  put_u32(z, size);
  put_u16(z, static_cast<uint16_t>(name.size()));
  for (uint16_t v : {0, 0, 0, 0}) put_u16(z, v);  // extra, comment, disk, internal attributes
  put_u32(z, 0);                                  // external attributes
  put_u32(z, 0);                                  // local header offset
  z += name;
  const auto central_size = static_cast<uint32_t>(z.size()) - central;
  put_u32(z, 0x06054b50);
  for (uint16_t v : {0, 0, 1, 1}) put_u16(z, v);
  put_u32(z, central_size);
  put_u32(z, central);
  put_u16(z, 0);
  return z;
}
}  // namespace

// A .pt file of under 500 bytes whose pickle shares each level of a nest of tuples twice
// through the memo: {"x": t30} with t_i = (t_{i-1}, t_{i-1}), 2^30 values when expanded. The
// reader expanded 2^24 of them before refusing: seconds and gigabytes (the fuzz target's
// -timeout). It now stops at 2^18, quickly.
TEST(FuzzFindings, PickleMemoExpansionIsBoundedQuickly) {
  // EMPTY_DICT, BINUNICODE "x", then t0 = EMPTY_LIST (memo 0); level i: BINGET i-1 (the
  // previous level is already on the stack), TUPLE2, memo i; then SETITEM and STOP.
  std::string p = "\x80\x02}X";
  p += std::string("\x01\0\0\0", 4) + "x";
  p += "]q";
  p += '\0';
  for (int i = 1; i <= 30; ++i) {
    p += 'h';
    p += static_cast<char>(i - 1);
    p += "\x86q";
    p += static_cast<char>(i);
  }
  p += "s.";
  auto path = put("bomb.pt", zip_one("archive/data.pkl", p));
  auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { cs::load_pt(path); }, {"bomb.pt", "more than 262144 values"});
  expect_error([&] { cs::CheckpointReader r(path); }, {"bomb.pt", "more than 262144 values"});
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 10.0) << "refusing the expansion took " << s << " s";
}
