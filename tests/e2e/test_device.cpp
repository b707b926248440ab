// The Model Zoo Trainer on the checking device (tests/support/checking_device.h), loaded into
// cszoo as a plugin: fit, validate, checkpoint and resume, and a 2-replica launch, each bitwise
// equal to the same run on the CPU (the device runs the CPU kernels through the device ABI, and
// any host access to its memory outside its kernels and transfers would crash the run).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>

#include <cstorch/checkpoint.h>

#include "e2e_util.h"

namespace fs = std::filesystem;

namespace {

const std::string kBin = CSTORCH_BINARY_DIR;
const std::string kCszoo = kBin + "/cszoo";
const std::string kDevicePlugin = kBin + "/tests/device_plugins";

using e2e::mpirun;

// FC-MNIST for `steps` steps on `device`, validating and checkpointing every 30 steps.
std::string write_config(const fs::path& root, const std::string& name, const std::string& device,
                         int steps) {
  const fs::path p = root / (name + ".yaml");
  std::ofstream(p) << "trainer:\n  init:\n    device: " << device
                   << "\n    model_dir: " << (root / name).string()
                   << "\n    seed: 1\n    model: {name: fc_mnist, hidden_sizes: [64, 32]}\n"
                      "    optimizer: {SGD: {lr: 0.05, momentum: 0.9}}\n"
                      "    loop: {max_steps: "
                   << steps
                   << ", eval_frequency: 30}\n"
                      "    checkpoint: {steps: 30, keep_last: 5}\n"
                      "    logging: {log_steps: 10}\n    loggers: [JSONLines]\n"
                      "  fit:\n    train_dataloader: {data_processor: MNISTDataProcessor, "
                      "data_dir: "
                   << (root / "mnist").string()
                   << ", split: train, batch_size: 32, shuffle_seed: 1}\n"
                      "    val_dataloader: {data_processor: MNISTDataProcessor, data_dir: "
                   << (root / "mnist").string()
                   << ", split: test, batch_size: 1000}\n"
                      "  validate:\n    val_dataloader: {data_processor: MNISTDataProcessor, "
                      "data_dir: "
                   << (root / "mnist").string() << ", split: test, batch_size: 1000}\n";
  return p.string();
}

// metrics.jsonl without its wall times: the logged values, step by step.
std::string metrics(const fs::path& model_dir) {
  std::ifstream in(model_dir / "metrics.jsonl");
  std::stringstream ss;
  ss << in.rdbuf();
  return std::regex_replace(ss.str(), std::regex("\"wall_time\":[^,}]*,?"), "");
}

std::string cszoo(const std::string& args, int* st) {
  return e2e::run(kCszoo + " " + args, st);
}

void expect_same_checkpoint(const fs::path& a, const fs::path& b) {
  ASSERT_TRUE(fs::exists(a)) << a;
  ASSERT_TRUE(fs::exists(b)) << b;
  EXPECT_TRUE(cstorch::load(a.string()) == cstorch::load(b.string())) << a << " vs " << b;
}

TEST(DeviceE2E, FcMnistFitValidateCheckpointResumeOnTheCheckingDevice) {
  const fs::path root = e2e::temp_dir("cstorch_device", "fc");
  // The plugin as a file (--plugin_paths) and as a folder (--python_paths, the seed's name).
  const std::string plug_file = " --plugin_paths " + kDevicePlugin + "/check_device_plugin.so";
  const std::string plug = " --python_paths " + kDevicePlugin;
  int st = 0;
  // 60 steps, then resumed to 90, on each device.
  for (const std::string dev : {"check", "CPU"}) {
    std::string out =
        cszoo("fit " + write_config(root, dev, dev, 60) + (dev == "check" ? plug_file : plug), &st);
    ASSERT_EQ(st, 0) << out;
    out = cszoo("fit " + write_config(root, dev, dev, 90) + plug, &st);
    ASSERT_EQ(st, 0) << out;
    EXPECT_NE(out.find("checkpoint_60"), std::string::npos) << "did not resume:\n" << out;
  }
  const std::string on_device = metrics(root / "check"), on_cpu = metrics(root / "CPU");
  EXPECT_NE(on_device.find("\"step\":90"), std::string::npos) << on_device;
  EXPECT_NE(on_device.find("eval/accuracy"), std::string::npos) << on_device;
  EXPECT_EQ(on_device, on_cpu);  // every logged loss, LR and eval value, bitwise
  for (int s : {30, 60, 90})
    expect_same_checkpoint(root / "check" / ("checkpoint_" + std::to_string(s) + ".mdl"),
                           root / "CPU" / ("checkpoint_" + std::to_string(s) + ".mdl"));
  // Validation of the latest checkpoint prints the same figures on both.
  std::string v_dev = cszoo("validate " + write_config(root, "check", "check", 90) + plug, &st);
  ASSERT_EQ(st, 0) << v_dev;
  std::string v_cpu = cszoo("validate " + write_config(root, "CPU", "CPU", 90) + plug, &st);
  ASSERT_EQ(st, 0) << v_cpu;
  std::smatch m_dev, m_cpu;
  const std::regex line("validation at step 90: loss [0-9.]+ +accuracy [0-9.]+");
  ASSERT_TRUE(std::regex_search(v_dev, m_dev, line)) << v_dev;
  ASSERT_TRUE(std::regex_search(v_cpu, m_cpu, line)) << v_cpu;
  EXPECT_EQ(m_dev.str(), m_cpu.str());
  fs::remove_all(root);
}

// Two replicas, each on its own checking device (collectives reduce through host staging):
// the same checkpoint as two replicas on the CPU.
TEST(DeviceE2E, TwoReplicasOnTheCheckingDevice) {
  const fs::path root = e2e::temp_dir("cstorch_device", "dp");
  int st = 0;
  std::string out =
      e2e::run(mpirun(2) + kCszoo + " fit " + write_config(root, "check", "check", 60) +
                   " --multireplica --python_paths " + kDevicePlugin,
               &st);
  ASSERT_EQ(st, 0) << out;
  out = e2e::run(
      mpirun(2) + kCszoo + " fit " + write_config(root, "CSX", "CSX", 60) + " --multireplica", &st);
  ASSERT_EQ(st, 0) << out;
  std::ifstream meta(root / "check" / "run_metadata.json");
  std::stringstream ms;
  ms << meta.rdbuf();
  EXPECT_NE(ms.str().find("\"replicas\": 2"), std::string::npos) << ms.str();
  EXPECT_NE(ms.str().find("\"backend\": \"check\""), std::string::npos) << ms.str();
  EXPECT_EQ(metrics(root / "check"), metrics(root / "CSX"));
  expect_same_checkpoint(root / "check" / "checkpoint_60.mdl", root / "CSX" / "checkpoint_60.mdl");
  fs::remove_all(root);
}

}  // namespace
