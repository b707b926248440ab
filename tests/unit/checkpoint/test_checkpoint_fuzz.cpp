// Loader fuzzing: saved files of each format are truncated, bit-flipped and overwritten at
// random, and loading them (whole, and tensor by tensor through CheckpointReader) must either
// succeed or raise cstorch::Error — never crash, hang or throw anything else. For the PyTorch
// format the pickle is also mutated behind a recomputed CRC, so the unpickler itself is
// exercised (a plain bit flip is caught by the zip CRC).
//
// Budget: CSTORCH_FUZZ_SECONDS per format (default 5, so about 20 s for the suite); the
// `fuzz_checkpoint` build target runs 200 s per format.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "unit/test_util.h"

using namespace cstorch;
namespace fs = std::filesystem;

namespace {

double budget_seconds() {
  const char* s = std::getenv("CSTORCH_FUZZ_SECONDS");
  return s && *s ? std::atof(s) : 5.0;
}

State fuzz_state() {
  Tensor tied = cstorch::testing::rt({3, 2}, 5);
  return State::map(
      {{"model", State::map({{"w", cstorch::testing::rt({4, 3}, 1)},
                             {"b", cstorch::testing::rt({4}, 2).to(DType::bf16)},
                             {"h", cstorch::testing::rt({2}, 3).to(DType::f16)},
                             {"i", from_vector(std::vector<int64_t>{1, 2}, {2})},
                             {"m", from_vector(std::vector<uint8_t>{1, 0}, {2}, DType::boolean)},
                             {"s", scalar_tensor(2)},
                             {"e", zeros({0})},
                             {"tied_a", tied},
                             {"tied_b", tied}})},
       {"opt", State::map({{"lr", 0.1}, {"step", 3}, {"name", "sgd"}, {"none", nullptr}})},
       {"list", State(std::vector<State>{1, 2.5, true, State(std::vector<State>{"x"})})}});
}

using cstorch::testing::read_file;
using cstorch::testing::write_file;
uint32_t crc32(const std::string& s) {
  return cstorch::testing::crc32_of(s);
}

// Loads `path` every way; anything but success or cstorch::Error fails the test.
void try_load(const std::string& path, const std::string& what) {
  auto t0 = std::chrono::steady_clock::now();
  try {
    State s = load(path);
    (void)s;
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": load threw a non-cstorch exception: " << e.what();
  }
  try {
    CheckpointReader r(path);
    for (auto& t : r.tensors()) {
      try {
        r.read(t.key);
      } catch (const Error&) {
      }
    }
  } catch (const Error&) {
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": reader threw a non-cstorch exception: " << e.what();
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 5.0) << what << ": loading took " << s << " s (hang?)";
}

std::string mutate(std::string b, std::mt19937_64& rng, size_t lo = 0, size_t hi = 0) {
  if (hi == 0) hi = b.size();
  auto pos = [&] { return lo + rng() % (hi - lo); };
  switch (rng() % 4) {
    case 0:  // truncate
      b.resize(rng() % b.size());
      break;
    case 1: {  // flip a few bits
      int n = 1 + static_cast<int>(rng() % 8);
      for (int i = 0; i < n; ++i) b[pos()] ^= static_cast<char>(1u << (rng() % 8));
      break;
    }
    case 2: {  // overwrite a run with random bytes
      size_t at = pos(), n = 1 + rng() % 16;
      for (size_t i = 0; i < n && at + i < hi; ++i) b[at + i] = static_cast<char>(rng());
      break;
    }
    default: {  // set a byte to an extreme value (sizes, counts)
      b[pos()] = static_cast<char>(rng() % 2 ? 0xFF : 0x00);
      break;
    }
  }
  return b;
}

void fuzz_format(const std::string& ext) {
  auto dir = fs::temp_directory_path() / ("cstorch_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string base = (dir / ("base" + ext)).string(), cur = (dir / ("cur" + ext)).string();
  save(fuzz_state(), base);
  std::string bytes = read_file(base);
  std::mt19937_64 rng(std::hash<std::string>{}(ext));
  auto t0 = std::chrono::steady_clock::now();
  int iters = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
         budget_seconds()) {
    std::string m = mutate(bytes, rng);
    write_file(cur, m);
    try_load(cur, ext + " iteration " + std::to_string(iters));
    if (::testing::Test::HasFailure()) {
      write_file((dir / ("failing" + ext)).string(), m);
      FAIL() << "failing input kept at " << (dir / ("failing" + ext)).string();
    }
    ++iters;
  }
  std::printf("fuzzed %s: %d mutated files\n", ext.c_str(), iters);
  EXPECT_GT(iters, 10);
  fs::remove_all(dir);
}

}  // namespace

TEST(CheckpointFuzz, Hdf5) {
  fuzz_format(".mdl");
}

TEST(CheckpointFuzz, SafeTensors) {
  fuzz_format(".safetensors");
}

TEST(CheckpointFuzz, PyTorchZip) {
  fuzz_format(".pt");
}

TEST(CheckpointFuzz, PyTorchPickleBehindValidCrc) {
  auto dir = fs::temp_directory_path() / ("cstorch_fuzzpkl_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::string base = (dir / "base.pt").string(), cur = (dir / "cur.pt").string();
  save(fuzz_state(), base);
  std::string bytes = read_file(base);
  // The first zip entry is archive/data.pkl: its local header is at 0.
  ASSERT_EQ(bytes.substr(30, 16), "archive/data.pkl");
  uint32_t size;
  uint16_t nlen, xlen;
  std::memcpy(&size, bytes.data() + 22, 4);
  std::memcpy(&nlen, bytes.data() + 26, 2);
  std::memcpy(&xlen, bytes.data() + 28, 2);
  size_t data = 30 + nlen + xlen;
  // Central directory entry of data.pkl: the first one.
  size_t central = bytes.find(std::string("PK\x01\x02", 4), data + size);
  ASSERT_NE(central, std::string::npos);
  std::mt19937_64 rng(99);
  auto t0 = std::chrono::steady_clock::now();
  int iters = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() <
         budget_seconds()) {
    std::string pkl = bytes.substr(data, size);
    std::string m = bytes;
    std::string mp = mutate(pkl, rng);
    if (mp.size() != pkl.size()) mp.resize(pkl.size(), '.');  // keep the zip layout
    m.replace(data, size, mp);
    uint32_t crc = crc32(mp);
    std::memcpy(m.data() + 14, &crc, 4);
    std::memcpy(m.data() + central + 16, &crc, 4);
    write_file(cur, m);
    try_load(cur, "pickle iteration " + std::to_string(iters));
    if (::testing::Test::HasFailure()) {
      write_file((dir / "failing.pt").string(), m);
      FAIL() << "failing input kept at " << (dir / "failing.pt").string();
    }
    ++iters;
  }
  std::printf("fuzzed the pickle: %d mutated files\n", iters);
  fs::remove_all(dir);
}
