// Checkpoints: round trips of every value kind and dtype in all three formats, tied weights,
// crash safety of failed saves, the lazy reader, info/diff, and clear errors for bad files.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>
#include <tuple>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "unit/test_util.h"

using namespace cstorch;
using cstorch::testing::rt;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("cstorch_ckpt_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

#define EXPECT_ERROR_HAS(stmt, text)                                        \
  do {                                                                      \
    std::string msg_ = error_of([&] { stmt; });                             \
    EXPECT_NE(msg_.find(text), std::string::npos) << "error was: " << msg_; \
  } while (0)

Tensor bf16_tensor() {
  return rt({2, 3}, 7).to(DType::bf16);
}

// Every kind, every dtype, edge shapes, unicode and awkward keys.
State sample_state() {
  State model = State::map();
  model.set("fc1.weight", rt({4, 3}, 1));
  model.set("fc1.bias", rt({4}, 2));
  model.set("bf16", bf16_tensor());
  model.set("f16", rt({3}, 3).to(DType::f16));
  model.set("i32", from_vector(std::vector<int32_t>{1, -2, 2147483647}, {3}));
  model.set("i64", from_vector(std::vector<int64_t>{INT64_MIN, -1, INT64_MAX}, {3}));
  model.set("bool", from_vector(std::vector<uint8_t>{1, 0, 1, 1}, {2, 2}, DType::boolean));
  model.set("empty", zeros({0, 3}));
  model.set("scalar", scalar_tensor(3.25));
  State opt = State::map();
  State st = State::map();
  st.set("0", State::map({{"momentum_buffer", rt({4, 3}, 9)}, {"step", 12}}));
  opt.set("state", st);
  opt.set("param_groups",
          State(std::vector<State>{State::map({{"lr", 0.1},
                                               {"momentum", 0.9},
                                               {"nesterov", false},
                                               {"params", State(std::vector<State>{0, 1})}})}));
  State values = State::map();
  values.set("none", nullptr);
  values.set("true", true);
  values.set("int", int64_t{-1234567890123});
  values.set("int_max", INT64_MAX);
  values.set("int_min", INT64_MIN);
  values.set("float", 0.1);
  values.set("tiny", 1e-310);
  values.set("neg_zero", -0.0);
  values.set("inf", std::numeric_limits<double>::infinity());
  values.set("ninf", -std::numeric_limits<double>::infinity());
  values.set("string", "héllo wörld ✓");
  values.set("empty_string", "");
  values.set("empty_list", State::list());
  values.set("empty_map", State::map());
  values.set("nested", State(std::vector<State>{State(std::vector<State>{1, "two", 3.0}),
                                                State::map({{"k", nullptr}})}));
  State s = State::map();
  s.set("model", model);
  s.set("optimizer", opt);
  s.set("values", values);
  s.set("ключ/with.slash%", rt({2}, 4));  // unicode, '/', '.', '%'
  s.set("", rt({1}, 5));                  // empty key
  s.set("global_step", 30);
  return s;
}

const char* kExts[] = {".mdl", ".pt", ".safetensors"};

}  // namespace

TEST(Checkpoint, RoundTripEveryKindAndDtypeInEveryFormat) {
  auto dir = temp_dir("roundtrip");
  State s = sample_state();
  for (const char* ext : kExts) {
    SCOPED_TRACE(ext);
    std::string p = (dir / (std::string("ckpt") + ext)).string();
    save(s, p);
    State l = load(p);
    EXPECT_TRUE(l == s) << "saved: " << s.repr() << "\nloaded: " << l.repr();
    // Bit patterns of special floats survive.
    EXPECT_TRUE(std::signbit(l.at("values").at("neg_zero").as_double()));
    EXPECT_EQ(l.at("values").at("tiny").as_double(), 1e-310);
    EXPECT_EQ(l.at("model").at("bf16").as_tensor().dtype(), DType::bf16);
    EXPECT_EQ(l.at("model").at("scalar").as_tensor().shape(), Shape{});
    EXPECT_EQ(l.at("model").at("empty").as_tensor().shape(), (Shape{0, 3}));
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, NanFloatValueRoundTrips) {
  auto dir = temp_dir("nan");
  for (const char* ext : kExts) {
    std::string p = (dir / (std::string("n") + ext)).string();
    save(State::map({{"nan", std::numeric_limits<double>::quiet_NaN()}, {"t", rt({1})}}), p);
    EXPECT_TRUE(std::isnan(load(p).at("nan").as_double())) << ext;
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, NonMapRootsRoundTrip) {
  auto dir = temp_dir("roots");
  for (const char* ext : kExts) {
    std::string p = (dir / (std::string("r") + ext)).string();
    State list(std::vector<State>{rt({2}), 1, "x"});
    save(list, p);
    EXPECT_TRUE(load(p) == list) << ext;
    save(State(rt({3}, 2)), p);
    EXPECT_TRUE(load(p) == State(rt({3}, 2))) << ext;
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, TiedWeightsStoredOnceAndRestoredShared) {
  auto dir = temp_dir("tied");
  Tensor w = rt({256, 256}, 3);  // 256 KiB
  State s = State::map({{"encoder.weight", w}, {"decoder.weight", w}, {"other", rt({2})}});
  for (const char* ext : kExts) {
    SCOPED_TRACE(ext);
    std::string p = (dir / (std::string("tied") + ext)).string();
    save(s, p);
    // Against the same state with two distinct tensors: one 256 KiB copy less.
    std::string p2 = (dir / (std::string("distinct") + ext)).string();
    save(State::map({{"encoder.weight", w}, {"decoder.weight", w + 0.0}, {"other", rt({2})}}), p2);
    EXPECT_GE(fs::file_size(p2), fs::file_size(p) + 240 * 1024) << "stored twice?";
    State l = load(p);
    EXPECT_TRUE(l == s);
    const Tensor& a = l.at("encoder.weight").as_tensor();
    const Tensor& b = l.at("decoder.weight").as_tensor();
    EXPECT_EQ(a.impl(), b.impl());
    const_cast<Tensor&>(a).fill_(2.0);  // one tensor: a write through one key shows in the other
    EXPECT_EQ(b.to_vector<float>()[5], 2.0f);
    CheckpointReader r(p);
    EXPECT_EQ(r.info("decoder.weight").shared_with, "encoder.weight");
    EXPECT_EQ(r.info("encoder.weight").shared_with, "");
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, ModuleStateDictRoundTripAndLoadStateDict) {
  auto dir = temp_dir("module");
  manual_seed(3);
  nn::Sequential m;
  m->push_back(nn::Linear(5, 4).module());
  m->push_back(nn::ReLU().module());
  m->push_back(nn::Linear(4, 2).module());
  std::string p = (dir / "m.mdl").string();
  save(State::map({{"model", m->state_dict().to_state()}}), p);
  manual_seed(4);
  nn::Sequential m2;
  m2->push_back(nn::Linear(5, 4).module());
  m2->push_back(nn::ReLU().module());
  m2->push_back(nn::Linear(4, 2).module());
  m2->load_state_dict(nn::StateDict::from_state(load(p).at("model")));
  Tensor x = rt({3, 5}, 11);
  EXPECT_EQ(m->forward(x).to_vector<float>(), m2->forward(x).to_vector<float>());
  fs::remove_all(dir);
}

// A file saved over keeps its permission bits (it took the temporary file's defaults: a
// checkpoint made private became readable by all); a new file has the default ones.
TEST(Checkpoint, SavingOverAFileKeepsItsPermissions) {
  auto dir = temp_dir("perm");
  for (const char* ext : kExts) {
    SCOPED_TRACE(ext);
    const std::string p = (dir / (std::string("c") + ext)).string();
    save(State::map({{"w", rt({3}, 1)}}), p);
    ASSERT_EQ(::chmod(p.c_str(), 0600), 0);
    save(State::map({{"w", rt({3}, 2)}}), p);
    struct stat st {};
    ASSERT_EQ(::stat(p.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0600u);
    EXPECT_EQ(load(p).at("w").as_tensor().to_vector<float>(), rt({3}, 2).to_vector<float>());
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, FailedSaveLeavesExistingCheckpointAndNoTempFiles) {
  auto dir = temp_dir("failed");
  for (const char* ext : kExts) {
    SCOPED_TRACE(ext);
    std::string p = (dir / (std::string("c") + ext)).string();
    State good = State::map({{"a", rt({3}, 1)}});
    save(good, p);
    State bad = State::map({{"a", rt({3}, 2)}, {"b", Tensor()}, {"c", rt({2})}});
    EXPECT_ERROR_HAS(save(bad, p), "the tensor at key 'b' is undefined");
    EXPECT_TRUE(load(p) == good);
    State bad_utf8 = State::map({{"a", rt({3}, 2)}, {"s", std::string("\xff\xfe")}});
    EXPECT_ERROR_HAS(save(bad_utf8, p), "the string at key 's' is not valid UTF-8");
    EXPECT_TRUE(load(p) == good);
  }
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 3u) << "temporary files left behind";
  EXPECT_ERROR_HAS(save(State::map(), (dir / "no" / "such" / "x.mdl").string()), "does not exist");
  fs::remove_all(dir);
}

TEST(Checkpoint, LazyReaderListsAndReadsOneTensor) {
  auto dir = temp_dir("reader");
  State s = sample_state();
  for (const char* ext : kExts) {
    SCOPED_TRACE(ext);
    std::string p = (dir / (std::string("r") + ext)).string();
    save(s, p);
    CheckpointReader r(p);
    EXPECT_EQ(r.format(), checkpoint_format_for_path(p));
    EXPECT_TRUE(r.contains("model.fc1.weight"));
    EXPECT_TRUE(r.contains("optimizer.state.0.momentum_buffer"));
    EXPECT_FALSE(r.contains("values.int"));  // not a tensor
    const auto& i = r.info("model.bf16");
    EXPECT_EQ(i.dtype, DType::bf16);
    EXPECT_EQ(i.shape, (Shape{2, 3}));
    EXPECT_EQ(i.nbytes, 12);
    Tensor t = r.read("model.fc1.bias");
    EXPECT_EQ(t.to_vector<float>(), rt({4}, 2).to_vector<float>());
    EXPECT_EQ(r.tensors().front().key, "model.fc1.weight");
    EXPECT_ERROR_HAS(r.read("model.fc2.weight"), "no tensor 'model.fc2.weight'");
    // A device this process cannot use (no CUDA backend, or no such GPU in a CUDA build).
    EXPECT_ERROR_HAS(r.read("model.fc1.bias", Device{DeviceType::GPU, 4096}), "device GPU:4096");
    EXPECT_TRUE(r.read_all() == s);
  }
  fs::remove_all(dir);
}

TEST(Checkpoint, FormatChosenByExtensionAndDetectedByContent) {
  auto dir = temp_dir("formats");
  EXPECT_EQ(checkpoint_format_for_path("a/checkpoint_10.mdl"), CheckpointFormat::HDF5);
  EXPECT_EQ(checkpoint_format_for_path("x.h5"), CheckpointFormat::HDF5);
  EXPECT_EQ(checkpoint_format_for_path("x.PT"), CheckpointFormat::PyTorch);
  EXPECT_EQ(checkpoint_format_for_path("x.pth"), CheckpointFormat::PyTorch);
  EXPECT_EQ(checkpoint_format_for_path("x.safetensors"), CheckpointFormat::SafeTensors);
  State s = State::map({{"w", rt({2, 2})}});
  // A .pt written under a misleading name still loads: the content decides.
  std::string p = (dir / "weights.pt").string();
  save(s, p);
  fs::rename(p, dir / "weights.bin");
  EXPECT_EQ(detect_checkpoint_format((dir / "weights.bin").string()), CheckpointFormat::PyTorch);
  EXPECT_TRUE(load((dir / "weights.bin").string()) == s);
  // Conversion between every pair keeps the state.
  State full = sample_state();
  save(full, (dir / "src.mdl").string());
  convert_checkpoint((dir / "src.mdl").string(), (dir / "a.pt").string());
  convert_checkpoint((dir / "a.pt").string(), (dir / "b.safetensors").string());
  convert_checkpoint((dir / "b.safetensors").string(), (dir / "c.h5").string());
  EXPECT_TRUE(load((dir / "c.h5").string()) == full);
  EXPECT_ERROR_HAS(convert_checkpoint((dir / "c.h5").string(), (dir / "c.h5").string()),
                   "same file");
  // Written another way (it compared the strings), or through a link; an empty path is named
  // (it was the filesystem library's "cannot make absolute path").
  EXPECT_ERROR_HAS(convert_checkpoint((dir / "c.h5").string(), (dir / "." / "c.h5").string()),
                   "same file");
  fs::create_symlink(dir / "c.h5", dir / "link.h5");
  EXPECT_ERROR_HAS(convert_checkpoint((dir / "link.h5").string(), (dir / "c.h5").string()),
                   "same file");
  EXPECT_ERROR_HAS(convert_checkpoint((dir / "c.h5").string(), ""), "the output path is empty");
  // An output extension that names no format is refused (save() alone would write HDF5).
  EXPECT_ERROR_HAS(
      convert_checkpoint((dir / "c.h5").string(), (dir / "d.ckpt").string()),
      "cannot tell the output format from '" + (dir / "d.ckpt").string() + "' (extension '.ckpt')");
  EXPECT_FALSE(fs::exists(dir / "d.ckpt"));
  EXPECT_TRUE(load((dir / "c.h5").string()) == full);
  fs::remove_all(dir);
}

TEST(Checkpoint, BadFilesAreClearErrors) {
  auto dir = temp_dir("bad");
  std::string missing = (dir / "missing.mdl").string();
  EXPECT_ERROR_HAS(load(missing), "cannot open checkpoint " + missing);
  std::string text = (dir / "notes.mdl").string();
  std::ofstream(text) << "hello, not a checkpoint\n";
  EXPECT_ERROR_HAS(load(text), "not a checkpoint");
  std::string empty = (dir / "empty.mdl").string();
  std::ofstream(empty).close();
  EXPECT_ERROR_HAS(load(empty), "empty");
  std::string legacy = (dir / "legacy.pt").string();
  std::ofstream(legacy) << "\x80\x02\x8a\x0alegacy";
  EXPECT_ERROR_HAS(load(legacy), "legacy");
  EXPECT_ERROR_HAS(load((dir).string()), "not a regular file");
  // Truncated files of every format.
  for (const char* ext : kExts) {
    SCOPED_TRACE(ext);
    std::string p = (dir / (std::string("t") + ext)).string();
    save(sample_state(), p);
    fs::resize_file(p, fs::file_size(p) / 2);
    std::string msg = error_of([&] { load(p); });
    EXPECT_NE(msg, "<no error>");
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
  }
  std::string p = (dir / "ok.mdl").string();
  save(sample_state(), p);
  EXPECT_ERROR_HAS(load(p, Device{DeviceType::GPU, 4096}), "device GPU:4096");
  EXPECT_TRUE(load(p, Device{DeviceType::CPU, 0}) == sample_state());
  fs::remove_all(dir);
}

// Files crafted with the HDF5 C API, as another program following the format document would.
namespace {
void craft(const std::string& path, bool marker, int64_t version, const std::string& structure,
           bool tensor = true, const std::string& dtype_attr = "f32") {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  auto int_attr = [&](const char* name, int64_t v) {
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Sclose(sp);
  };
  auto str_attr = [&](hid_t obj, const char* name, const std::string& v) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, H5T_VARIABLE);  // h5py's default for str attributes
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    const char* p = v.c_str();
    H5Awrite(a, t, &p);
    H5Aclose(a);
    H5Sclose(sp);
    H5Tclose(t);
  };
  int_attr("cstorch_format_version", version);
  if (tensor) {
    hsize_t dims[1] = {3};
    hid_t sp = H5Screate_simple(1, dims, nullptr);
    hid_t d = H5Dcreate2(f, "w", H5T_IEEE_F32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    float v[3] = {1, 2, 3};
    H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v);
    str_attr(d, "dtype", dtype_attr);
    H5Dclose(d);
    H5Sclose(sp);
  }
  str_attr(f, "cstorch_structure", structure);
  if (marker) int_attr("__SUCCESS__", 1);
  H5Fclose(f);
}
const char* kGoodStructure =
    R"({"kind":"map","keys":["w"],"values":[{"kind":"tensor","dataset":"w","dtype":"f32","shape":[3]}]})";
}  // namespace

// A FIFO given as a checkpoint is refused at once: opening it waited for a writer forever. A
// thread opens the FIFO for writing after 3 s, so that a reader blocked in open() returns
// (and the test ends); the refusal must come before that.
TEST(Checkpoint, AFifoIsRefusedNotWaitedOn) {
  auto dir = temp_dir("fifo");
  const std::string fifo = (dir / "ckpt.mdl").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::atomic<bool> done{false};
  std::thread unblock([&] {
    const auto start = std::chrono::steady_clock::now();
    while (!done && std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
      if (std::chrono::steady_clock::now() - start > std::chrono::seconds(3)) {
        int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);  // succeeds once a reader waits
        if (fd >= 0) ::close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_ERROR_HAS(load(fifo), "not a regular file");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
  done = true;
  unblock.join();
  fs::remove_all(dir);
}

TEST(Checkpoint, Hdf5ErrorsNameTheProblem) {
  auto dir = temp_dir("h5err");
  std::string p = (dir / "x.mdl").string();
  craft(p, true, 1, kGoodStructure);
  EXPECT_EQ(load(p).at("w").as_tensor().to_vector<float>(), (std::vector<float>{1, 2, 3}));
  craft(p, false, 1, kGoodStructure);
  EXPECT_ERROR_HAS(load(p), "is partially written (no __SUCCESS__ marker)");
  craft(p, true, 2, kGoodStructure);
  EXPECT_ERROR_HAS(load(p),
                   "has format version 2, newer than this build of cstorch reads (up to 1)");
  craft(p, true, 1, "{not json");
  EXPECT_ERROR_HAS(load(p), "not valid JSON");
  craft(
      p, true, 1,
      R"({"kind":"map","keys":["w"],"values":[{"kind":"tensor","dataset":"w","dtype":"f32","shape":[4]}]})");
  EXPECT_ERROR_HAS(load(p),
                   "tensor 'w' (dataset 'w') has shape [3] but the structure description says [4]");
  craft(
      p, true, 1,
      R"({"kind":"map","keys":["w"],"values":[{"kind":"tensor","dataset":"w","dtype":"i64","shape":[3]}]})");
  EXPECT_ERROR_HAS(load(p), "does not hold i64");
  craft(
      p, true, 1,
      R"({"kind":"map","keys":["v"],"values":[{"kind":"tensor","dataset":"nope","dtype":"f32","shape":[3]}]})");
  EXPECT_ERROR_HAS(load(p), "tensor 'v' (dataset 'nope') is missing or damaged");
  craft(p, true, 1, R"({"kind":"map","keys":["a"],"values":[{"kind":"set"}]})");
  EXPECT_ERROR_HAS(load(p), "damaged structure description at 'a': unknown kind \"set\"");
  craft(p, true, 1, kGoodStructure, true, "bf16");
  EXPECT_ERROR_HAS(load(p), "is marked dtype \"bf16\" but the structure description says f32");
  hid_t f = H5Fcreate(p.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Fclose(f);
  EXPECT_ERROR_HAS(load(p), "not a cstorch checkpoint (no cstorch_format_version attribute)");
  fs::remove_all(dir);
}

TEST(Checkpoint, InfoAndDiff) {
  auto dir = temp_dir("info");
  std::string a = (dir / "a.mdl").string(), b = (dir / "b.pt").string();
  Tensor w = rt({4, 3}, 1);
  save(State::map({{"model", State::map({{"w", w}, {"tied", w}, {"b", rt({4}, 2)}})}, {"step", 3}}),
       a);
  std::string info = checkpoint_info(a);
  EXPECT_NE(info.find("format: hdf5 (version 1)"), std::string::npos) << info;
  EXPECT_NE(info.find("tensors: 3 (1 shared), 64 B stored (64 bytes)"), std::string::npos) << info;
  EXPECT_NE(info.find("model.w"), std::string::npos) << info;
  EXPECT_NE(info.find("[4, 3]"), std::string::npos) << info;
  EXPECT_NE(info.find("(shared with model.w)"), std::string::npos) << info;
  EXPECT_NE(info.find("step"), std::string::npos) << info;
  convert_checkpoint(a, b);
  auto same = checkpoint_diff(a, b);
  EXPECT_TRUE(same.identical()) << format_checkpoint_diff(same);
  Tensor w2 = w + 0.5;
  save(State::map({{"model", State::map({{"w", w2}, {"b", rt({5}, 2)}, {"extra", rt({1})}})},
                   {"step", 4}}),
       b);
  auto d = checkpoint_diff(a, b);
  EXPECT_FALSE(d.identical());
  EXPECT_EQ(d.only_in_a, std::vector<std::string>{"model.tied"});
  EXPECT_EQ(d.only_in_b, std::vector<std::string>{"model.extra"});
  std::string text = format_checkpoint_diff(d);
  EXPECT_NE(text.find("model.w: max abs diff 0.5"), std::string::npos) << text;
  EXPECT_NE(text.find("model.b: shape [4] vs [5]"), std::string::npos) << text;
  EXPECT_NE(text.find("step: value 3 vs 4"), std::string::npos) << text;
  fs::remove_all(dir);
}

TEST(Checkpoint, LargeStructureDescription) {
  // Thousands of keys: the JSON description exceeds HDF5's 64 KiB compact attribute limit.
  auto dir = temp_dir("large");
  State s = State::map();
  for (int i = 0; i < 3000; ++i)
    s.set(fmt::format("layer_{:05d}.some.long.parameter.name", i),
          i % 7 ? State(i) : State(rt({2})));
  std::string p = (dir / "big.mdl").string();
  save(s, p);
  EXPECT_TRUE(load(p) == s);
  fs::remove_all(dir);
}

// Reading one tensor before anything else takes the direct path (the dataset named after the
// key, marked with its key); tied keys, keys of files without the mark, and unknown keys go
// through the structure description and give the same answers.
TEST(Checkpoint, OneTensorReadWithoutTheStructure) {
  auto dir = temp_dir("direct");
  Tensor w = rt({3, 4}, 7);
  State s = State::map({{"model", State::map({{"w", w}, {"b", rt({4}, 8)}, {"tied", w}})},
                        {"odd/key%", rt({2}, 9)},
                        {"step", 5}});
  std::string p = (dir / "c.mdl").string();
  save(s, p);
  auto check = [&](const std::string& path) {
    for (const char* key : {"model.w", "model.b", "model.tied", "odd/key%"}) {
      SCOPED_TRACE(key);
      CheckpointReader fresh(path);  // nothing read yet: the direct path where it applies
      Tensor got = fresh.read(key);
      const Tensor& want = std::string(key) == "model.b"    ? s.at("model").at("b").as_tensor()
                           : std::string(key) == "odd/key%" ? s.at("odd/key%").as_tensor()
                                                            : w;
      EXPECT_EQ(got.shape(), want.shape());
      EXPECT_EQ(got.to_vector<float>(), want.to_vector<float>());
    }
    CheckpointReader fresh(path);
    EXPECT_ERROR_HAS(fresh.read("model.nope"), "no tensor 'model.nope'");
  };
  check(p);
  // The same file without the key marks (as an older writer or another program leaves it).
  hid_t f = H5Fopen(p.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  for (const char* name : {"model.w", "model.b", "odd%2Fkey%25"}) {
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    ASSERT_GE(ds, 0) << name;
    EXPECT_GE(H5Adelete(ds, "cstorch_key"), 0);
    H5Dclose(ds);
  }
  H5Fclose(f);
  check(p);
  fs::remove_all(dir);
}

namespace cstorch::testing {
namespace {

// The zip records of a .pt file: (name, data offset, size, method), from the local headers in
// order.
std::vector<std::tuple<std::string, uint64_t, uint64_t, uint16_t>> local_records(
    const std::string& b) {
  std::vector<std::tuple<std::string, uint64_t, uint64_t, uint16_t>> r;
  size_t at = 0;
  while (at + 30 <= b.size() && b.compare(at, 4, std::string("PK\x03\x04", 4)) == 0) {
    uint32_t size;
    uint16_t nlen, xlen, method;
    std::memcpy(&method, b.data() + at + 8, 2);
    std::memcpy(&size, b.data() + at + 22, 4);
    std::memcpy(&nlen, b.data() + at + 26, 2);
    std::memcpy(&xlen, b.data() + at + 28, 2);
    uint64_t data = at + 30 + nlen + xlen;
    r.emplace_back(b.substr(at + 30, nlen), data, size, method);
    at = static_cast<size_t>(data + size);
  }
  return r;
}

}  // namespace

TEST(CheckpointPt, RecordsAreAlignedStoredAndReproducible) {
  // Every record's data starts on a 64-byte boundary (as torch.save writes them), records are
  // stored, and two saves of the same state are the same bytes (no timestamps).
  auto dir = temp_dir("cstorch_ckpt", "pt_layout");
  State s = State::map({{"a", rt({3, 5}, 1)},
                        {"b", rt({7}, 2)},
                        {"n", 3},
                        {"long name " + std::string(37, 'x'), rt({1}, 3)}});
  std::string p = (dir / "a.pt").string(), q = (dir / "b.pt").string();
  save(s, p);
  save(s, q);
  std::string bytes = read_file(p);
  EXPECT_EQ(bytes, read_file(q));
  auto recs = local_records(bytes);
  ASSERT_EQ(recs.size(), 5u);  // data.pkl, 3 storages, version
  EXPECT_EQ(std::get<0>(recs.front()), "archive/data.pkl");
  EXPECT_EQ(std::get<0>(recs.back()), "archive/version");
  for (auto& [name, data, size, method] : recs) {
    EXPECT_EQ(data % 64, 0u) << name;
    EXPECT_EQ(method, 0) << name;  // stored
  }
  EXPECT_TRUE(load(p) == s);
  fs::remove_all(dir);
}

TEST(CheckpointPt, Zip64ArchiveOfManyRecords) {
  // More than 65535 records need the zip64 end of central directory; a read finds every
  // record and checks their CRCs as in any other file.
  auto dir = temp_dir("cstorch_ckpt", "pt_zip64");
  State s = State::list();  // (a list: a map this long is slow to build for other reasons)
  for (int i = 0; i < 70000; ++i) s.push_back(scalar_tensor(static_cast<float>(i)));
  std::string p = (dir / "many.pt").string();
  save(s, p);
  std::string bytes = read_file(p);
  EXPECT_NE(bytes.find(std::string("PK\x06\x06", 4)), std::string::npos);  // zip64 end record
  EXPECT_NE(bytes.find(std::string("PK\x06\x07", 4)), std::string::npos);  // and its locator
  State back = load(p);
  ASSERT_EQ(back.size(), 70000u);
  EXPECT_EQ(back[69999].as_tensor().item<float>(), 69999.0f);
  EXPECT_TRUE(back == s);
  // Damage in the last storage is found.
  float v = 69999.0f;
  std::string last(reinterpret_cast<const char*>(&v), 4);
  size_t at = bytes.rfind(last);
  ASSERT_NE(at, std::string::npos);
  bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
  write_file(p, bytes);
  EXPECT_ERROR_HAS(load(p), "CRC-32");
  fs::remove_all(dir);
}

}  // namespace cstorch::testing
