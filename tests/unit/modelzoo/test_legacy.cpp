// Legacy params.yaml conversion and the runner API: a custom runner's hooks fire in the
// documented order (end hooks only after a successful finish).
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

#include "cstorch/cstorch.h"
#include "modelzoo/legacy.h"

namespace cs = cstorch;
using modelzoo::Config;

namespace {

Config legacy(const std::string& mode, const std::string& extra = "") {
  // One folder per test: ctest runs tests in parallel processes.
  auto dir = std::filesystem::temp_directory_path() /
             (std::string("cstorch_legacy_") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
              std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return cs::parse_config(
      "train_input: {data_processor: TinyData, batches: 4, batch_size: 4}\n"
      "eval_input: {data_processor: TinyData, batches: 2, batch_size: 4}\n"
      "model: {name: fc_mnist, depth: 1, hidden_size: 8}\n"
      "optimizer: {optimizer_type: SGD, learning_rate: 0.1, momentum: 0.5}\n"
      "runconfig:\n"
      "  max_steps: 4\n"
      "  save_summary_steps: 2\n"
      "  save_checkpoints_steps: 0\n"
      "  model_dir: " +
      dir.string() +
      "\n"
      "  mode: " +
      mode + "\n" + extra);
}

class RecordingRunner : public modelzoo::CpuGpuRunner {
 public:
  static std::vector<std::string> log;
  using CpuGpuRunner::CpuGpuRunner;
  std::string name() const override { return "RecordingRunner"; }
  void on_train_start() override {
    log.push_back("train_start");
    CpuGpuRunner::on_train_start();
  }
  void on_train_end() override { log.push_back("train_end"); }
  void on_eval_start() override { log.push_back("eval_start"); }
  void on_eval_end() override { log.push_back("eval_end"); }
  void on_train_epoch_start() override { log.push_back("train_epoch_start"); }
  void on_train_epoch_end() override { log.push_back("train_epoch_end"); }
  void on_eval_epoch_start() override { log.push_back("eval_epoch_start"); }
  void on_eval_epoch_end() override { log.push_back("eval_epoch_end"); }
  void on_train_batch_start() override { log.push_back("train_batch_start"); }
  void on_train_batch_end() override { log.push_back("train_batch_end"); }
  void on_eval_batch_start() override { log.push_back("eval_batch_start"); }
  void on_eval_batch_end() override { log.push_back("eval_batch_end"); }
};
std::vector<std::string> RecordingRunner::log;

const bool registered = [] {
  modelzoo::BaseRunner::register_runner(
      "recording", [](const Config& p) { return std::make_unique<RecordingRunner>(p); });
  return true;
}();

}  // namespace

TEST(Legacy, ConvertsParamsToTheTrainerForm) {
  Config t = modelzoo::convert_legacy_params(legacy("train_and_eval"));
  const Config& init = t["trainer"]["init"];
  EXPECT_EQ(init["optimizer"], cs::parse_config("{SGD: {learning_rate: 0.1, momentum: 0.5}}"));
  EXPECT_EQ(init["loop"]["max_steps"], 4);
  EXPECT_EQ(init["logging"]["log_steps"], 2);
  EXPECT_EQ(init["checkpoint"]["steps"], 0);
  EXPECT_EQ(init["device"], "CPU");
  EXPECT_EQ(t["trainer"]["fit"]["val_dataloader"]["batches"], 2);
  EXPECT_EQ(modelzoo::convert_legacy_params(legacy("eval"))["trainer"].contains("validate"), true);
}

// runconfig.multireplica: True makes the CSX backend with every process of the
// launch a replica (a launch of one here), in training only; cs_ip is carried to the Trainer,
// which records it in the run metadata.
TEST(Legacy, MultireplicaAndCsIp) {
  Config t = modelzoo::convert_legacy_params(
      legacy("train", "  multireplica: True\n  cs_ip: 10.4.5.3\n  num_csx: 3\n"));
  const Config& init = t["trainer"]["init"];
  EXPECT_EQ(init["backend"]["backend_type"], "CSX");
  EXPECT_EQ(init["backend"]["cluster_config"]["num_csx"], 1);  // the launch, not num_csx
  EXPECT_EQ(init["cs_ip"], "10.4.5.3");
  ::testing::internal::CaptureStderr();
  Config e = modelzoo::convert_legacy_params(legacy("eval", "  multireplica: True\n"));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "warning: runconfig.multireplica is ignored in evaluation\n");
  EXPECT_EQ(e["trainer"]["init"]["device"], "CPU");
  Config off = modelzoo::convert_legacy_params(legacy("train", "  multireplica: False\n"));
  EXPECT_EQ(off["trainer"]["init"]["device"], "CPU");
  EXPECT_FALSE(off["trainer"]["init"].contains("cs_ip"));
  try {
    modelzoo::convert_legacy_params(legacy("train", "  multireplica: sometimes\n"));
    ADD_FAILURE() << "no error";
  } catch (const cs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("runconfig.multireplica"), std::string::npos) << e.what();
  }
}

TEST(Legacy, ErrorsNameTheLegacyKey) {
  auto err = [](const Config& c) {
    try {
      modelzoo::convert_legacy_params(c);
    } catch (const cs::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(err(legacy("train", "  save_checkpoint_steps: 3\n"))
                .find("runconfig.save_checkpoint_steps: unknown key"),
            std::string::npos);
  EXPECT_EQ(err(legacy("training")),
            "runconfig.mode: must be train, eval, train_and_eval or eval_all, got 'training'");
  Config noname = legacy("train");
  noname["model"].erase("name");
  EXPECT_EQ(err(noname),
            "model.name: missing; a legacy params file names its registered model here");
}

TEST(Legacy, FactoryPicksTheRunner) {
  EXPECT_EQ(modelzoo::BaseRunner::create(legacy("train"))->name(), "PyTorchRunner");
  EXPECT_EQ(modelzoo::BaseRunner::create(legacy("train", "  compile_only: true\n"))->name(),
            "PyTorchCSCompiler");
  EXPECT_EQ(modelzoo::BaseRunner::create(legacy("train", "  target_device: CSX\n"))->name(),
            "PyTorchCSRunner");
  EXPECT_EQ(modelzoo::BaseRunner::create(legacy("train", "  runner: recording\n"))->name(),
            "RecordingRunner");
  EXPECT_THROW(modelzoo::BaseRunner::create(legacy("train", "  runner: nope\n")), cs::Error);
}

TEST(Legacy, CustomRunnerHooksFireInOrder) {
  RecordingRunner::log.clear();
  auto runner = modelzoo::BaseRunner::create(
      legacy("train_and_eval", "  eval_frequency: 2\n  eval_steps: 1\n  runner: recording\n"));
  runner->run("");
  std::vector<std::string> want = {
      "train_start",       "train_epoch_start", "train_batch_start", "train_batch_end",
      "train_batch_start", "train_batch_end",   "eval_start",        "eval_epoch_start",
      "eval_batch_start",  "eval_batch_end",    "eval_epoch_end",    "eval_end",
      "train_batch_start", "train_batch_end",   "train_batch_start", "train_batch_end",
      "train_epoch_end",   "train_end",         "eval_start",        "eval_epoch_start",
      "eval_batch_start",  "eval_batch_end",    "eval_epoch_end",    "eval_end"};
  EXPECT_EQ(RecordingRunner::log, want);
}

TEST(Legacy, EndHooksOnlyAfterSuccess) {
  RecordingRunner::log.clear();
  Config p = legacy("train", "  runner: recording\n");
  p["model"] = {{"name", "broken_for_test"}};
  auto runner = modelzoo::BaseRunner::create(p);
  EXPECT_THROW(runner->run(""), cs::Error);
  EXPECT_EQ(RecordingRunner::log,
            (std::vector<std::string>{"train_start", "train_epoch_start", "train_batch_start"}));
}

TEST(Legacy, CompileOnlyRunnerStopsAfterCompiling) {
  auto art =
      std::filesystem::temp_directory_path() / ("cstorch_legacy_art_" + std::to_string(::getpid()));
  std::filesystem::remove_all(art);
  Config p = legacy("train", "  compile_only: true\n");
  auto runner = modelzoo::BaseRunner::create(p);
  modelzoo::RunOverrides o;
  o.on_trainer = [&](modelzoo::Trainer& t) { EXPECT_TRUE(t.backend()->options().compile_only); };
  runner->run("", o);
  // The report lands in model_dir/cerebras_logs (not the working directory).
  const std::string dir = p["runconfig"]["model_dir"];
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(dir) /
                                      "cerebras_logs/train_step-compile-0.txt"));
}
