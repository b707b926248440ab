// docs/callbacks.md: the guide's plugin (docs/examples/weight_norm_callback.cpp, shown in the
// guide verbatim) builds, loads into cszoo and logs the right values; the guide's YAML with
// the built-in callbacks runs through cszoo.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "cstorch/checkpoint.h"
#include "cstorch/data/mnist.h"
#include "cstorch/tensor.h"
#include "e2e/e2e_util.h"
#include "modelzoo/loggers.h"

namespace fs = std::filesystem;
using e2e::run;

namespace {

const std::string kCszoo = std::string(CSTORCH_BINARY_DIR) + "/cszoo";
const std::string kPlugin =
    std::string(CSTORCH_BINARY_DIR) + "/tests/doc_plugins/weight_norm_callback.so";

std::string read(const fs::path& p) {
  return cstorch::testing::read_file(p);
}

std::string config(const fs::path& dir, const std::string& callbacks, int max_steps) {
  const std::string data = (dir / "data").string();
  return "trainer:\n"
         "  init:\n"
         "    device: CPU\n"
         "    model_dir: " +
         (dir / "model").string() +
         "\n"
         "    seed: 2\n"
         "    model: {name: fc_mnist, hidden_sizes: [16]}\n"
         "    optimizer: {SGD: {lr: 0.05}}\n"
         "    loop: {max_steps: " +
         std::to_string(max_steps) +
         ", eval_frequency: 5, eval_steps: 2}\n"
         "    logging: {log_steps: 5}\n"
         "    callbacks: " +
         callbacks +
         "\n"
         "  fit:\n"
         "    train_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
         data +
         ", batch_size: 32, synthetic: false}\n"
         "    val_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
         data + ", split: test, batch_size: 50, synthetic: false}\n";
}

fs::path write_config(const fs::path& dir, const std::string& name, const std::string& yaml) {
  fs::path p = dir / name;
  cstorch::testing::write_file(p, yaml);
  return p;
}

}  // namespace

TEST(CallbacksGuide, ShowsThePluginSourceVerbatim) {
  const std::string guide = read(fs::path(CSTORCH_SOURCE_DIR) / "docs" / "callbacks.md");
  const std::string source =
      read(fs::path(CSTORCH_SOURCE_DIR) / "docs" / "examples" / "weight_norm_callback.cpp");
  ASSERT_FALSE(source.empty());
  EXPECT_NE(guide.find("```cpp\n" + source + "```\n"), std::string::npos)
      << "docs/callbacks.md must show docs/examples/weight_norm_callback.cpp verbatim";
}

TEST(CallbacksGuide, ThePluginLogsTheWeightNorm) {
  auto dir = e2e::temp_dir("cstorch_cbdoc", "plugin");
  cstorch::data::write_synthetic_mnist((dir / "data").string(), 400, 100, 3);
  int st = 0;
  auto cfg = write_config(dir, "fit.yaml", config(dir, "[{WeightNorm: {every_n_steps: 5}}]", 20));
  std::string out = run(kCszoo + " fit " + cfg.string() + " --plugin_paths " + kPlugin, &st);
  ASSERT_EQ(st, 0) << out;
  for (int s : {5, 10, 15, 20})
    EXPECT_NE(out.find("weight_norm at step " + std::to_string(s) + ": "), std::string::npos)
        << out;
  // The value logged at step 20 is the norm of the weights in checkpoint_20, computed here.
  double logged = NAN;
  int rows = 0;
  for (const auto& r : modelzoo::read_metrics_file(dir / "model" / "metrics.jsonl"))
    if (r.name == "weight_norm") {
      ++rows;
      if (r.step == 20) logged = r.value;
    }
  EXPECT_EQ(rows, 4);
  cstorch::State ck = cstorch::load((dir / "model" / "checkpoint_20.mdl").string());
  double sq = 0;
  const cstorch::State& model = ck.at("model");
  for (const auto& k : model.keys())
    for (float v : model.at(k).as_tensor().to_vector<float>()) sq += double(v) * v;
  // f32 sums of squares inside the step vs a double sum here: 1e-5 relative.
  EXPECT_NEAR(logged, std::sqrt(sq), 1e-5 * std::sqrt(sq));

  // Its parameter check, as the guide describes.
  cfg = write_config(dir, "bad.yaml", config(dir, "[{WeightNorm: {every: 5}}]", 20));
  out = run(kCszoo + " fit " + cfg.string() + " --plugin_paths " + kPlugin, &st);
  EXPECT_EQ(st, 1) << out;
  EXPECT_NE(out.find("trainer.init.callbacks[0].WeightNorm.every: unknown key (valid keys: "
                     "every_n_steps)"),
            std::string::npos)
      << out;
  fs::remove_all(dir);
}

// The guide's example list of built-in callbacks, through cszoo: early stopping ends the run
// with a checkpoint, the best checkpoints are listed, LR and gradient norms are logged.
TEST(CallbacksGuide, BuiltInCallbacksThroughCszoo) {
  auto dir = e2e::temp_dir("cstorch_cbdoc", "builtin");
  cstorch::data::write_synthetic_mnist((dir / "data").string(), 400, 100, 3);
  int st = 0;
  // mode max on the falling validation loss: no improvement after step 5, so patience 2 stops
  // the run after the validation of step 15.
  auto cfg =
      write_config(dir, "fit.yaml",
                   config(dir,
                          "[{EarlyStopping: {monitor: eval/loss, mode: max, patience: 2}}, "
                          "{KeepBestCheckpoints: {monitor: eval/accuracy, mode: max, k: 2}}, "
                          "{LRMonitor: {every_n_steps: 5}}, {GradNormLogger: {every_n_steps: 5}}]",
                          40));
  std::string out = run(kCszoo + " fit " + cfg.string(), &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("stopping early at step 15: EarlyStopping"), std::string::npos) << out;
  EXPECT_NE(out.find("saved checkpoint " + (dir / "model" / "checkpoint_15.mdl").string()),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("== fit stopped early: 15 steps"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(dir / "model" / "best_checkpoints.json"));
  int lr = 0, gn = 0;
  for (const auto& r : modelzoo::read_metrics_file(dir / "model" / "metrics.jsonl")) {
    lr += r.name == "lr/group_0";
    gn += r.name == "grad_norm";
  }
  EXPECT_EQ(lr, 3);
  EXPECT_EQ(gn, 3);
  // The run record holds the command line as cszoo received it.
  std::string rec = read(dir / "model" / "run_records" / "run_0001.yaml");
  EXPECT_NE(rec.find("- \"" + cfg.string() + "\""), std::string::npos) << rec;
  EXPECT_NE(rec.find("status: \"stopped early\""), std::string::npos) << rec;
  fs::remove_all(dir);
}
