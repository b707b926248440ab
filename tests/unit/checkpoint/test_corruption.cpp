// Damaged tensor data is detected, not loaded: single bits flipped at several places inside each
// tensor's bytes of a saved file (HDF5: Fletcher-32 per chunk, or the checksummed object header
// of a 0-d tensor; PyTorch: the zip CRC-32 of each storage; safetensors: the CRC-32 cstorch
// keeps in __metadata__) make load fail naming the file and the tensor, and verify_checkpoint
// list the damaged tensors. h5py reads the checksummed files (and refuses damaged ones), and
// files of other writers (torch.save, h5py with and without checksums, safetensors without
// cstorch's metadata) still load.
#include <gtest/gtest.h>

#include <hdf5.h>
#include <chrono>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/internal.h"
#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "unit/test_util.h"

using namespace cstorch;
using cstorch::testing::rt;
namespace fs = std::filesystem;

namespace {

using cstorch::testing::expect_error;
using cstorch::testing::read_file;
using cstorch::testing::write_file;

fs::path temp_dir(const std::string& name) {
  return cstorch::testing::temp_dir("cstorch_corrupt", name);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::string bytes_of(const Tensor& t) {
  auto h = cstorch::detail::host_bytes(t, "test");
  return std::string(static_cast<const char*>(h.data()), h.size());
}

int run_python(const std::string& args, std::string* out) {
  std::string cmd = std::string(CSTORCH_PYTHON) + " " + CSTORCH_SOURCE_DIR +
                    "/tests/unit/checkpoint/corruption_interop.py " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  out->clear();
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int rc = ::pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// Every dtype, an odd byte count (bool), a 0-d tensor, tied tensors and a non-tensor value.
State sample() {
  State model = State::map();
  Tensor w = rt({61, 33}, 11);
  model.set("w", w);
  model.set("b", rt({33}, 12));
  model.set("half", rt({3, 5}, 13).to(DType::bf16));
  model.set("f16", rt({7}, 14).to(DType::f16));
  std::vector<int64_t> ids;
  std::vector<int32_t> small;
  std::vector<uint8_t> mask;
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (int i = 0; i < 303; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    if (i < 17) ids.push_back(static_cast<int64_t>(x));
    if (i < 9) small.push_back(static_cast<int32_t>(x >> 32));
    mask.push_back(static_cast<uint8_t>(x >> 40) & 1);
  }
  model.set("ids", from_vector(ids, {17}));
  model.set("small", from_vector(small, {9}));
  model.set("mask", from_vector(mask, {3, 101}, DType::boolean));
  model.set("tied", w);  // the same tensor: stored once, two keys
  State s = State::map();
  s.set("model", model);
  s.set("step", from_vector(std::vector<int64_t>{0x5A17C0DE12345678}, {}));
  s.set("epoch", 3);
  return s;
}

// The keys that share the storage of `key` (itself included).
std::set<std::string> sharing(const std::string& key) {
  if (key == "model.w" || key == "model.tied") return {"model.w", "model.tied"};
  return {key};
}

// File offset of byte `p` of tensor `key`'s data in an HDF5 checkpoint (any layout without
// compression): through the chunk index for chunked datasets, by search for a compact one.
uint64_t hdf5_address(const std::string& path, const std::string& dataset, uint64_t p,
                      const std::string& tensor_bytes) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0);
  hid_t ds = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  EXPECT_GE(ds, 0) << dataset;
  hid_t dcpl = H5Dget_create_plist(ds);
  hid_t type = H5Dget_type(ds);
  hid_t space = H5Dget_space(ds);
  size_t item = H5Tget_size(type);
  int rank = H5Sget_simple_extent_ndims(space);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space, dims.data(), nullptr);
  uint64_t addr = 0;
  H5D_layout_t layout = H5Pget_layout(dcpl);
  if (layout == H5D_CONTIGUOUS) {
    addr = H5Dget_offset(ds) + p;
  } else if (layout == H5D_COMPACT) {
    std::string file = read_file(path);
    size_t at = file.find(tensor_bytes);
    EXPECT_NE(at, std::string::npos);
    EXPECT_EQ(file.find(tensor_bytes, at + 1), std::string::npos) << "not unique";
    addr = at + p;
  } else {
    std::vector<hsize_t> chunk(static_cast<size_t>(rank));
    H5Pget_chunk(dcpl, rank, chunk.data());
    uint64_t e = p / item, rem = e;
    std::vector<hsize_t> coord(static_cast<size_t>(rank)), start(static_cast<size_t>(rank));
    for (int j = rank; j-- > 0;) {
      coord[static_cast<size_t>(j)] = rem % dims[static_cast<size_t>(j)];
      rem /= dims[static_cast<size_t>(j)];
    }
    uint64_t within = 0;
    for (size_t j = 0; j < coord.size(); ++j) {
      start[j] = coord[j] / chunk[j] * chunk[j];
      within = within * chunk[j] + (coord[j] - start[j]);
    }
    unsigned mask = 0;
    haddr_t a = 0;
    hsize_t size = 0;
    EXPECT_GE(H5Dget_chunk_info_by_coord(ds, start.data(), &mask, &a, &size), 0);
    addr = a + within * item + p % item;
  }
  H5Sclose(space);
  H5Tclose(type);
  H5Pclose(dcpl);
  H5Dclose(ds);
  H5Fclose(f);
  return addr;
}

// Where byte `p` of tensor `key` lies in the file.
uint64_t address(const std::string& path, const std::string& key, uint64_t p,
                 const std::string& tensor_bytes) {
  if (detect_checkpoint_format(path) == CheckpointFormat::HDF5) {
    // cstorch names datasets after their keys (the tied key links to the first one's).
    std::string dataset = key == "model.tied" ? "model.w" : key;
    return hdf5_address(path, dataset, p, tensor_bytes);
  }
  // PyTorch and safetensors keep each tensor's bytes in one piece.
  std::string file = read_file(path);
  size_t at = file.find(tensor_bytes);
  EXPECT_NE(at, std::string::npos) << key;
  EXPECT_EQ(file.find(tensor_bytes, at + 1), std::string::npos) << key << ": not unique";
  return at + p;
}

// Flips bit `bit` of byte `p` of each tensor (several places in each) of the checkpoint at
// `path` (which must hold `want`), one flip per copy: load fails naming the file and the
// tensor; verify lists exactly the tensors of that storage.
void expect_flips_detected(const std::string& path, const State& want) {
  ASSERT_TRUE(load(path) == want);
  auto ok = verify_checkpoint(path);
  EXPECT_TRUE(ok.intact()) << format_checkpoint_verification(ok);
  EXPECT_EQ(ok.tensors, 9);
  EXPECT_EQ(ok.unchecked, 0) << format_checkpoint_verification(ok);
  EXPECT_EQ(format_checkpoint_verification(ok), "9 tensors verified, all intact\n");
  const std::string original = read_file(path);
  const std::string damaged =
      fs::path(path).parent_path() / ("damaged" + fs::path(path).extension().string());
  CheckpointReader reader(path);
  int flips = 0;
  for (const auto& info : reader.tensors()) {
    if (info.key == "model.tied") continue;  // the same bytes as model.w
    const std::string bytes = bytes_of(reader.read(info.key));
    const uint64_t n = bytes.size();
    ASSERT_GT(n, 0u) << info.key;
    const uint64_t positions[] = {0, n / 3, n / 2, n - 1};
    const int bits[] = {0, 7, 3, 5};
    for (int i = 0; i < 4; ++i) {
      const uint64_t at = address(path, info.key, positions[i], bytes);
      SCOPED_TRACE(info.key + " byte " + std::to_string(positions[i]) + " bit " +
                   std::to_string(bits[i]) + " (file byte " + std::to_string(at) + ")");
      ASSERT_LT(at, original.size());
      ASSERT_EQ(original[at], bytes[positions[i]]) << "the address does not hold the byte";
      std::string s = original;
      s[at] = static_cast<char>(s[at] ^ (1 << bits[i]));
      write_file(damaged, s);
      std::string msg = error_of([&] { load(damaged); });
      EXPECT_NE(msg.find(damaged), std::string::npos) << msg;
      EXPECT_NE(msg.find("'" + info.key + "'"), std::string::npos) << msg;
      EXPECT_NE(msg.find("damaged"), std::string::npos) << msg;
      auto v = verify_checkpoint(damaged);
      std::set<std::string> keys;
      for (auto& d : v.damaged) keys.insert(d.key);
      EXPECT_EQ(keys, sharing(info.key)) << format_checkpoint_verification(v);
      EXPECT_FALSE(v.intact());
      EXPECT_EQ(v.tensors, 9);
      std::string report = format_checkpoint_verification(v);
      EXPECT_NE(report.find("damaged: " + info.key + ": "), std::string::npos) << report;
      EXPECT_NE(report.find("9 tensors verified, " + std::to_string(keys.size()) + " damaged"),
                std::string::npos)
          << report;
      // The other tensors still read.
      CheckpointReader r(damaged);
      for (const auto& other : r.tensors()) {
        if (!sharing(info.key).count(other.key)) {
          EXPECT_NO_THROW(r.read(other.key)) << other.key;
        }
      }
      ++flips;
    }
  }
  EXPECT_EQ(flips, 4 * 8);
  fs::remove(damaged);
}

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }

 private:
  const char* name_;
};

}  // namespace

TEST(CheckpointCorruption, Hdf5FlippedBitsAreDetected) {
  auto dir = temp_dir("hdf5");
  State s = sample();
  std::string p = (dir / "c.mdl").string();
  save(s, p);
  expect_flips_detected(p, s);
  fs::remove_all(dir);
}

TEST(CheckpointCorruption, Hdf5SeveralChunksPerTensor) {
  // Chunks of at most 100 bytes: tensors split along the first or a later dimension, padded
  // last chunks, odd chunk sizes (bool rows of 101 bytes).
  auto dir = temp_dir("hdf5_chunks");
  State s = sample();
  std::string p = (dir / "c.mdl").string();
  {
    ScopedEnv hook("CSTORCH_TEST_HDF5_CHUNK_BYTES", "100");
    save(s, p);
  }
  hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t ds = H5Dopen2(f, "model.w", H5P_DEFAULT);
  hsize_t chunks = 0;
  hid_t space = H5Dget_space(ds);
  H5Dget_num_chunks(ds, space, &chunks);
  EXPECT_EQ(chunks, 61u * 2);
  H5Sclose(space);
  H5Dclose(ds);
  H5Fclose(f);
  expect_flips_detected(p, s);
  fs::remove_all(dir);
}

TEST(CheckpointCorruption, PyTorchFlippedBitsAreDetected) {
  auto dir = temp_dir("pt");
  State s = sample();
  std::string p = (dir / "c.pt").string();
  save(s, p);
  expect_flips_detected(p, s);
  fs::remove_all(dir);
}

TEST(CheckpointCorruption, SafetensorsFlippedBitsAreDetected) {
  auto dir = temp_dir("st");
  State s = sample();
  std::string p = (dir / "c.safetensors").string();
  save(s, p);
  expect_flips_detected(p, s);
  // A flat map of tensors (no structure metadata) carries its checksums too.
  State flat = State::map({{"a", rt({5, 7}, 3)}, {"b", rt({9}, 4)}});
  std::string q = (dir / "flat.safetensors").string();
  save(flat, q);
  std::string file = read_file(q);
  EXPECT_EQ(file.find("cstorch_structure"), std::string::npos);
  EXPECT_NE(file.find("\"cstorch.tensor_crc32.a\""), std::string::npos);
  EXPECT_TRUE(load(q) == flat);
  std::string a = bytes_of(flat.at("a").as_tensor());
  size_t at = file.find(a);
  ASSERT_NE(at, std::string::npos);
  file[at + 17] = static_cast<char>(file[at + 17] ^ 0x10);
  write_file(q, file);
  std::string msg = error_of([&] { load(q); });
  EXPECT_NE(msg.find("tensor 'a'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("CRC-32"), std::string::npos) << msg;
  fs::remove_all(dir);
}

TEST(CheckpointCorruption, SafetensorsDamagedChecksumMetadata) {
  auto dir = temp_dir("st_meta");
  State flat = State::map({{"a", rt({5, 7}, 3)}, {"b", rt({9}, 4)}});
  std::string q = (dir / "flat.safetensors").string();
  save(flat, q);
  const std::string file = read_file(q);
  // A tensor name changed in the header: its checksum key names no tensor.
  std::string renamed = file;
  size_t at = renamed.find("\"b\":{");
  ASSERT_NE(at, std::string::npos);
  renamed[at + 1] = 'c';
  write_file(q, renamed);
  std::string msg = error_of([&] { load(q); });
  EXPECT_NE(msg.find("the header is damaged"), std::string::npos) << msg;
  // A tensor's checksum changed: the header's own checksum no longer matches.
  std::string bad = file;
  const std::string tensor_key = "\"cstorch.tensor_crc32.a\":\"";
  at = bad.find(tensor_key);
  ASSERT_NE(at, std::string::npos);
  bad[at + tensor_key.size()] = 'x';
  write_file(q, bad);
  msg = error_of([&] { load(q); });
  EXPECT_NE(msg.find("the header is damaged"), std::string::npos) << msg;
  // The header's checksum that is not 8 hex digits.
  bad = file;
  const std::string key = "\"cstorch.header_crc32\":\"";
  at = bad.find(key);
  ASSERT_NE(at, std::string::npos);
  bad[at + key.size()] = 'x';
  write_file(q, bad);
  msg = error_of([&] { load(q); });
  EXPECT_NE(msg.find("is not a CRC-32"), std::string::npos) << msg;
  // A flipped bit in the header checksum's own key name: the tensors' keys require it (the
  // check was skipped, as for a file without one).
  bad = file;
  at = bad.find(key);
  bad[at + 3] = static_cast<char>(bad[at + 3] ^ 0x01);
  write_file(q, bad);
  msg = error_of([&] { load(q); });
  EXPECT_NE(msg.find("comes with a header checksum (cstorch.header_crc32), which is missing"),
            std::string::npos)
      << msg;
  // A file of an older version: tensor checksums under cstorch.crc32.<name> and no header
  // checksum (the header rewritten so, its length updated): it loads, its tensors checked.
  uint64_t hlen = 0;
  std::memcpy(&hlen, file.data(), 8);
  std::string header = file.substr(8, hlen);
  at = header.find(key);
  ASSERT_NE(at, std::string::npos);
  // "key":"xxxxxxxx" and the comma that joins it to its neighbour.
  const size_t end = at + key.size() + 9;
  if (header[end] == ',')
    header.erase(at, end + 1 - at);
  else
    header.erase(at - 1, end + 1 - at);
  for (size_t i = header.find("cstorch.tensor_crc32."); i != std::string::npos;
       i = header.find("cstorch.tensor_crc32.", i))
    header.replace(i, 21, "cstorch.crc32.");
  const std::string data = file.substr(8 + hlen);
  std::string old_style(8, '\0');
  const uint64_t old_n = header.size();
  std::memcpy(old_style.data(), &old_n, 8);
  old_style += header + data;
  write_file(q, old_style);
  EXPECT_TRUE(load(q) == flat) << error_of([&] { load(q); });
  std::string damaged = old_style;
  const std::string a_bytes = bytes_of(flat.at("a").as_tensor());
  const size_t data_at = damaged.find(a_bytes);
  ASSERT_NE(data_at, std::string::npos);
  damaged[data_at + 5] = static_cast<char>(damaged[data_at + 5] ^ 0x04);
  write_file(q, damaged);
  msg = error_of([&] { load(q); });
  EXPECT_NE(msg.find("CRC-32"), std::string::npos) << msg;
  // One bit of the structure (the state's values other than tensors, here a step count): it
  // loaded, with another step, and `verify` said all was intact.
  State nested = State::map({{"model", State::map({{"w", rt({3, 2}, 5)}})}, {"global_step", 4}});
  std::string n = (dir / "nested.safetensors").string();
  save(nested, n);
  std::string text = read_file(n);
  at = text.find("global_step");
  ASSERT_NE(at, std::string::npos);
  const size_t digit = text.find('4', at);
  ASSERT_NE(digit, std::string::npos);
  text[digit] = static_cast<char>(text[digit] ^ 0x01);  // 4 -> 5
  write_file(n, text);
  msg = error_of([&] { load(n); });
  EXPECT_NE(msg.find("the header is damaged"), std::string::npos) << msg;
  fs::remove_all(dir);
}

TEST(CheckpointCorruption, ChecksumsOfLargeTensorsInParts) {
  // Large buffers are checksummed in parts on several threads (here: parts of 256 bytes), the
  // parts' sums joined: the same checksums as HDF5, Python's zipfile and zlib compute at once.
  auto dir = temp_dir("parts");
  ScopedEnv hook("CSTORCH_TEST_CHECKSUM_PART_BYTES", "256");
  State s = sample();
  std::string out;
  std::string mdl = (dir / "c.mdl").string(), pt = (dir / "c.pt").string(),
              st = (dir / "c.safetensors").string();
  save(s, mdl);
  save(s, pt);
  save(s, st);
  int rc = run_python("read-mdl " + mdl + " " + (dir / "read.json").string(), &out);
  if (rc == 3) GTEST_SKIP() << out;
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(run_python("check-pt " + pt, &out), 0) << out;
  EXPECT_EQ(run_python("check-st " + st, &out), 0) << out;
  for (const std::string& p : {mdl, pt, st}) {
    SCOPED_TRACE(p);
    expect_flips_detected(p, s);
  }
  fs::remove_all(dir);
}

TEST(CheckpointCorruption, PyTorchStrayBytesOfAViewedStorageAreDetected) {
  // The CRC covers a whole storage: a tensor that views part of it is read with the rest, so
  // damage anywhere in the storage is found (and a strided view is checked the same way).
  auto dir = temp_dir("pt_views");
  std::string out;
  int rc = run_python("write " + dir.string(), &out);
  if (rc == 3) GTEST_SKIP() << out;
  ASSERT_EQ(rc, 0) << out;
  std::string p = (dir / "torch.pt").string();
  std::string file = read_file(p);
  // "view" is elements 10..30 of a 100-element storage; damage element 90.
  State s = load(p);
  std::string view = bytes_of(s.at("view").as_tensor());
  size_t at = file.find(view);
  ASSERT_NE(at, std::string::npos);
  file[at - 40 + 80 * 4] = static_cast<char>(file[at - 40 + 80 * 4] ^ 1);
  write_file(p, file);
  std::string msg = error_of([&] { load(p); });
  EXPECT_NE(msg.find("the storage of tensor 'view'"), std::string::npos) << msg;
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  fs::remove_all(dir);
}

TEST(CheckpointCorruption, H5pyReadsChecksummedFilesAndRefusesDamagedOnes) {
  auto dir = temp_dir("h5py");
  State s = sample();
  for (const char* chunk : {"", "100"}) {
    SCOPED_TRACE(std::string("chunk limit ") + chunk);
    std::string p = (dir / "c.mdl").string();
    {
      ScopedEnv hook("CSTORCH_TEST_HDF5_CHUNK_BYTES", chunk);
      save(s, p);
    }
    std::string out;
    int rc = run_python("read-mdl " + p + " " + (dir / "read.json").string(), &out);
    if (rc == 3) GTEST_SKIP() << out;
    ASSERT_EQ(rc, 0) << out;
    auto got = nlohmann::json::parse(read_file(dir / "read.json"));
    CheckpointReader r(p);
    ASSERT_EQ(got.size(), 9u);
    for (const auto& info : r.tensors()) {
      std::string want = bytes_of(r.read(info.key)), hex;
      for (unsigned char c : want) hex += fmt::format("{:02x}", c);
      EXPECT_EQ(got.at(info.key).get<std::string>(), hex) << info.key;
    }
    // A flipped bit: h5py's HDF5 refuses the dataset too (the same checksum).
    std::string w = bytes_of(r.read("model.w"));
    std::string file = read_file(p);
    uint64_t at = address(p, "model.w", w.size() / 2, w);
    file[at] = static_cast<char>(file[at] ^ 4);
    write_file(p, file);
    ASSERT_EQ(run_python("damaged-mdl " + p + " model.w", &out), 0) << out;
  }
  fs::remove_all(dir);
}

// A dataset whose chunks were never written, claiming a large shape (the structure description
// agrees): refused before the tensor is allocated (a 465 KB file claiming [3000000, 784] was
// allocated, 9.4 GB, then read as fill values).
TEST(CheckpointCorruption, AShapeTheFileDoesNotStoreIsRefusedBeforeAllocating) {
  auto dir = temp_dir("unwritten");
  const std::string p = (dir / "c.mdl").string();
  save(State::map({{"model", State::map({{"w", zeros({4, 784})}})}}), p);
  std::string out;
  ASSERT_EQ(run_python("unwritten-mdl " + p + " model.w 3000000", &out), 0) << out;
  const auto t0 = std::chrono::steady_clock::now();
  expect_error([&] { load(p); }, {"checkpoint " + p,
                                  "only 0 of the dataset's 3000000 chunks were "
                                  "ever written",
                                  "9408000000 bytes"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  fs::remove_all(dir);
}

TEST(CheckpointCorruption, FilesFromOtherWritersLoad) {
  auto dir = temp_dir("others");
  std::string out;
  int rc = run_python("write " + dir.string(), &out);
  if (rc == 3) GTEST_SKIP() << out;
  ASSERT_EQ(rc, 0) << out;
  auto expected = nlohmann::json::parse(read_file(dir / "expected.json"));
  // Without a checksum to check: unfiltered HDF5 and foreign safetensors.
  std::map<std::string, int64_t> unchecked = {
      {"plain.mdl", 4}, {"plain.safetensors", 4}, {"meta.safetensors", 4}};
  for (auto& [file, tensors] : expected.items()) {
    SCOPED_TRACE(file);
    std::string p = (dir / file).string();
    State s = load(p);
    for (auto& [key, t] : tensors.items()) {
      const Tensor& x = s.at(key).as_tensor();
      EXPECT_EQ(dtype_name(x.dtype()), t["dtype"].get<std::string>()) << key;
      EXPECT_EQ(x.shape(), t["shape"].get<Shape>()) << key;
      std::string hex;
      for (unsigned char c : bytes_of(x)) hex += fmt::format("{:02x}", c);
      EXPECT_EQ(hex, t["hex"].get<std::string>()) << key;
    }
    auto v = verify_checkpoint(p);
    EXPECT_TRUE(v.intact()) << format_checkpoint_verification(v);
    EXPECT_EQ(v.tensors, static_cast<int64_t>(tensors.size()));
    EXPECT_EQ(v.unchecked, unchecked.count(file) ? unchecked[file] : 0)
        << format_checkpoint_verification(v);
  }
  // Damage in files of other writers that carry checksums: torch.save's zip CRC-32 and h5py's
  // Fletcher-32 (chunks of cstorch's form, read directly, and other chunk shapes, read through
  // HDF5).
  struct Flip {
    const char* file;
    const char* key;
  };
  for (Flip fl :
       {Flip{"torch.pt", "w"}, Flip{"torch.pt", "mask"}, Flip{"torch.pt", "step"},
        Flip{"fletcher.mdl", "w"}, Flip{"fletcher.mdl", "mask"}, Flip{"fletcher.mdl", "ids"},
        Flip{"fletcher_other.mdl", "w"}, Flip{"fletcher_other.mdl", "mask"}}) {
    SCOPED_TRACE(std::string(fl.file) + " " + fl.key);
    std::string p = (dir / fl.file).string();
    const std::string original = read_file(p);
    std::string bytes = bytes_of(load(p).at(fl.key).as_tensor());
    uint64_t at = detect_checkpoint_format(p) == CheckpointFormat::HDF5
                      ? hdf5_address(p, fl.key, bytes.size() - 1, bytes)
                      : address(p, fl.key, bytes.size() - 1, bytes);
    ASSERT_EQ(original[at], bytes.back());
    std::string s = original;
    s[at] = static_cast<char>(s[at] ^ 0x40);
    std::string damaged = (dir / (std::string("damaged_") + fl.file)).string();
    write_file(damaged, s);
    std::string msg = error_of([&] { load(damaged); });
    EXPECT_NE(msg.find(damaged), std::string::npos) << msg;
    EXPECT_NE(msg.find("'" + std::string(fl.key) + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("damaged"), std::string::npos) << msg;
    auto v = verify_checkpoint(damaged);
    ASSERT_EQ(v.damaged.size(), 1u) << format_checkpoint_verification(v);
    EXPECT_EQ(v.damaged[0].key, fl.key);
  }
  fs::remove_all(dir);
}
