// Checkpoint readers and writers against hostile or failing input: a pickle nested 200000
// deep, safetensors headers that do not tile the data buffer, a disk that fills up during an
// HDF5 save, and temporary files left by saves that were killed.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "unit/test_util.h"

using namespace cstorch;
namespace fs = std::filesystem;
using cstorch::testing::expect_error;

namespace {

using cstorch::testing::write_file;

fs::path temp_dir(const std::string& name) {
  return cstorch::testing::temp_dir("cstorch_hardening", name);
}

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof v);
}

// A zip archive of stored (uncompressed) records, as torch.save writes.
std::string zip(const std::vector<std::pair<std::string, std::string>>& records) {
  std::string out, central;
  for (const auto& [name, data] : records) {
    const auto offset = static_cast<uint32_t>(out.size());
    const uint32_t crc = cstorch::testing::crc32_of(data), n = static_cast<uint32_t>(data.size());
    put<uint32_t>(out, 0x04034b50);
    put<uint16_t>(out, 20);
    put<uint16_t>(out, 0);
    put<uint16_t>(out, 0);  // stored
    put<uint32_t>(out, 0);  // time, date
    put<uint32_t>(out, crc);
    put<uint32_t>(out, n);
    put<uint32_t>(out, n);
    put<uint16_t>(out, static_cast<uint16_t>(name.size()));
    put<uint16_t>(out, 0);
    out += name + data;
    put<uint32_t>(central, 0x02014b50);
    put<uint16_t>(central, 20);
    put<uint16_t>(central, 20);
    put<uint16_t>(central, 0);
    put<uint16_t>(central, 0);
    put<uint32_t>(central, 0);
    put<uint32_t>(central, crc);
    put<uint32_t>(central, n);
    put<uint32_t>(central, n);
    put<uint16_t>(central, static_cast<uint16_t>(name.size()));
    put<uint16_t>(central, 0);
    put<uint16_t>(central, 0);
    put<uint16_t>(central, 0);
    put<uint16_t>(central, 0);
    put<uint32_t>(central, 0);
    put<uint32_t>(central, offset);
    central += name;
  }
  const auto cd_offset = static_cast<uint32_t>(out.size());
  out += central;
  put<uint32_t>(out, 0x06054b50);
  put<uint16_t>(out, 0);
  put<uint16_t>(out, 0);
  put<uint16_t>(out, static_cast<uint16_t>(records.size()));
  put<uint16_t>(out, static_cast<uint16_t>(records.size()));
  put<uint32_t>(out, static_cast<uint32_t>(central.size()));
  put<uint32_t>(out, cd_offset);
  put<uint16_t>(out, 0);
  return out;
}

// A safetensors file: 8-byte header length, the header, the data.
std::string safetensors(const std::string& header, const std::string& data, uint64_t length) {
  std::string s;
  put<uint64_t>(s, length);
  return s + header + data;
}

}  // namespace

// A pickle of 200000 nested lists: the reader's depth check fires, and freeing the objects
// must not recurse once per level (it crashed with SIGSEGV).
TEST(CheckpointHardening, DeeplyNestedPickleIsAnErrorNotACrash) {
  auto dir = temp_dir("pickle");
  std::string pkl =
      std::string("\x80\x02") + std::string(200000, ']') + std::string(199999, 'a') + ".";
  auto p = dir / "deep.pt";
  write_file(p, zip({{"archive/data.pkl", pkl}, {"archive/version", "3\n"}}));
  expect_error([&] { load(p.string()); },
               {"checkpoint " + p.string(), "nested deeper than 512 levels"});
  // A list that contains itself (through the memo): the same error, and no endless walk.
  auto q = dir / "cycle.pt";
  write_file(q, zip({{"archive/data.pkl", std::string("\x80\x02]q\x00h\x00"
                                                      "a.",
                                                      9)}}));
  expect_error([&] { load(q.string()); }, {"checkpoint " + q.string(), "(or cyclic)"});
  fs::remove_all(dir);
}

// A dict with a key twice is an error naming the key and where; the same key at two levels
// is not. (The check is a set per dict: it was a search of the keys so far, O(N^2) in a
// dict's size: 40000 keys took 1.6 s to read, now 0.7 s.)
TEST(CheckpointHardening, RepeatedDictKeyIsAnErrorNotAcrossLevels) {
  auto dir = temp_dir("dictkeys");
  const std::string a(
      "X\x01\x00\x00\x00"
      "a",
      6);
  auto p = dir / "twice.pt";
  write_file(p, zip({{"archive/data.pkl", "\x80\x02}(" + a + "K\x01" + a + "K\x02u."},
                     {"archive/version", "3\n"}}));
  expect_error([&] { load(p.string()); }, {"checkpoint " + p.string(), "key 'a' appears twice"});
  auto q = dir / "nested.pt";
  write_file(q, zip({{"archive/data.pkl", "\x80\x02}(" + a + "}(" + a + "K\x01uu."},
                     {"archive/version", "3\n"}}));
  const auto st = load(q.string());
  EXPECT_EQ(st.at("a").at("a").as_int(), 1);
  fs::remove_all(dir);
}

// The tensors' data offsets must tile the data buffer exactly, up to the end of the file (as
// the reference implementation requires): a header length a few bytes short still parses
// (the header is padded with spaces) and used to shift every tensor.
TEST(CheckpointHardening, SafetensorsOffsetsMustCoverTheDataExactly) {
  auto dir = temp_dir("safetensors");
  std::string data(24, '\0');
  for (int i = 0; i < 6; ++i) {
    float v = static_cast<float>(i + 1);
    std::memcpy(data.data() + 4 * i, &v, 4);
  }
  auto header = [](uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1) {
    std::string h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" +
                    std::to_string(a0) + "," + std::to_string(a1) +
                    "]},\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[" +
                    std::to_string(b0) + "," + std::to_string(b1) + "]}}";
    return h + std::string(8 - h.size() % 8, ' ');  // 1 to 8 spaces of padding
  };
  const std::string h = header(0, 8, 8, 24);
  auto good = dir / "good.safetensors";
  write_file(good, safetensors(h, data, h.size()));
  State s = load(good.string());
  EXPECT_EQ(s.at("b").as_tensor().to_vector<float>(), (std::vector<float>{3, 4, 5, 6}));

  size_t pad = h.size() - h.find_last_not_of(' ') - 1;
  ASSERT_GE(pad, 1u);
  for (size_t k = 1; k <= pad; ++k) {
    auto p = dir / ("short" + std::to_string(k) + ".safetensors");
    write_file(p, safetensors(h, data, h.size() - k));
    expect_error([&] { load(p.string()); },
                 {"checkpoint " + p.string(), "entry 'b'", "ends at byte 24",
                  "holds " + std::to_string(24 + k) + " bytes"});
  }
  // A gap, an overlap, and data past the last tensor.
  auto gap = dir / "gap.safetensors";
  std::string hg = header(0, 8, 12, 28);
  write_file(gap, safetensors(hg, data + std::string(4, '\0'), hg.size()));
  expect_error([&] { load(gap.string()); }, {"checkpoint " + gap.string(), "entry 'b'", "a gap"});
  auto overlap = dir / "overlap.safetensors";
  std::string ho = header(0, 8, 4, 20);
  write_file(overlap, safetensors(ho, data.substr(0, 20), ho.size()));
  expect_error([&] { load(overlap.string()); },
               {"checkpoint " + overlap.string(), "entry 'b'", "an overlap"});
  auto tail = dir / "tail.safetensors";
  write_file(tail, safetensors(h, data + "xxxx", h.size()));
  expect_error([&] { load(tail.string()); },
               {"checkpoint " + tail.string(), "entry 'b'", "holds 28 bytes"});
  // Saved files pass (tied tensors stored once, empty tensors, the structure metadata).
  auto saved = dir / "saved.safetensors";
  Tensor t = cstorch::testing::rt({3, 2});
  save(State::map({{"x", t}, {"y", t}, {"e", zeros({0})}, {"n", 3}}), saved.string());
  EXPECT_EQ(load(saved.string()).at("y").as_tensor().to_vector<float>(), t.to_vector<float>());
  fs::remove_all(dir);
}

namespace {
// In a child process: save with the disk filling up (test hook CSTORCH_TEST_SAVE_NO_SPACE),
// print the error, then exit normally, which runs HDF5's exit handler. Exit status 3: the
// save did not fail; 4: something is left in the folder.
// `where` "fsize": a file-size limit (RLIMIT_FSIZE, as `ulimit -f` sets; SIGXFSZ ignored, so
// that the writes fail with EFBIG) instead of the hook.
void save_on_a_full_disk(const char* where, const fs::path& dir) {
  if (std::string(where) == "fsize") {
    ::signal(SIGXFSZ, SIG_IGN);
    const struct rlimit lim { 64 * 1024, 64 * 1024 };
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) std::exit(5);
  } else {
    ::setenv("CSTORCH_TEST_SAVE_NO_SPACE", where, 1);
  }
  State s = State::map(
      {{"a", zeros({32768})}, {"b", zeros({32768})}, {"c", zeros({32768})}, {"d", zeros({32768})}});
  try {
    save(s, (dir / "checkpoint_1.mdl").string());
    std::exit(3);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  if (!fs::is_empty(dir)) std::exit(4);
  std::exit(0);
}
}  // namespace

// The disk fills up during an HDF5 save: a clear error, no temporary file left, and the
// process exits normally (it crashed in HDF5's exit handler: the temporary file's handle
// stayed open after the failed write or flush).
TEST(CheckpointHardening, DiskFullDuringHdf5SaveFailsCleanly) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto dir = temp_dir("diskfull");
  auto data_dir = dir / "data", flush_dir = dir / "flush";
  fs::create_directories(data_dir);
  fs::create_directories(flush_dir);
  EXPECT_EXIT(save_on_a_full_disk("data", data_dir), ::testing::ExitedWithCode(0),
              "checkpoint_1.mdl: cannot write tensor '.'.*No space left on device");
  EXPECT_EXIT(save_on_a_full_disk("flush", flush_dir), ::testing::ExitedWithCode(0),
              "checkpoint_1.mdl: flush failed: cannot reserve [0-9]+ bytes for the file: No "
              "space left on device");
  // Under a file-size limit the memory file that takes the abandoned file's last writes is
  // limited too: the exit handler crashed (segmentation fault) after the failed close.
  auto fsize_dir = dir / "fsize";
  fs::create_directories(fsize_dir);
  EXPECT_EXIT(save_on_a_full_disk("fsize", fsize_dir), ::testing::ExitedWithCode(0),
              "checkpoint_1.mdl: cannot write tensor '.'.*File too large");
  fs::remove_all(dir);
}

// Temporary files of killed saves are removed; those of live writers and other files stay.
TEST(CheckpointHardening, StaleTemporaryFilesAreRemoved) {
  auto dir = temp_dir("stale");
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int ws = 0;
  ASSERT_EQ(waitpid(child, &ws, 0), child);  // `child` is no longer a live process
  const std::string dead = std::to_string(child), live = std::to_string(::getpid());
  for (const std::string& name : std::vector<std::string>{
           ".checkpoint_5.mdl.tmp-" + dead + "-0", ".checkpoint_10.mdl.tmp-" + dead + "-17",
           ".checkpoint_15.mdl.tmp-" + live + "-3", "checkpoint_5.mdl", ".notes.tmp-x-1",
           ".checkpoint_20.mdl.tmp-" + dead})
    write_file(dir / name, "x");
  EXPECT_EQ(remove_stale_checkpoint_temp_files(dir.string()), 2);
  std::set<std::string> left;
  for (auto& e : fs::directory_iterator(dir)) left.insert(e.path().filename().string());
  EXPECT_EQ(left,
            (std::set<std::string>{".checkpoint_15.mdl.tmp-" + live + "-3", "checkpoint_5.mdl",
                                   ".notes.tmp-x-1", ".checkpoint_20.mdl.tmp-" + dead}));
  EXPECT_EQ(remove_stale_checkpoint_temp_files((dir / "missing").string()), 0);
  fs::remove_all(dir);
}
