// The Trainer's run record and console lines, the built-in callbacks (EarlyStopping,
// KeepBestCheckpoints, LRMonitor, GradNormLogger) and the loss/LR plot's validation curve.
#include <cairo.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "cstorch/cstorch.h"
#include "cstorch/data/mnist.h"
#include "cstorch/version.h"
#include "modelzoo/builtin_callbacks.h"
#include "modelzoo/loggers.h"
#include "modelzoo/overrides.h"
#include "modelzoo/plot.h"
#include "modelzoo/trainer.h"
#include "unit/test_util.h"

namespace cs = cstorch;
namespace fs = std::filesystem;
using modelzoo::Config;
using modelzoo::ConfigView;

namespace {

// Deterministic separable data: x [batch, 64], y = argmax of 10 fixed features of x.
class SmallLoader : public cs::utils::data::Loader {
 public:
  explicit SmallLoader(int64_t batches) : batches_(batches) {}
  std::optional<cs::Batch> next() override {
    if (pos_ >= batches_) return std::nullopt;
    const int64_t n = 8, d = 784;
    auto x = cs::testing::rvals(n * d, -0.5, 0.5, static_cast<uint32_t>(pos_ + 7));
    std::vector<int64_t> y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      float best = -1e9f;
      for (int64_t c = 0; c < 10; ++c)
        if (x[static_cast<size_t>(i * d + c * 5)] > best)
          best = x[static_cast<size_t>(i * d + c * 5)], y[static_cast<size_t>(i)] = c;
    }
    ++pos_;
    return cs::Batch{{"x", cs::from_vector(x, {n, d})}, {"y", cs::from_vector(y, {n})}};
  }
  void reset() override { pos_ = 0; }
  int64_t size() const override { return batches_; }

 private:
  int64_t batches_, pos_ = 0;
};

modelzoo::DataLoaderPtr small(int64_t batches) {
  return std::make_shared<cs::utils::data::DataLoader>(
      [batches](const Config&, const cs::utils::data::WorkerInfo&) {
        return std::make_shared<SmallLoader>(batches);
      },
      Config{{"batch_size", 8}});
}

std::string test_name() {
  return ::testing::UnitTest::GetInstance()->current_test_info()->name();
}

// A small fc_mnist run logging to model_dir/metrics.jsonl, no progress bar.
Config init_config(const fs::path& dir, const std::string& extra = "") {
  return cs::parse_config("device: CPU\nmodel_dir: " + dir.string() +
                          "\n"
                          "seed: 5\n"
                          "model: {name: fc_mnist, depth: 1, hidden_size: 16}\n"
                          "optimizer: {SGD: {lr: 0.1}}\n"
                          "loop: {max_steps: 20}\n"
                          "checkpoint: {steps: 0}\n"
                          "logging: {log_steps: 1, progress: false, plot: false}\n"
                          "loggers: [JSONLines]\n" +
                          extra);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const cs::Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<int64_t> checkpoint_steps(modelzoo::Trainer& t) {
  std::vector<int64_t> r;
  for (auto& [s, p] : t.checkpoints()) r.push_back(s);
  return r;
}

// Values of `name` in the metrics file, by step.
std::map<int64_t, double> series(const fs::path& dir, const std::string& name) {
  std::map<int64_t, double> r;
  for (const auto& m : modelzoo::read_metrics_file(dir / "metrics.jsonl"))
    if (m.name == name) r[m.step] = m.value;
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Run record and console

TEST(RunRecord, YamlReadsBackEqual) {
  Config c = cs::parse_config(
      R"({"a": {"b": [1, 2.5, 1e-05, "1.0", "yes", "null", "", "x: y", "line\nbreak"],
            "empty_map": {}, "empty_list": [], "t": true, "n": null,
            "list of maps": [{"k": 1, "j": [3]}, {"z": {"w": -0.1}}], "3": 0.1}})");
  const std::string y = modelzoo::to_yaml(c);
  EXPECT_EQ(cs::parse_config(y), c) << y;
  EXPECT_NE(y.find("list of maps"), std::string::npos);
}

TEST(RunRecord, OnePerRunAResumeAppends) {
  auto dir = cs::testing::temp_dir("runrec", test_name());
  modelzoo::set_run_command_line({"cszoo", "fit", "params.yaml", "--model_dir", dir.string()});
  Config c = init_config(dir);
  c["loop"]["max_steps"] = 6;
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(small(4));
  }
  const fs::path r1 = dir / "run_records" / "run_0001.yaml";
  ASSERT_TRUE(fs::exists(r1));
  const std::string first = cs::testing::read_file(r1);
  Config rec = cs::load_config_file(r1.string());
  EXPECT_EQ(rec["run"], 1);
  EXPECT_EQ(rec["mode"], "fit");
  EXPECT_EQ(rec["status"], "completed");
  EXPECT_EQ(rec["seed"], 5);
  EXPECT_EQ(rec["cstorch_version"], cs::version());
  EXPECT_EQ(rec["cpu_kernels"], cs::cpu_kernels());
  EXPECT_EQ(rec["git_commit"], cs::git_commit());
  EXPECT_EQ(rec["command_line"],
            Config({"cszoo", "fit", "params.yaml", "--model_dir", dir.string()}));
  EXPECT_FALSE(rec["host"].get<std::string>().empty());
  EXPECT_TRUE(rec["start_time"].is_string());
  EXPECT_TRUE(rec["end_time"].is_string());
  EXPECT_EQ(rec["config"]["init"], c);  // the init map exactly as the Trainer received it
  EXPECT_EQ(rec["start_step"], 0);
  EXPECT_EQ(rec["end_step"], 6);
  EXPECT_TRUE(rec["final_train_loss"].is_number());
  EXPECT_EQ(rec["checkpoints_saved"], Config({(dir / "checkpoint_6.mdl").string()}));

  // Resumed with more steps: a second record; the first is untouched.
  c["loop"]["max_steps"] = 9;
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.set_run_config({{"init", c}, {"fit", {{"note", "phase as received"}}}});
    t.fit(small(4));
  }
  EXPECT_EQ(cs::testing::read_file(r1), first);
  Config rec2 = cs::load_config_file((dir / "run_records" / "run_0002.yaml").string());
  EXPECT_EQ(rec2["run"], 2);
  EXPECT_EQ(rec2["start_step"], 6);
  EXPECT_EQ(rec2["end_step"], 9);
  EXPECT_EQ(rec2["config"]["fit"]["note"], "phase as received");
  modelzoo::set_run_command_line({});
  fs::remove_all(dir);
}

// The header's counts: gradient accumulation makes training steps of several batches, not
// validation steps (it divided both); the batch shown is the configured (global) one.
TEST(RunRecord, HeaderCountsValidationBatchesAndTheConfiguredBatch) {
  auto dir = cs::testing::temp_dir("runrec", test_name());
  Config c = init_config(dir);
  c["loop"] = {{"max_steps", 1}, {"grad_accum_steps", 3}};
  ::testing::internal::CaptureStdout();
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    auto train = small(3);
    train->set_data_description(Config{{"data_processor", "Small"}, {"batch_size", 7}});
    t.fit(train, small(2));
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("train data: 1 steps/epoch, batch 7\n"), std::string::npos) << out;
  EXPECT_NE(out.find("validation data: 2 steps/epoch, batch 8\n"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(RunRecord, ConsoleHeaderSummaryAndCheckpointLines) {
  auto dir = cs::testing::temp_dir("runrec", test_name());
  Config c = init_config(dir);
  c["loop"] = {{"max_steps", 4}, {"eval_frequency", 2}, {"eval_steps", 2}};
  c["checkpoint"] = {{"steps", 2}};
  ::testing::internal::CaptureStdout();
  int64_t params = 0;
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    for (auto& p : t.model().parameters()) params += p.numel();
    t.fit(small(3), small(2));
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find(fmt::format("== fit: model fc_mnist, {} parameters", params)),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("train data: 3 steps/epoch, batch 8\n"), std::string::npos) << out;
  EXPECT_NE(out.find("validation data: 2 steps/epoch"), std::string::npos) << out;
  EXPECT_NE(out.find("steps: 4 (global step 0 -> 4)"), std::string::npos) << out;
  EXPECT_NE(out.find(fmt::format("device CPU, precision f32, threads {}, replicas 1",
                                 cs::get_num_threads())),
            std::string::npos)
      << out;
  for (int s : {2, 4})
    EXPECT_NE(out.find(fmt::format("saved checkpoint {}",
                                   (dir / fmt::format("checkpoint_{}.mdl", s)).string())),
              std::string::npos)
        << out;
  EXPECT_NE(out.find("== fit completed: 4 steps in"), std::string::npos) << out;
  EXPECT_NE(out.find("final train loss"), std::string::npos) << out;
  EXPECT_NE(out.find("last validation (step 4): eval/accuracy"), std::string::npos) << out;
  EXPECT_NE(out.find("checkpoints in " + dir.string() + ": 2 (latest "), std::string::npos) << out;
  EXPECT_NE(out.find("run record " + (dir / "run_records" / "run_0001.yaml").string()),
            std::string::npos)
      << out;
  fs::remove_all(dir);
}

TEST(RunRecord, ValidateHasItsOwnRecord) {
  auto dir = cs::testing::temp_dir("runrec", test_name());
  Config c = init_config(dir);
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  ::testing::internal::CaptureStdout();
  const double loss = t.validate(small(2));
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("== validate: model fc_mnist"), std::string::npos) << out;
  EXPECT_NE(out.find("== validate completed"), std::string::npos) << out;
  Config rec = cs::load_config_file((dir / "run_records" / "run_0001.yaml").string());
  EXPECT_EQ(rec["mode"], "validate");
  EXPECT_NEAR(rec["last_validation"]["eval/loss"].get<double>(), loss, 1e-12);
  EXPECT_FALSE(rec.contains("final_train_loss"));
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// Built-in callbacks

TEST(BuiltinCallbacks, EarlyStoppingStopsWithACheckpoint) {
  auto dir = cs::testing::temp_dir("cb", test_name());
  // Training lowers the validation loss, so in mode max it never improves after the first
  // validation: patience 2 stops after the validations of steps 2 (best), 4 and 6.
  Config c = init_config(dir, "callbacks: [{EarlyStopping: {mode: max, patience: 2}}]\n");
  c["loop"] = {{"max_steps", 20}, {"eval_frequency", 2}, {"eval_steps", 2}};
  ::testing::internal::CaptureStdout();
  std::string out;
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(small(4), small(2));
    out = ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(t.global_step(), 6);
    EXPECT_TRUE(t.stop_requested());
    EXPECT_EQ(checkpoint_steps(t), std::vector<int64_t>({6}));
  }
  EXPECT_NE(out.find("stopping early at step 6: EarlyStopping: eval/loss did not improve"),
            std::string::npos)
      << out;
  // No second validation of step 6 at the end; the record says why the run ended.
  EXPECT_EQ(series(dir, "eval/loss").size(), 3u);
  Config rec = cs::load_config_file((dir / "run_records" / "run_0001.yaml").string());
  EXPECT_EQ(rec["status"], "stopped early");
  EXPECT_NE(rec["stop_reason"].get<std::string>().find("EarlyStopping"), std::string::npos);

  // In mode min with a min_delta no improvement can meet, the same stop; with a reachable one
  // (0) the loss keeps improving and the run goes on to max_steps.
  auto dir2 = cs::testing::temp_dir("cb", test_name() + "2");
  Config c2 = init_config(dir2, "callbacks: [{EarlyStopping: {min_delta: 100, patience: 2}}]\n");
  c2["loop"] = c["loop"];
  {
    modelzoo::Trainer t2(ConfigView(c2, "trainer.init"));
    t2.fit(small(4), small(2));
    EXPECT_EQ(t2.global_step(), 6);
  }
  auto dir3 = cs::testing::temp_dir("cb", test_name() + "3");
  Config c3 = init_config(dir3, "callbacks: [{EarlyStopping: {patience: 2}}]\n");
  c3["loop"] = c["loop"];
  {
    modelzoo::Trainer t3(ConfigView(c3, "trainer.init"));
    t3.fit(small(4), small(2));
    EXPECT_EQ(t3.global_step(), 20);
    EXPECT_FALSE(t3.stop_requested());
  }
  for (auto& d : {dir, dir2, dir3}) fs::remove_all(d);
}

TEST(BuiltinCallbacks, KeepBestCheckpointsKeepsTheBestK) {
  // Validation loss falls as training goes on (checked below), so in mode min the latest
  // validations are the best; in mode max the earliest.
  auto dir = cs::testing::temp_dir("cb", test_name());
  Config c = init_config(dir, "callbacks: [{KeepBestCheckpoints: {k: 2}}]\n");
  c["loop"] = {{"max_steps", 10}, {"eval_frequency", 2}, {"eval_steps", 2}};
  std::vector<int64_t> kept;
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(small(4), small(2));
    kept = checkpoint_steps(t);
  }
  auto val = series(dir, "eval/loss");
  ASSERT_EQ(val.size(), 5u);
  for (auto it = std::next(val.begin()); it != val.end(); ++it)
    ASSERT_LT(it->second, std::prev(it)->second) << "step " << it->first;
  // Steps 2, 4, 6 were saved by the callback and dropped (deleted); 10 is the run's own.
  EXPECT_EQ(kept, std::vector<int64_t>({8, 10}));
  Config index = cs::load_config_file((dir / "best_checkpoints.json").string());
  EXPECT_EQ(index["monitor"], "eval/loss");
  ASSERT_EQ(index["best"].size(), 2u);
  EXPECT_EQ(index["best"][0]["step"], 10);
  EXPECT_EQ(index["best"][1]["step"], 8);
  EXPECT_DOUBLE_EQ(index["best"][0]["value"].get<double>(), val[10]);

  // Mode max with keep_last 1: the best two (steps 2 and 4) are pinned, keep_last keeps the
  // newest of the others.
  auto dir2 = cs::testing::temp_dir("cb", test_name() + "2");
  Config c2 = init_config(dir2, "callbacks: [{KeepBestCheckpoints: {mode: max, k: 2}}]\n");
  c2["loop"] = c["loop"];
  c2["checkpoint"] = {{"steps", 3}, {"keep_last", 1}};
  modelzoo::Trainer t2(ConfigView(c2, "trainer.init"));
  t2.fit(small(4), small(2));
  EXPECT_EQ(checkpoint_steps(t2), std::vector<int64_t>({2, 4, 10}));

  // A checkpoint that drops out of the best k counts for keep_last again at once: step 6 (saved
  // by checkpoint.steps, then the best) is unpinned when step 9's validation, better, makes the
  // callback save step 9; keep_last 1 then keeps step 8, the newest unpinned, and deletes 6
  // (which stayed before: no later save pruned it).
  auto dir3 = cs::testing::temp_dir("cb", test_name() + "3");
  Config c3 = init_config(dir3, "callbacks: [{KeepBestCheckpoints: {k: 1}}]\n");
  c3["loop"] = {{"max_steps", 9}, {"eval_frequency", 3}, {"eval_steps", 2}};
  c3["checkpoint"] = {{"steps", 2}, {"keep_last", 1}, {"save_at_end", false}};
  modelzoo::Trainer t3(ConfigView(c3, "trainer.init"));
  t3.fit(small(4), small(2));
  EXPECT_EQ(checkpoint_steps(t3), std::vector<int64_t>({8, 9}));
  for (auto& d : {dir, dir2, dir3}) fs::remove_all(d);
}

TEST(BuiltinCallbacks, LRMonitorLogsTheRateEachStepUsed) {
  auto dir = cs::testing::temp_dir("cb", test_name());
  Config c = init_config(dir, "callbacks: [{LRMonitor: {every_n_steps: 3}}]\n");
  c["loop"] = {{"max_steps", 10}};
  c["schedulers"] = cs::parse_config(
      "[{LinearLR: {initial_learning_rate: 0.1, "
      "end_learning_rate: 0.01, total_iters: 9}}]");
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(small(4));
  }
  auto lr = series(dir, "lr/group_0");
  auto core = series(dir, "lr");  // the Trainer's own log of group 0's rate, every step
  ASSERT_EQ(lr.size(), 3u);
  for (int64_t s : {3, 6, 9}) {
    ASSERT_TRUE(lr.count(s)) << "step " << s;
    const double want = 0.1 + (0.01 - 0.1) * static_cast<double>(s - 1) / 9;
    EXPECT_NEAR(lr[s], want, 1e-6 * want) << "step " << s;
    EXPECT_EQ(lr[s], core[s]) << "step " << s;
  }
  fs::remove_all(dir);
}

// A scheduler added when resuming from a checkpoint that has none (or in a later phase): its
// first value is the rate of the first resumed step. The loaded optimizer state had set the
// checkpoint's lr, which that step used (0.1 at step 6, then 0.01).
TEST(TrainerCheckpoints, ASchedulerAddedOnResumeSetsTheFirstResumedStepsRate) {
  auto dir = cs::testing::temp_dir("cb", test_name());
  Config c = init_config(dir);
  c["loop"] = {{"max_steps", 5}};
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(small(4));
  }
  c["loop"] = {{"max_steps", 7}};
  c["schedulers"] = cs::parse_config("[{ConstantLR: {learning_rate: 0.01}}]");
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(small(4));
  }
  auto lr = series(dir, "lr");
  ASSERT_TRUE(lr.count(5) && lr.count(6) && lr.count(7));
  EXPECT_NEAR(lr[5], 0.1, 1e-7);
  EXPECT_NEAR(lr[6], 0.01, 1e-9);
  EXPECT_NEAR(lr[7], 0.01, 1e-9);
  fs::remove_all(dir);
}

// Every validation reads the same batches, from the validation data's start: with eval_steps
// the second validation went on to the next batches (and a BERT or T5 loader's next epoch drew
// other masks), so the same weights scored differently.
TEST(TrainerValidation, EveryValidationReadsTheSameBatches) {
  auto dir = cs::testing::temp_dir("val", test_name());
  cs::data::write_synthetic_mnist((dir / "mnist").string(), 64, 64, 3);
  Config c = init_config(dir);
  c["loop"] = {{"max_steps", 1}, {"eval_steps", 1}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  auto val = std::make_shared<cs::utils::data::DataLoader>(
      cs::data::mnist_input_fn,
      Config{{"data_dir", (dir / "mnist").string()}, {"split", "test"}, {"batch_size", 16}});
  const double first = t.validate(val);
  const double second = t.validate(val);
  EXPECT_EQ(first, second);
  // The batch it reads is the first: a fresh loader's validation agrees.
  auto fresh = std::make_shared<cs::utils::data::DataLoader>(
      cs::data::mnist_input_fn,
      Config{{"data_dir", (dir / "mnist").string()}, {"split", "test"}, {"batch_size", 16}});
  EXPECT_EQ(t.validate(fresh), first);
  fs::remove_all(dir);
}

// validate_all goes on past a checkpoint it cannot read (it stopped there, leaving the later
// ones unvalidated and unnamed), then fails naming it.
TEST(TrainerValidation, ValidateAllGoesOnPastADamagedCheckpoint) {
  auto dir = cs::testing::temp_dir("val", test_name());
  Config c = init_config(dir);
  c["loop"] = {{"max_steps", 6}};
  c["checkpoint"] = {{"steps", 2}};
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(small(4));
  }
  fs::resize_file(dir / "checkpoint_4.mdl", 3000);
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  ::testing::internal::CaptureStderr();
  cs::testing::expect_error([&] { t.validate_all(small(2)); },
                            {"validate_all: 1 of 3 checkpoints could not be validated: "
                             "checkpoint_4.mdl"});
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("checkpoint_4.mdl"), std::string::npos) << err;
  EXPECT_NE(err.find("going on with the next checkpoint"), std::string::npos) << err;
  auto loss = series(dir, "eval/loss");
  EXPECT_TRUE(loss.count(2) && loss.count(6)) << "steps validated: " << loss.size();
  EXPECT_FALSE(loss.count(4));
  fs::remove_all(dir);
}

// An empty loader is an error before the first step, with the causes its settings allow: a
// validation loader does not drop its last batch (the message had blamed drop_last).
TEST(TrainerValidation, AnEmptyLoaderIsNamedWithItsPossibleCauses) {
  auto dir = cs::testing::temp_dir("val", test_name());
  Config c = init_config(dir);
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  const std::string train = error_of([&] { t.fit(small(0)); });
  EXPECT_NE(train.find("the training dataloader makes no batches (0 steps per epoch): its data "
                       "has fewer samples than its batch_size 8 (drop_last), or no samples at all"),
            std::string::npos)
      << train;
  const std::string val = error_of([&] { t.validate(small(0)); });
  EXPECT_NE(val.find("the validation dataloader makes no batches (0 steps per epoch): its data "
                     "has no samples at all"),
            std::string::npos)
      << val;
  fs::remove_all(dir);
}

// A loader that fails while reading a batch: the error names the step that batch was for, on
// the first batch and on a later one (the steps before it ran).
TEST(TrainerErrors, ABatchThatCannotBeReadNamesItsStep) {
  class Failing : public SmallLoader {
   public:
    Failing(int64_t fail_at) : SmallLoader(10), fail_at_(fail_at) {}
    std::optional<cs::Batch> next() override {
      if (n_++ == fail_at_) cs::fail("bad record at line 37");
      return SmallLoader::next();
    }

   private:
    int64_t fail_at_, n_ = 0;
  };
  for (int64_t at : {0, 3}) {
    auto dir = cs::testing::temp_dir("readfail", test_name() + std::to_string(at));
    Config c = init_config(dir);
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    auto loader = std::make_shared<cs::utils::data::DataLoader>(
        [at](const Config&, const cs::utils::data::WorkerInfo&) {
          return std::make_shared<Failing>(at);
        },
        Config{{"batch_size", 8}});
    const std::string err = error_of([&] { t.fit(loader); });
    EXPECT_NE(err.find("step " + std::to_string(at + 1) +
                       ": reading its batch failed: DataLoader worker 0 of 1: bad record at "
                       "line 37"),
              std::string::npos)
        << err;
    fs::remove_all(dir);
  }
}

TEST(BuiltinCallbacks, GradNormIsTheNormOfTheSgdUpdate) {
  // Plain SGD moves the parameters by -lr * grad: the update's norm / lr is the gradient's
  // norm at that step, computed independently of the callback. Tolerance 1e-4 relative: the
  // update is recovered as a difference of f32 parameters (about 1e-7 relative error on
  // parameters ~30x larger than a step's change).
  auto dir = cs::testing::temp_dir("cb", test_name());
  Config c = init_config(dir, "callbacks: [{GradNormLogger: {every_n_steps: 1}}]\n");
  c["loop"] = {{"max_steps", 1}};
  c["checkpoint"] = {{"save_at_end", false}};
  std::vector<std::vector<float>> before;
  double update_sq = 0;
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    for (auto& p : t.model().parameters()) before.push_back(p.to_vector<float>());
    t.fit(small(4));
    auto params = t.model().parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto after = params[i].to_vector<float>();
      for (size_t j = 0; j < after.size(); ++j) {
        const double d = static_cast<double>(after[j]) - before[i][j];
        update_sq += d * d;
      }
    }
  }
  const double want = std::sqrt(update_sq) / 0.1;
  auto gn = series(dir, "grad_norm");
  ASSERT_EQ(gn.size(), 1u);
  EXPECT_GT(want, 0.01);
  EXPECT_NEAR(gn[1], want, 1e-4 * want);

  // Every N steps, including with gradient accumulation (one norm per optimizer step).
  auto dir2 = cs::testing::temp_dir("cb", test_name() + "2");
  Config c2 = init_config(dir2, "callbacks: [{GradNormLogger: {every_n_steps: 2}}]\n");
  c2["loop"] = {{"max_steps", 6}, {"grad_accum_steps", 2}};
  {
    modelzoo::Trainer t(ConfigView(c2, "trainer.init"));
    t.fit(small(4));
  }
  auto gn2 = series(dir2, "grad_norm");
  EXPECT_EQ(gn2.size(), 3u);
  for (auto& [s, v] : gn2) {
    EXPECT_EQ(s % 2, 0);
    EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
  }
  for (auto& d : {dir, dir2}) fs::remove_all(d);
}

TEST(BuiltinCallbacks, ParameterErrorsNameTheKeyPath) {
  auto dir = cs::testing::temp_dir("cb", test_name());
  auto err = [&](const std::string& cb) {
    Config c = init_config(dir, "callbacks: [" + cb + "]\n");
    return error_of([&] { modelzoo::Trainer t(ConfigView(c, "trainer.init")); });
  };
  EXPECT_EQ(err("{EarlyStopping: {patiense: 3}}"),
            "trainer.init.callbacks[0].EarlyStopping.patiense: unknown key (valid keys: monitor, "
            "mode, patience, min_delta)");
  EXPECT_EQ(err("{EarlyStopping: {mode: up}}"),
            "trainer.init.callbacks[0].EarlyStopping.mode: must be min or max, got 'up'");
  EXPECT_EQ(err("{EarlyStopping: {patience: 0}}"),
            "trainer.init.callbacks[0].EarlyStopping.patience: must be at least 1, got 0");
  EXPECT_EQ(err("{EarlyStopping: {min_delta: -1}}"),
            "trainer.init.callbacks[0].EarlyStopping.min_delta: must be 0 or more, got -1");
  EXPECT_EQ(err("{KeepBestCheckpoints: {top_k: 3}}"),
            "trainer.init.callbacks[0].KeepBestCheckpoints.top_k: unknown key (valid keys: "
            "monitor, mode, k)");
  EXPECT_EQ(err("{KeepBestCheckpoints: {k: 0}}"),
            "trainer.init.callbacks[0].KeepBestCheckpoints.k: must be at least 1, got 0");
  EXPECT_EQ(err("{LRMonitor: {every: 3}}"),
            "trainer.init.callbacks[0].LRMonitor.every: unknown key (valid keys: every_n_steps)");
  EXPECT_EQ(err("LRMonitor, {GradNormLogger: {every_n_steps: 0}}"),
            "trainer.init.callbacks[1].GradNormLogger.every_n_steps: must be at least 1, got 0");
  EXPECT_EQ(err("{GradNormLogger: {every_n_steps: two}}"),
            "trainer.init.callbacks[0].GradNormLogger.every_n_steps: expected an integer, got "
            "\"two\"");

  // A monitor the validation does not produce: the error lists what it will have, when fit
  // starts (it came at the first validation, after the training before it).
  Config c = init_config(dir, "callbacks: [{EarlyStopping: {monitor: eval/f1}}]\n");
  c["loop"] = {{"max_steps", 2}, {"eval_frequency", 2}, {"eval_steps", 1}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  EXPECT_EQ(error_of([&] { t.fit(small(2), small(1)); }),
            "trainer.init.callbacks[0].EarlyStopping.monitor: monitor 'eval/f1' is not among "
            "the validation results (they are: eval/loss, eval/accuracy)");
  EXPECT_EQ(t.global_step(), 0);
  // A failed run, recorded so (the record had stayed 'running').
  EXPECT_NE(
      cs::testing::read_file(dir / "run_records" / "run_0001.yaml").find("status: \"failed\""),
      std::string::npos);
  Config k = init_config(dir, "callbacks: [{KeepBestCheckpoints: {monitor: eval/acc}}]\n");
  k["loop"] = {{"max_steps", 2}, {"eval_frequency", 2}, {"eval_steps", 1}};
  modelzoo::Trainer tk(ConfigView(k, "trainer.init"));
  EXPECT_EQ(error_of([&] { tk.fit(small(2), small(1)); }),
            "trainer.init.callbacks[0].KeepBestCheckpoints.monitor: monitor 'eval/acc' is not "
            "among the validation results (they are: eval/loss, eval/accuracy)");
  EXPECT_EQ(tk.global_step(), 0);
  // Without validation it would do nothing: a warning says so, and training runs.
  Config w = init_config(dir, "callbacks: [{EarlyStopping: {monitor: eval/loss}}]\n");
  w["loop"] = {{"max_steps", 2}};
  modelzoo::Trainer tw(ConfigView(w, "trainer.init"));
  ::testing::internal::CaptureStderr();
  tw.fit(small(2), nullptr);
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warned.find("warning: EarlyStopping watches 'eval/loss', but this fit has no "
                        "validation dataloader: it does nothing"),
            std::string::npos)
      << warned;
  EXPECT_EQ(tw.global_step(), 2);
  // With validation only at the end (eval_frequency 0) it cannot stop early: said too.
  const fs::path dirz = dir.string() + "_z";
  Config z = init_config(dirz, "callbacks: [{EarlyStopping: {monitor: eval/loss}}]\n");
  z["loop"] = {{"max_steps", 2}, {"eval_steps", 1}};
  modelzoo::Trainer tz(ConfigView(z, "trainer.init"));
  ::testing::internal::CaptureStderr();
  tz.fit(small(2), small(1));
  const std::string warned_z = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(warned_z.find("warning: EarlyStopping watches 'eval/loss', but loop.eval_frequency "
                          "is 0: validation runs only when training ends, so it cannot stop "
                          "training early"),
            std::string::npos)
      << warned_z;
  fs::remove_all(dir);
  fs::remove_all(dirz);
}

// A training loss that is not a finite number is said at once, once a run (a run whose losses
// turned NaN reported success without a word); training goes on, as in PyTorch.
TEST(TrainerLogging, ALossThatIsNotFiniteIsWarnedOnce) {
  auto dir = cs::testing::temp_dir("nan", test_name());
  Config c = init_config(dir);
  c["optimizer"] = cs::parse_config("{SGD: {lr: 1.0e+30}}");
  c["loop"] = {{"max_steps", 6}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  ::testing::internal::CaptureStderr();
  t.fit(small(6));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(t.global_step(), 6);
  const size_t at = err.find("warning: step ");
  ASSERT_NE(at, std::string::npos) << err;
  EXPECT_NE(err.find("(not a finite number); the data may hold NaN or infinite values, or the "
                     "learning rate may be too high"),
            std::string::npos)
      << err;
  EXPECT_EQ(err.find("warning: step ", at + 1), std::string::npos) << err;  // once
  // The metrics file and the run record say which non-finite value it was (they wrote null,
  // which reads as "not logged"): a JSON string, read back as the value.
  std::ifstream in(dir / "metrics.jsonl");
  std::string line, last_loss_line;
  while (std::getline(in, line))
    if (line.find("\"loss\"") != std::string::npos) last_loss_line = line;
  EXPECT_TRUE(last_loss_line.find("\"loss\":\"NaN\"") != std::string::npos ||
              last_loss_line.find("\"loss\":\"Infinity\"") != std::string::npos ||
              last_loss_line.find("\"loss\":\"-Infinity\"") != std::string::npos)
      << last_loss_line;
  auto rows = modelzoo::read_metrics_file(dir / "metrics.jsonl");
  double last = 0;
  for (const auto& r : rows)
    if (r.name == "loss") last = r.value;
  EXPECT_FALSE(std::isfinite(last));
  const Config record = cs::load_config_file((dir / "run_records" / "run_0001.yaml").string());
  ASSERT_TRUE(record["final_train_loss"].is_string()) << record.dump();
  const std::string final_loss = record["final_train_loss"];
  EXPECT_TRUE(final_loss == "NaN" || final_loss == "Infinity" || final_loss == "-Infinity")
      << final_loss;
  fs::remove_all(dir);
}

TEST(BuiltinCallbacks, StepOutputErrors) {
  auto dir = cs::testing::temp_dir("cb", test_name());
  Config c = init_config(dir);
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  EXPECT_NE(error_of([&] {
              t.add_step_output("x", cs::from_vector(std::vector<float>{1}, {1}));
            }).find("call it from a hook inside the traced training step"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { t.step_output("grad_norm"); }),
            "Trainer.step_output: no step output 'grad_norm' (the step has: none)");
  fs::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// The plot: validation curve when validation ran

namespace {

struct Decoded {
  int width = 0, height = 0;
  int64_t val_pixels = 0, loss_pixels = 0;
};

// Decodes the PNG with Cairo and counts pixels of the validation and training loss colours.
Decoded decode(const fs::path& png) {
  Decoded d;
  cairo_surface_t* s = cairo_image_surface_create_from_png(png.c_str());
  EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << png;
  if (cairo_surface_status(s) != CAIRO_STATUS_SUCCESS) {
    cairo_surface_destroy(s);
    return d;
  }
  d.width = cairo_image_surface_get_width(s);
  d.height = cairo_image_surface_get_height(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  const int stride = cairo_image_surface_get_stride(s);
  auto is = [](uint32_t px, const std::array<uint8_t, 3>& c) {
    return ((px >> 16) & 0xff) == c[0] && ((px >> 8) & 0xff) == c[1] && (px & 0xff) == c[2];
  };
  for (int y = 0; y < d.height; ++y)
    for (int x = 0; x < d.width; ++x) {
      uint32_t px;
      std::memcpy(&px, data + static_cast<size_t>(y) * stride + static_cast<size_t>(x) * 4, 4);
      d.val_pixels += is(px, modelzoo::kValLossColor);
      d.loss_pixels += is(px, modelzoo::kLossColor);
    }
  cairo_surface_destroy(s);
  return d;
}

}  // namespace

TEST(Plot, ValidationCurveOnlyWhenValidationRan) {
  for (bool with_val : {true, false}) {
    auto dir = cs::testing::temp_dir("plotval", test_name() + (with_val ? "_val" : ""));
    Config c = init_config(dir);
    c["logging"]["plot"] = true;
    c["loop"] = {{"max_steps", 12}, {"eval_frequency", with_val ? 3 : 0}, {"eval_steps", 2}};
    {
      modelzoo::Trainer t(ConfigView(c, "trainer.init"));
      if (with_val)
        t.fit(small(4), small(2));
      else
        t.fit(small(4));
    }
    const fs::path png = dir / "loss_lr.png";
    ASSERT_TRUE(fs::exists(png));
    Decoded d = decode(png);
    EXPECT_EQ(d.width, modelzoo::PlotOptions{}.width);
    EXPECT_EQ(d.height, modelzoo::PlotOptions{}.height);
    EXPECT_GT(d.loss_pixels, 200);
    if (with_val)
      EXPECT_GT(d.val_pixels, 100) << "no validation curve";
    else
      EXPECT_EQ(d.val_pixels, 0) << "a validation curve without validation";
    fs::remove_all(dir);
  }
}

// `batch` (all N = 6 sequences of T = 8 tokens) validated by the model `model` (YAML) at
// batch sizes 6, 4 and 1 (last batch short): each eval/loss must be the first, and the log of
// `perplexity` (1e-5 relative: the f32 batch means are summed in other groupings).
namespace {
void expect_token_mean_at_any_batch_size(const std::string& name, const std::string& model,
                                         const cs::Batch& all, const std::string& perplexity) {
  auto dir = cs::testing::temp_dir("tokens", name);
  auto loader = [&](int64_t batch) {
    return std::make_shared<cs::utils::data::DataLoader>(
        [all, batch](const Config&, const cs::utils::data::WorkerInfo&) {
          return std::make_shared<cs::utils::data::TensorLoader>(all, batch);
        },
        Config{{"batch_size", batch}});
  };
  Config c =
      cs::parse_config("device: CPU\nmodel_dir: " + dir.string() + "\nseed: 3\nmodel: " + model +
                       "\nlogging: {progress: false, plot: false}\nloggers: []\n");
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  std::vector<double> losses;
  double ppl = 0;
  for (int64_t b : {6, 4, 1}) {
    losses.push_back(t.validate(loader(b)));
    ppl = t.last_validation_metrics().at(perplexity);
  }
  EXPECT_NEAR(losses[1], losses[0], 1e-5 * losses[0]);
  EXPECT_NEAR(losses[2], losses[0], 1e-5 * losses[0]);
  EXPECT_NEAR(losses[0], std::log(ppl), 1e-5 * losses[0]);
  fs::remove_all(dir);
}
}  // namespace

// A language model's eval/loss is the mean over its unmasked tokens, whatever the batch size:
// GPT-2 on 6 sequences with masks of different lengths, validated in batches of 6, 4 (4 + 2) and
// 1, and equal to the log of its perplexity (weighting the batches by samples gave 4.158 at
// batch 1 against 4.151 at 8, tried as a new user would). Tolerance 1e-5 relative: the batches'
// f32 means are summed in other groupings.
TEST(TrainerValidation, ALanguageModelsLossIsTheMeanOverItsTokens) {
  const int64_t N = 6, T = 8, V = 32;
  std::vector<int64_t> ids(N * T), labels(N * T), mask(N * T);
  for (int64_t i = 0; i < N * T; ++i) {
    ids[i] = (i * 7 + 3) % V;
    labels[i] = (i * 5 + 1) % V;
    mask[i] = i % T < 2 + (i / T) ? 1 : 0;  // sequence s counts 2 + s tokens
  }
  expect_token_mean_at_any_batch_size(
      test_name(),
      "{name: gpt2, vocab_size: 32, hidden_size: 16, num_hidden_layers: 1, num_heads: 2, "
      "max_position_embeddings: 8, filter_size: 32}",
      {{"input_ids", cs::from_vector(ids, {N, T})},
       {"labels", cs::from_vector(labels, {N, T})},
       {"attention_mask", cs::from_vector(mask, {N, T})}},
      "eval/lm_perplexity");
}

// BERT without the next-sentence loss: its loss is the mean over the masked tokens, and so is
// eval/loss at any batch size (weighted by samples, it moved with the batch size), the log of
// eval/mlm_perplexity. Tolerance as above.
TEST(TrainerValidation, BertsLossIsTheMeanOverItsMaskedTokens) {
  const int64_t N = 6, T = 8, V = 32;
  std::vector<int64_t> ids(N * T), labels(N * T), mask(N * T, 1), types(N * T, 0);
  for (int64_t i = 0; i < N * T; ++i) {
    ids[i] = (i * 7 + 3) % V;
    labels[i] = i % T < 1 + (i / T) ? (i * 5 + 1) % V : -100;  // sequence s masks 1 + s tokens
  }
  expect_token_mean_at_any_batch_size(
      test_name(),
      "{name: bert, vocab_size: 32, hidden_size: 16, num_hidden_layers: 1, num_heads: 2, "
      "max_position_embeddings: 8, filter_size: 32, disable_nsp: true}",
      {{"input_ids", cs::from_vector(ids, {N, T})},
       {"attention_mask", cs::from_vector(mask, {N, T})},
       {"token_type_ids", cs::from_vector(types, {N, T})},
       {"mlm_labels", cs::from_vector(labels, {N, T})}},
      "eval/mlm_perplexity");
}

// Resuming from an earlier checkpoint of a model_dir holding later ones (another run's): they
// are said, and checkpoint.keep_last neither counts nor deletes them (it had deleted the very
// checkpoint the run started from, keeping the stale later ones as the newest).
TEST(TrainerCheckpoints, ResumingFromAnEarlierCheckpointKeepsItAndNamesTheLaterOnes) {
  auto dir = cs::testing::temp_dir("later", test_name());
  {
    Config c = init_config(dir, "");
    c["checkpoint"] = {{"steps", 10}, {"keep_last", 3}};
    c["loop"] = {{"max_steps", 30}};
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(small(4));
  }
  Config c = init_config(dir, "");
  c["checkpoint"] = {{"steps", 5}, {"keep_last", 3}};
  c["loop"] = {{"max_steps", 15}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  ::testing::internal::CaptureStderr();
  t.fit(small(4), nullptr, (dir / "checkpoint_10.mdl").string());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("holds checkpoints past step 10 (checkpoint_20.mdl, checkpoint_30.mdl)"),
            std::string::npos)
      << err;
  EXPECT_EQ(checkpoint_steps(t), (std::vector<int64_t>{10, 15, 20, 30}));
  // Training on into the later run's steps is refused before any step: it overwrote
  // checkpoint_20 right after the warning had said the later checkpoints were left as they are.
  auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const std::string before = bytes(dir / "checkpoint_20.mdl");
  Config c2 = init_config(dir, "");
  c2["checkpoint"] = {{"steps", 5}};
  c2["loop"] = {{"max_steps", 25}};
  modelzoo::Trainer t2(ConfigView(c2, "trainer.init"));
  ::testing::internal::CaptureStderr();
  cs::testing::expect_error(
      [&] { t2.fit(small(4), nullptr, (dir / "checkpoint_10.mdl").string()); },
      {"holds checkpoints past step 10 (checkpoint_15.mdl, checkpoint_20.mdl, "
       "checkpoint_30.mdl)",
       "trains to step 25", "over checkpoint_15.mdl, checkpoint_20.mdl", "another model_dir"});
  // (Without the warning that the run leaves them as they are, which it printed first.)
  const std::string refused = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(refused.find("leaves them as they are"), std::string::npos) << refused;
  EXPECT_EQ(bytes(dir / "checkpoint_20.mdl"), before);
  EXPECT_EQ(checkpoint_steps(t2), (std::vector<int64_t>{10, 15, 20, 30}));
  fs::remove_all(dir);
}

// A fresh start (checkpoint.autoload_last_checkpoint: false) in a model_dir holding another run's
// checkpoints is refused as a resume from an earlier checkpoint is: it wrote over them (and
// their run's metrics) without a word.
TEST(TrainerCheckpoints, AFreshStartAmongAnotherRunsCheckpointsIsRefused) {
  auto dir = cs::testing::temp_dir("fresh", test_name());
  {
    Config c = init_config(dir, "");
    c["checkpoint"] = {{"steps", 10}};
    c["loop"] = {{"max_steps", 20}};
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(small(4));
  }
  std::ifstream f(dir / "checkpoint_10.mdl", std::ios::binary);
  const std::string before(std::istreambuf_iterator<char>(f), {});
  Config c = init_config(dir, "");
  c["checkpoint"] = {{"steps", 10}, {"autoload_last_checkpoint", false}};
  c["loop"] = {{"max_steps", 20}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  cs::testing::expect_error([&] { t.fit(small(4)); },
                            {"holds checkpoints past step 0 (checkpoint_10.mdl, checkpoint_20.mdl) "
                             "of another run (checkpoint.autoload_last_checkpoint is false",
                             "trains to step 20", "over checkpoint_10.mdl, checkpoint_20.mdl",
                             "another model_dir", "autoload_last_checkpoint: true"});
  std::ifstream g(dir / "checkpoint_10.mdl", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(g), {}), before);
  fs::remove_all(dir);
}
