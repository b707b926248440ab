// End to end: a save killed with SIGKILL half way leaves the previous checkpoint loadable and
// the partial file refused; a run resumed from a checkpoint in a new process reproduces the
// uninterrupted run bit for bit; the cszoo checkpoint commands (verify on damaged files too).
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include "e2e/e2e_util.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "cstorch/data/mnist.h"

extern char** environ;
namespace fs = std::filesystem;
using namespace cstorch;

using e2e::run;

namespace {

fs::path temp_dir(const std::string& name) {
  return e2e::temp_dir("cstorch_e2e", name);
}

const std::string kHelper = std::string(CSTORCH_BINARY_DIR) + "/tests/ckpt_helper";
const std::string kCszoo = std::string(CSTORCH_BINARY_DIR) + "/cszoo";
}  // namespace

TEST(CheckpointE2E, KilledSaveKeepsPreviousCheckpointAndPartialFileIsRefused) {
  auto dir = temp_dir("crash");
  std::string path = (dir / "checkpoint_10.mdl").string();
  State previous = State::map({{"model", State::map({{"w", full({1000}, 1.5)}})}, {"step", 10}});
  save(previous, path);

  // The writer pauses half way through a 64 MB save (after flushing what it has written).
  std::string signal = (dir / "paused").string();
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.push_back(*e);
  env_s.push_back("CSTORCH_TEST_PAUSE_SAVE=" + signal);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args_s = {kHelper, "write-big", path, "64"};
  std::vector<char*> argv;
  for (auto& a : args_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, kHelper.c_str(), nullptr, nullptr, argv.data(), envp.data()), 0);
  auto t0 = std::chrono::steady_clock::now();
  while (!fs::exists(signal) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(fs::exists(signal)) << "the writer never reached the pause point";
  std::string temp;
  std::getline(std::ifstream(signal), temp);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  int st = 0;
  waitpid(pid, &st, 0);
  EXPECT_TRUE(WIFSIGNALED(st));

  // The previous checkpoint is intact; the half-written temporary file is refused.
  EXPECT_TRUE(load(path) == previous);
  ASSERT_TRUE(fs::exists(temp)) << temp;
  EXPECT_GT(fs::file_size(temp), 16u << 20) << "the writer had not written much";
  EXPECT_EQ(fs::path(temp).parent_path(), dir) << "temporary file must be in the same folder";
  try {
    load(temp);
    FAIL() << "a partial checkpoint loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("partially written"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(temp), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(CheckpointE2E, ResumeInNewProcessIsBitwiseExact) {
  auto dir = temp_dir("resume");
  std::string data = (dir / "data").string();
  data::write_synthetic_mnist(data, 2000, 10, 5);
  auto losses = [](const std::string& out) {
    std::map<int, std::string> m;
    std::regex re(R"(step (\d+) loss ([0-9a-f]{8}))");
    for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it)
      m[std::stoi((*it)[1])] = (*it)[2];
    return m;
  };
  int status = 0;
  std::string base = kHelper + " train --data " + data;
  std::string straight =
      run(base + " --steps 60 --final " + (dir / "straight.mdl").string(), &status);
  ASSERT_EQ(status, 0) << straight;
  std::string first = run(base + " --steps 30 --save " + (dir / "mid.mdl").string(), &status);
  ASSERT_EQ(status, 0) << first;
  std::string second = run(base + " --steps 30 --resume " + (dir / "mid.mdl").string() +
                               " --final " + (dir / "resumed.mdl").string(),
                           &status);
  ASSERT_EQ(status, 0) << second;
  auto a = losses(straight), b = losses(first), c = losses(second);
  ASSERT_EQ(a.size(), 60u) << straight;
  ASSERT_EQ(b.size(), 30u) << first;
  ASSERT_EQ(c.size(), 30u) << second;
  for (int i = 0; i < 60; ++i)
    EXPECT_EQ(a[i], i < 30 ? b[i] : c[i]) << "loss differs at step " << i;
  EXPECT_NE(a[0], a[59]);  // it trained
  State s = load((dir / "straight.mdl").string());
  State r = load((dir / "resumed.mdl").string());
  EXPECT_TRUE(s == r) << "final weights differ";
  fs::remove_all(dir);
}

TEST(CheckpointE2E, CszooCheckpointCommands) {
  auto dir = temp_dir("cszoo");
  std::string a = (dir / "a.mdl").string(), b = (dir / "b.pt").string();
  save(State::map({{"model", State::map({{"fc.weight", full({3, 2}, 0.25)}})}, {"step", 5}}), a);
  int status = 0;
  std::string out = run(kCszoo + " checkpoint info " + a, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("format: hdf5 (version 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("model.fc.weight"), std::string::npos) << out;
  EXPECT_NE(out.find("[3, 2]"), std::string::npos) << out;
  out = run(kCszoo + " checkpoint convert " + a + " " + b, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("(pytorch)"), std::string::npos) << out;
  out = run(kCszoo + " checkpoint diff " + a + " " + b, &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("identical"), std::string::npos) << out;
  // An output name whose extension names no format is refused, not written as HDF5; nothing
  // is written.
  const std::string bin = (dir / "pytorch_model.bin").string();
  out = run(kCszoo + " checkpoint convert " + a + " " + bin, &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("error: checkpoint convert: cannot tell the output format from '" + bin +
                     "' (extension '.bin'): name it .mdl or .h5 (HDF5), .pt or .pth"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(bin));
  // A word that names no checkpoint command, and none at all.
  out = run(kCszoo + " checkpoint frob " + a, &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("error: unknown command 'checkpoint frob' (checkpoint commands: info, diff, "
                     "convert, verify; cszoo checkpoint --help says more)"),
            std::string::npos)
      << out;
  out = run(kCszoo + " checkpoint", &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("error: 'cszoo checkpoint' needs a command (checkpoint commands: info, "),
            std::string::npos)
      << out;
  out = run(kCszoo, &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("error: 'cszoo' needs a command (commands: fit, "), std::string::npos) << out;
  save(State::map({{"model", State::map({{"fc.weight", full({3, 2}, 0.5)}})}, {"step", 5}}), b);
  out = run(kCszoo + " checkpoint diff " + a + " " + b, &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("model.fc.weight: max abs diff 0.25"), std::string::npos) << out;
  out = run(kCszoo + " checkpoint info " + (dir / "missing.mdl").string(), &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("error: cannot open checkpoint"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(CheckpointE2E, CszooCheckpointVerify) {
  auto dir = temp_dir("verify");
  std::vector<float> w(60), b(6);
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.37f * static_cast<float>(i) - 5.1f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 1.0f / static_cast<float>(i + 3);
  State s = State::map({{"model", State::map({{"fc.weight", from_vector(w, {10, 6})},
                                              {"fc.bias", from_vector(b, {6})}})},
                        {"step", 5}});
  for (const char* ext : {".mdl", ".pt", ".safetensors"}) {
    SCOPED_TRACE(ext);
    std::string p = (dir / (std::string("c") + ext)).string();
    save(s, p);
    int status = 0;
    std::string out = run(kCszoo + " checkpoint verify " + p, &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_EQ(out, "2 tensors verified, all intact\n");
    // One bit of each tensor's data flipped.
    std::ifstream in(p, std::ios::binary);
    std::string file((std::istreambuf_iterator<char>(in)), {});
    for (const std::vector<float>* v : {&w, &b}) {
      size_t at = file.find(std::string(reinterpret_cast<const char*>(v->data()), v->size() * 4));
      ASSERT_NE(at, std::string::npos);
      file[at + 9] = static_cast<char>(file[at + 9] ^ 0x08);
    }
    std::ofstream(p, std::ios::binary | std::ios::trunc) << file;
    out = run(kCszoo + " checkpoint verify " + p, &status);
    EXPECT_EQ(status, 2) << out;
    EXPECT_NE(out.find("damaged: model.fc.weight: "), std::string::npos) << out;
    EXPECT_NE(out.find("damaged: model.fc.bias: "), std::string::npos) << out;
    EXPECT_NE(out.find("2 tensors verified, 2 damaged"), std::string::npos) << out;
  }
  int status = 0;
  std::string out = run(kCszoo + " checkpoint verify " + (dir / "missing.mdl").string(), &status);
  EXPECT_EQ(status, 1) << out;
  EXPECT_NE(out.find("error: cannot open checkpoint"), std::string::npos) << out;
  fs::remove_all(dir);
}
