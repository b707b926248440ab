// Checkpoint interchange with Python (tests/reference/checkpoint_interop.py): h5py reads every
// tensor and the metadata of a cstorch HDF5 file; torch.load reads an exported .pt; a hand
// parser reads our safetensors; files written by h5py (following docs/checkpoint-format.md),
// by torch.save (views, OrderedDicts, int keys, tuples, tied tensors) and by hand as
// safetensors load in cstorch with the exact bytes; a torch model's state dict loads into the
// same cstorch model, whose outputs match torch's; float64 tensors read as f32.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "ref_util.h"

namespace cstorch::reftest {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

std::string tensor_bytes(const Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()),
                     static_cast<size_t>(t.numel()) * itemsize(t.dtype()));
}

json scalar_json(const State& s) {
  switch (s.kind()) {
    case State::Kind::None:
      return nullptr;
    case State::Kind::Bool:
      return s.as_bool();
    case State::Kind::Int:
      return s.as_int();
    case State::Kind::Float:
      return s.as_double();
    default:
      return s.as_string();
  }
}

// Writes `dir`/manifest.json and one .bin per tensor (the format the Python script checks).
void write_manifest(const State& s, const fs::path& dir, const json& tied) {
  json tensors = json::array(), values = json::array();
  std::function<void(const State&, json)> walk = [&](const State& v, json path) {
    if (v.is_map()) {
      for (size_t i = 0; i < v.size(); ++i) {
        json p = path;
        p.push_back(v.keys()[i]);
        walk(v.items()[i], p);
      }
    } else if (v.is_list()) {
      for (size_t i = 0; i < v.size(); ++i) {
        json p = path;
        p.push_back(i);
        walk(v[i], p);
      }
    } else if (v.is_tensor()) {
      std::string f = std::to_string(tensors.size()) + ".bin";
      std::ofstream(dir / f, std::ios::binary) << tensor_bytes(v.as_tensor());
      tensors.push_back({{"path", path},
                         {"dtype", dtype_name(v.as_tensor().dtype())},
                         {"shape", v.as_tensor().shape()},
                         {"file", f}});
    } else if (!(v.is_float() && std::isnan(v.as_double())) &&
               !(v.is_float() && std::isinf(v.as_double()))) {
      values.push_back({{"path", path}, {"value", scalar_json(v)}});
    }
  };
  walk(s, json::array());
  write_json(dir / "manifest.json", {{"tensors", tensors}, {"values", values}, {"tied", tied}});
}

// Follows a manifest path (strings index maps, numbers index lists).
const State& lookup(const State& s, const json& path) {
  const State* v = &s;
  for (auto& p : path) v = p.is_string() ? &v->at(p.get<std::string>()) : &(*v)[p.get<size_t>()];
  return *v;
}

// Checks a loaded state against the manifest Python wrote.
void check_against_manifest(const State& s, const fs::path& dir, bool with_values = true) {
  json m = read_json(dir / "manifest.json");
  for (auto& t : m["tensors"]) {
    SCOPED_TRACE(t["path"].dump());
    const Tensor& x = lookup(s, t["path"]).as_tensor();
    EXPECT_EQ(dtype_name(x.dtype()), t["dtype"].get<std::string>());
    EXPECT_EQ(x.shape(), t["shape"].get<Shape>());
    EXPECT_TRUE(tensor_bytes(x) == read_file(dir / t["file"].get<std::string>()));
  }
  if (!with_values) return;
  for (auto& v : m["values"]) {
    SCOPED_TRACE(v["path"].dump());
    EXPECT_EQ(scalar_json(lookup(s, v["path"])), v["value"]);
  }
  for (auto& pair : m["tied"])
    EXPECT_EQ(lookup(s, pair[0]).as_tensor().impl(), lookup(s, pair[1]).as_tensor().impl());
}

State cstorch_state() {
  Rng rng(7);
  auto vals = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = static_cast<float>(rng.normal());
    return v;
  };
  Tensor tied = from_vector(vals(12), {3, 4});
  State model =
      State::map({{"fc1.weight", from_vector(vals(12), {4, 3})},
                  {"fc1.bias", from_vector(vals(4), {4})},
                  {"bf16", from_vector(vals(6), {2, 3}).to(DType::bf16)},
                  {"f16", from_vector(vals(3), {3}).to(DType::f16)},
                  {"i32", from_vector(std::vector<int32_t>{7, -8, 9}, {3})},
                  {"i64", from_vector(std::vector<int64_t>{INT64_MIN, 5}, {2})},
                  {"bool", from_vector(std::vector<uint8_t>{1, 0, 0}, {3}, DType::boolean)},
                  {"scalar", scalar_tensor(-1.5)},
                  {"empty", zeros({2, 0})},
                  {"emb.weight", tied},
                  {"head.weight", tied}});
  return State::map(
      {{"model", model},
       {"optimizer",
        State::map(
            {{"state", State::map({{"0", State::map({{"exp_avg", from_vector(vals(4), {4})},
                                                     {"step", 3}})}})},
             {"param_groups", State(std::vector<State>{State::map(
                                  {{"lr", 0.001}, {"amsgrad", false}, {"name", "dense"}})})}})},
       {"global_step", 30},
       {"none", nullptr},
       {"unicode ключ", "värde"}});
}

class CheckpointInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = torch_unavailable_reason();
    if (!why.empty()) GTEST_FAIL() << why;
    dir_ = make_temp_dir("ckpt_interop");
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

const json kTied = json::array(
    {json::array({json::array({"model", "emb.weight"}), json::array({"model", "head.weight"})})});

TEST_F(CheckpointInterop, PythonReadsWhatCstorchWrites) {
  State s = cstorch_state();
  write_manifest(s, dir_, kTied);
  std::string out;
  save(s, (dir_ / "c.mdl").string());
  EXPECT_EQ(run_reference_script("checkpoint_interop.py",
                                 {"check-h5", (dir_ / "c.mdl").string(), dir_.string()}, &out),
            0)
      << out;
  save(s, (dir_ / "c.pt").string());
  EXPECT_EQ(run_reference_script("checkpoint_interop.py",
                                 {"check-pt", (dir_ / "c.pt").string(), dir_.string()}, &out),
            0)
      << out;
  save(s, (dir_ / "c.safetensors").string());
  EXPECT_EQ(
      run_reference_script("checkpoint_interop.py",
                           {"check-st", (dir_ / "c.safetensors").string(), dir_.string()}, &out),
      0)
      << out;
  // A flat map of distinct tensors is a plain safetensors file (no structure metadata; only
  // the tensors' checksums in __metadata__).
  State flat = State::map({{"a", lookup(s, json::array({"model", "fc1.weight"}))},
                           {"b", lookup(s, json::array({"model", "bf16"}))}});
  fs::create_directories(dir_ / "flat");
  write_manifest(flat, dir_ / "flat", json::array());
  save(flat, (dir_ / "flat" / "f.safetensors").string());
  EXPECT_EQ(
      run_reference_script(
          "checkpoint_interop.py",
          {"check-st", (dir_ / "flat" / "f.safetensors").string(), (dir_ / "flat").string()}, &out),
      0)
      << out;
  EXPECT_EQ(read_file(dir_ / "flat" / "f.safetensors").find("cstorch_structure"),
            std::string::npos);
}

TEST_F(CheckpointInterop, TorchReadsZip64Archives) {
  // More than 65535 records: the archive needs zip64 end records, which torch.load must follow.
  State s = State::list();
  for (int i = 0; i < 70000; ++i) s.push_back(scalar_tensor(static_cast<float>(i)));
  std::string p = (dir_ / "many.pt").string();
  save(s, p);
  std::string out;
  int rc = run_command(shell_quote(python_path()) +
                           " -c 'import sys, torch; x = torch.load(sys.argv[1]); "
                           "assert len(x) == 70000, len(x); "
                           "assert all(float(t) == i for i, t in enumerate(x)); print(\"OK\")' " +
                           shell_quote(p),
                       &out);
  EXPECT_EQ(rc, 0) << out;
}

TEST_F(CheckpointInterop, CstorchReadsWhatPythonWrites) {
  std::string out;
  ASSERT_EQ(run_reference_script("checkpoint_interop.py", {"write", dir_.string()}, &out), 0)
      << out;
  // torch.save: everything in the manifest, exact bytes, shared tensors shared.
  State pt = load((dir_ / "torch.pt").string());
  check_against_manifest(pt, dir_);
  EXPECT_EQ(pt.at("pair").size(), 4u);  // a tuple loads as a list
  // h5py following the format document: the model tensors and two values.
  State h5 = load((dir_ / "py.mdl").string());
  json m = read_json(dir_ / "manifest.json");
  for (auto& t : m["tensors"]) {
    if (t["path"][0] != "model" || !h5.at("model").contains(t["path"][1])) continue;
    SCOPED_TRACE(t["path"].dump());
    const Tensor& x = lookup(h5, t["path"]).as_tensor();
    EXPECT_EQ(dtype_name(x.dtype()), t["dtype"].get<std::string>());
    EXPECT_TRUE(tensor_bytes(x) == read_file(dir_ / t["file"].get<std::string>()));
  }
  EXPECT_EQ(h5.at("model").size(), 8u);
  EXPECT_EQ(h5.at("global_step").as_int(), 1234567890123);
  EXPECT_EQ(h5.at("lr").as_double(), 0.1);
  // safetensors by hand: a flat map in header order.
  State st = load((dir_ / "py.safetensors").string());
  ASSERT_EQ(st.size(), 8u);
  EXPECT_EQ(st.keys().front(), "model.f32");
  for (auto& k : st.keys()) EXPECT_TRUE(st.at(k) == h5.at("model").at(k.substr(6))) << k;
  // Reading one tensor of the torch file lazily.
  CheckpointReader r((dir_ / "torch.pt").string());
  EXPECT_EQ(r.info("model.transposed").shape, (Shape{8, 6}));
  EXPECT_EQ(r.info("model.dec.weight").shared_with, "model.enc.weight");
  EXPECT_EQ(tensor_bytes(r.read("model.cols")),
            tensor_bytes(pt.at("model").at("cols").as_tensor()));
}

// float64 tensors (a state dict made from NumPy arrays) read as f32, each value rounded as
// torch's .float() rounds it, from torch.save (contiguous and strided views) and safetensors;
// `checkpoint info` says so; a finite value beyond float32 is an error naming its element.
TEST_F(CheckpointInterop, Float64TensorsReadAsF32AsTorchRoundsThem) {
  std::string out;
  ASSERT_EQ(run_reference_script("checkpoint_interop.py", {"write-f64", dir_.string()}, &out), 0)
      << out;
  State pt = load((dir_ / "f64.pt").string());
  check_against_manifest(pt, dir_);
  EXPECT_EQ(pt.size(), 4u);
  CheckpointReader r((dir_ / "f64.pt").string());
  EXPECT_EQ(r.info("w").file_dtype, "float64");
  EXPECT_EQ(r.info("w").nbytes, 12 * 4);
  EXPECT_EQ(r.info("f32").file_dtype, "");
  EXPECT_EQ(tensor_bytes(r.read("transposed")), tensor_bytes(pt.at("transposed").as_tensor()));
  State st = load((dir_ / "f64.safetensors").string());
  ASSERT_EQ(st.size(), 2u);
  EXPECT_TRUE(st.at("w") == pt.at("w"));
  EXPECT_TRUE(st.at("f32") == pt.at("f32"));
  std::string info = checkpoint_info((dir_ / "f64.pt").string());
  EXPECT_NE(info.find("[3, 4]                    48 B  (float64 in the file, read as f32)"),
            std::string::npos)
      << info;
  EXPECT_NE(checkpoint_info((dir_ / "f64.safetensors").string())
                .find("(float64 in the file, read as f32)"),
            std::string::npos);
  const std::string big = (dir_ / "big.pt").string();
  EXPECT_NE(checkpoint_info(big).find("float64"), std::string::npos);  // listed, not read
  try {
    (void)load(big);
    ADD_FAILURE() << "1e39 loaded as f32";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "tensor 'w' is float64 in the file and its element 2 (1e+39) is beyond "
                  "float32's range"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(CheckpointInterop, TorchModelLoadsAndMatchesOutputs) {
  std::string out;
  ASSERT_EQ(run_reference_script("checkpoint_interop.py", {"model", dir_.string()}, &out), 0)
      << out;
  nn::Sequential net;
  net->push_back(nn::Linear(20, 32).module());
  net->push_back(nn::ReLU().module());
  net->push_back(nn::LayerNorm(Shape{32}).module());
  net->push_back(nn::Linear(32, 5).module());
  net->load_state_dict(nn::StateDict::from_state(load((dir_ / "model.pt").string())));
  std::string xb = read_file(dir_ / "x.bin"), yb = read_file(dir_ / "y.bin");
  ASSERT_EQ(xb.size(), 8u * 20 * 4);
  ASSERT_EQ(yb.size(), 8u * 5 * 4);
  Tensor x = from_blob(xb.data(), {8, 20}, DType::f32);
  std::vector<float> y = net->forward(x).to_vector<float>();
  std::vector<float> ref(40);
  std::memcpy(ref.data(), yb.data(), yb.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_NEAR(y[i], ref[i], 1e-5 * std::max(1.0f, std::abs(ref[i]))) << i;
  // And back: the cstorch state dict exported to .pt loads into torch (checked by bytes).
  State sd = net->state_dict().to_state();
  fs::create_directories(dir_ / "back");
  write_manifest(sd, dir_ / "back", json::array());
  save(sd, (dir_ / "back" / "m.pt").string());
  EXPECT_EQ(run_reference_script(
                "checkpoint_interop.py",
                {"check-pt", (dir_ / "back" / "m.pt").string(), (dir_ / "back").string()}, &out),
            0)
      << out;
}

}  // namespace
}  // namespace cstorch::reftest
