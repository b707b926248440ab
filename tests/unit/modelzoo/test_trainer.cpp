// Trainer: YAML schema and key-path errors, hook order (including exception hooks), the loop's
// step counting, gradient accumulation and validation.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "cstorch/cstorch.h"
#include "modelzoo/loggers.h"
#include "modelzoo/overrides.h"
#include "modelzoo/trainer.h"

namespace cs = cstorch;
using modelzoo::Config;
using modelzoo::ConfigView;

namespace {

// Random linearly separable data: x [n, 784], y = argmax of a fixed projection.
class TinyLoader : public cs::utils::data::Loader {
 public:
  // bad_batch >= 0: that batch's first label is 99, out of range for the 10 classes.
  TinyLoader(int64_t batches, int64_t batch, int64_t bad_batch = -1)
      : batches_(batches), batch_(batch), bad_(bad_batch) {}
  std::optional<cs::Batch> next() override {
    if (pos_ >= batches_) return std::nullopt;
    std::vector<float> x(static_cast<size_t>(batch_ * 784));
    std::vector<int64_t> y(static_cast<size_t>(batch_));
    for (int64_t i = 0; i < batch_; ++i) {
      uint64_t s = static_cast<uint64_t>(pos_ * 1000 + i) * 2654435761u + 12345;
      float best = -1e9f;
      for (int64_t j = 0; j < 784; ++j) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float v = static_cast<float>((s >> 40) & 0xffff) / 65536.0f - 0.5f;
        x[static_cast<size_t>(i * 784 + j)] = v;
      }
      for (int64_t c = 0; c < 10; ++c) {
        float score = x[static_cast<size_t>(i * 784 + c * 7)];
        if (score > best) best = score, y[static_cast<size_t>(i)] = c;
      }
    }
    if (pos_ == bad_) y[0] = 99;
    ++pos_;
    return cs::Batch{{"x", cs::from_vector(x, {batch_, 784})}, {"y", cs::from_vector(y, {batch_})}};
  }
  void reset() override { pos_ = 0; }
  int64_t size() const override { return batches_; }

 private:
  int64_t batches_, batch_, bad_, pos_ = 0;
};

MODELZOO_REGISTER(data_processors, "TinyData", [](const ConfigView& a) -> modelzoo::DataLoaderPtr {
  int64_t batches = a.get_int("batches", 8), batch = a.get_int("batch_size", 4),
          bad = a.get_int("bad_label_batch", -1);
  return std::make_shared<cs::utils::data::DataLoader>(
      [batches, batch, bad](const Config&, const cs::utils::data::WorkerInfo&) {
        return std::make_shared<TinyLoader>(batches, batch, bad);
      });
});

// Records every hook call as a string.
class Recorder : public modelzoo::Callback {
 public:
  std::vector<std::string>* log;
  explicit Recorder(std::vector<std::string>* l) : log(l) {}
  void pre_setup(modelzoo::Trainer&) override { log->push_back("pre_setup"); }
  void setup(modelzoo::Trainer&) override { log->push_back("setup"); }
  void post_setup(modelzoo::Trainer&) override { log->push_back("post_setup"); }
  void on_fit_start(modelzoo::Trainer&) override { log->push_back("fit_start"); }
  void on_fit_end(modelzoo::Trainer&) override { log->push_back("fit_end"); }
  void on_fit_exception(modelzoo::Trainer&, const std::exception&) override {
    log->push_back("fit_exception");
  }
  void on_train_start(modelzoo::Trainer&) override { log->push_back("train_start"); }
  void on_train_end(modelzoo::Trainer&) override { log->push_back("train_end"); }
  void on_train_exception(modelzoo::Trainer&, const std::exception&) override {
    log->push_back("train_exception");
  }
  void on_train_epoch_start(modelzoo::Trainer&, int64_t e) override {
    log->push_back("epoch_start " + std::to_string(e));
  }
  void on_train_epoch_end(modelzoo::Trainer&, int64_t e) override {
    log->push_back("epoch_end " + std::to_string(e));
  }
  void on_train_batch_start(modelzoo::Trainer&, const cs::Batch&, int64_t s) override {
    log->push_back("batch_start " + std::to_string(s));
  }
  void on_train_batch_end(modelzoo::Trainer&, const cs::Tensor&, int64_t s) override {
    log->push_back("batch_end " + std::to_string(s));
  }
  void on_before_forward(modelzoo::Trainer&, const cs::Batch&) override {
    log->push_back("before_forward");
  }
  void on_after_forward(modelzoo::Trainer&, const cs::Tensor&) override {
    log->push_back("after_forward");
  }
  void on_before_backward(modelzoo::Trainer&, const cs::Tensor&) override {
    log->push_back("before_backward");
  }
  void on_after_backward(modelzoo::Trainer&) override { log->push_back("after_backward"); }
  void on_before_optimizer_step(modelzoo::Trainer&) override {
    log->push_back("before_optimizer_step");
  }
  void on_after_optimizer_step(modelzoo::Trainer&) override {
    log->push_back("after_optimizer_step");
  }
  void on_validate_start(modelzoo::Trainer&) override { log->push_back("validate_start"); }
  void on_validate_end(modelzoo::Trainer&) override { log->push_back("validate_end"); }
  void on_validate_batch_end(modelzoo::Trainer&, const cs::Tensor&, int64_t s) override {
    log->push_back("validate_batch_end " + std::to_string(s));
  }
};

std::string tmpdir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("cstorch_trainer_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

Config init_config(const std::string& extra = "") {
  return cs::parse_config(
      "device: CPU\n"
      "model_dir: " +
      tmpdir(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
      "\n"
      "seed: 3\n"
      "model: {name: fc_mnist, depth: 1, hidden_size: 16}\n"
      "optimizer: {SGD: {lr: 0.05, momentum: 0.9}}\n"
      "loop: {max_steps: 6}\n"
      "checkpoint: {steps: 0, save_at_end: false}\n"
      "logging: {log_steps: 2}\n" +
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

// The error of a Trainer built from the default init config with `key` replaced by `yaml`.
std::string error_with(const std::string& key, const std::string& yaml) {
  Config c = init_config();
  c[key] = cs::parse_config(yaml);
  return error_of([&] { modelzoo::Trainer t(ConfigView(c, "trainer.init")); });
}

modelzoo::DataLoaderPtr tiny(int64_t batches) {
  Config c = {{"data_processor", "TinyData"}, {"batches", batches}, {"batch_size", 4}};
  return modelzoo::data_processors().create("TinyData", ConfigView(c, "x"), "x");
}

}  // namespace

TEST(TrainerConfig, ErrorsNameTheKeyPath) {
  auto err = [](const std::string& extra, const std::string& replace_from = "",
                const std::string& replace_to = "") {
    Config c = init_config(extra);
    if (!replace_from.empty()) c[replace_from] = cs::parse_config(replace_to);
    return error_of([&] { modelzoo::Trainer t(ConfigView(c, "trainer.init")); });
  };
  EXPECT_EQ(err("", "loop", "{max_steps: ten}"),
            "trainer.init.loop.max_steps: expected an integer, got \"ten\"");
  EXPECT_NE(err("max_step: 3\n").find("trainer.init.max_step: unknown key (valid keys: device,"),
            std::string::npos);
  EXPECT_NE(err("", "loop", "{max_step: 3}").find("trainer.init.loop.max_step: unknown key"),
            std::string::npos);
  // The registered list grows with the Model Zoo: check its start and two members.
  const std::string unknown_model = err("", "model", "{name: resnet}");
  EXPECT_NE(unknown_model.find("trainer.init.model.name: unknown model 'resnet' (registered: "),
            std::string::npos);
  EXPECT_NE(unknown_model.find("broken_for_test"), std::string::npos);
  EXPECT_NE(unknown_model.find("fc_mnist"), std::string::npos);
  EXPECT_NE(err("", "optimizer", "{Adamm: {lr: 0.1}}")
                .find("trainer.init.optimizer.Adamm: configure_optimizer: unknown optimizer type "
                      "'Adamm'; valid types:"),
            std::string::npos);
  EXPECT_EQ(err("", "backend", "{backend_type: CPU}"),
            "backend and device are mutually exclusive arguments of Trainer. Please only provide "
            "one or the other");
  EXPECT_EQ(err("", "model", "{name: fc_mnist, depth: -1}"),
            "trainer.init.model: depth must be 0 or more, got -1");
  EXPECT_EQ(err("", "model", "{name: fc_mnist, dropout: 1.5}"),
            "trainer.init.model.dropout: must be in [0, 1), got 1.5");
  EXPECT_EQ(err("", "logging", "{log_steps: 0}"),
            "trainer.init.logging.log_steps: must be at least 1, got 0");
  EXPECT_EQ(err("", "loop", "{num_steps: 3, num_epochs: 1}"),
            "trainer.init.loop: num_epochs and num_steps are mutually exclusive");
  EXPECT_EQ(err("", "callbacks", "[{NoSuchCallback: {}}]"),
            "trainer.init.callbacks[0]: unknown callback 'NoSuchCallback' (registered: "
            "EarlyStopping, GradNormLogger, KeepBestCheckpoints, LRMonitor)");
  EXPECT_EQ(err("", "checkpoint", "{steps: true}"),
            "trainer.init.checkpoint.steps: expected an integer, got true");
  // The collectives' watchdog limit: a positive number of seconds (checked before a backend
  // is made).
  auto timeout_err = [](const std::string& value) {
    Config c = init_config();
    c.erase("device");
    c["backend"] = cs::parse_config(
        "{backend_type: CSX, cluster_config: {collective_timeout_s: " + value + "}}");
    return error_of([&] { modelzoo::Trainer t(ConfigView(c, "trainer.init")); });
  };
  const std::string key = "trainer.init.backend.cluster_config.collective_timeout_s: ";
  EXPECT_EQ(timeout_err("-1"), key +
                                   "must be a positive number of seconds (how long a collective "
                                   "waits for the other replicas before the run stops), got -1");
  EXPECT_EQ(timeout_err("0").substr(0, key.size() + 36),
            key + "must be a positive number of seconds");
  EXPECT_EQ(timeout_err("ten"), key + "expected a number, got \"ten\"");
  // A model_dir that is a file: said with its key (a logger said it could not create it).
  Config file_dir = init_config();
  const std::string f = file_dir["model_dir"].get<std::string>() + ".file";
  std::ofstream(f) << "x";
  file_dir["model_dir"] = f;
  EXPECT_EQ(error_of([&] { modelzoo::Trainer t(ConfigView(file_dir, "trainer.init")); }),
            "trainer.init.model_dir: '" + f + "' exists and is not a directory");
  // Both dry-run switches: refused (validate_only ran, reported as compile_only).
  Config both = init_config();
  both.erase("device");
  both["backend"] =
      cs::parse_config("{backend_type: CSX, compile_only: true, validate_only: true}");
  EXPECT_EQ(error_of([&] { modelzoo::Trainer t(ConfigView(both, "trainer.init")); })
                .rfind("trainer.init.backend: compile_only and validate_only are mutually "
                       "exclusive",
                       0),
            0u);
}

// YAML's .inf and .nan are numbers, refused by the optimizer's and the schedulers' own range
// checks under the block's key path (as strings they were refused as "expected a number").
TEST(TrainerConfig, InfiniteAndNaNValuesAreRefusedByTheRangeChecks) {
  const auto err = error_with;
  EXPECT_EQ(err("optimizer", "{SGD: {lr: .inf, momentum: 0.9}}"),
            "trainer.init.optimizer.SGD: optimizer: invalid learning rate inf (lr must be >= 0 "
            "and finite)");
  EXPECT_EQ(err("optimizer", "{Adam: {learning_rate: .NaN}}"),
            "trainer.init.optimizer.Adam: optimizer: invalid learning rate nan (lr must be >= 0 "
            "and finite)");
  EXPECT_EQ(
      err("schedulers", "[{StepLR: {initial_learning_rate: 0.1, step_size: 2, gamma: .inf}}]"),
      "trainer.init.schedulers[0].StepLR: StepLR: invalid gamma inf (must be finite)");
  EXPECT_EQ(
      err("schedulers",
          "[{LinearLR: {initial_learning_rate: -.inf, end_learning_rate: 0, total_iters: 4}}]"),
      "trainer.init.schedulers[0].LinearLR: LinearLR: invalid initial_learning_rate -inf "
      "(must be >= 0 and finite)");
  EXPECT_EQ(err("loop", "{max_steps: .inf}"),
            "trainer.init.loop.max_steps: expected an integer, got .inf");
}

// A schedule whose value leaves f32's range within the run (1e30 * 10^s passes 3.4e38 at step
// 9) is refused when fit starts, naming the step and the key path, before any step runs; a run
// that ends before that step trains.
TEST(Trainer, AScheduleThatOverflowsWithinTheRunIsRefusedAtTheStart) {
  const std::string sched =
      "schedulers: [{ExponentialLR: {initial_learning_rate: 1.0e30, total_iters: 1, decay_rate: "
      "10}}]\n";
  Config c = init_config(sched);
  c["loop"] = {{"max_steps", 12}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  const std::vector<float> w = t.model().parameters()[0].to_vector<float>();
  EXPECT_EQ(error_of([&] { t.fit(tiny(8)); }),
            "trainer.init.schedulers[0].ExponentialLR: ExponentialLR: the computed lr at step 9 "
            "is inf, not a finite number (the schedule's values were checked through step 12, "
            "where this run ends)");
  EXPECT_EQ(t.global_step(), 0);
  EXPECT_EQ(t.model().parameters()[0].to_vector<float>(), w);
  Config ok = init_config(sched);
  ok["loop"] = {{"max_steps", 8}};
  modelzoo::Trainer fine(ConfigView(ok, "trainer.init"));
  fine.fit(tiny(8));
  EXPECT_EQ(fine.global_step(), 8);
}

TEST(TrainerConfig, RunConfigErrorsNamePhases) {
  Config root = {{"trainer", Config::array({{{"trainer", {{"init", init_config()}}}}})}};
  EXPECT_EQ(error_of([&] { modelzoo::run_config(root, modelzoo::Mode::Fit); }),
            "trainer[0].trainer.fit: missing required key");
  root["trainer"][0]["trainer"]["fit"] = {{"train_dataloader", {{"data_processor", "Nope"}}}};
  EXPECT_NE(error_of([&] { modelzoo::run_config(root, modelzoo::Mode::Fit); })
                .find("trainer[0].trainer.fit.train_dataloader.data_processor: unknown data "
                      "processor 'Nope'"),
            std::string::npos);
  // An empty list runs nothing: an error, not a silent success.
  EXPECT_EQ(error_of([] {
              modelzoo::run_config({{"trainer", Config::array()}}, modelzoo::Mode::Fit);
            }).rfind("trainer: an empty list of trainers: nothing to run", 0),
            0u);
  // Phases on different devices, or with both device and backend, are refused before the
  // first phase runs (they were found when the later phase started, after the first trained).
  Config fit = {{"train_dataloader", {{"data_processor", "Nope"}}}};
  Config first = init_config(), second = init_config();
  first["device"] = "CPU";
  second.erase("device");
  second["backend"] = {{"backend_type", "CSX"}};
  Config two = {{"trainer", Config::array({{{"trainer", {{"init", first}, {"fit", fit}}}},
                                           {{"trainer", {{"init", second}, {"fit", fit}}}}})}};
  EXPECT_EQ(error_of([&] { modelzoo::run_config(two, modelzoo::Mode::Fit); }),
            "trainer[1].trainer.init.backend.backend_type: Cannot instantiate multiple backends. "
            "A backend with type CPU has already been instantiated.");
  two["trainer"][1]["trainer"]["init"]["device"] = "CSX";
  EXPECT_EQ(error_of([&] { modelzoo::run_config(two, modelzoo::Mode::Fit); }),
            "trainer[1].trainer.init: backend and device are mutually exclusive arguments of "
            "Trainer. Please only provide one or the other");
}

TEST(Trainer, HooksFireInOrder) {
  Config c = init_config();
  c["loop"] = {{"max_steps", 4}, {"steps_per_epoch", 2}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  std::vector<std::string> log;
  t.add_callback(std::make_shared<Recorder>(&log));
  const int64_t traces = cs::runtime_stats().traces;
  t.fit(tiny(8));
  std::vector<std::string> want = {"pre_setup",
                                   "setup",
                                   "post_setup",
                                   "fit_start",
                                   "train_start",
                                   "epoch_start 0",
                                   "batch_start 1",
                                   "before_forward",
                                   "after_forward",
                                   "before_backward",
                                   "after_backward",
                                   "before_optimizer_step",
                                   "after_optimizer_step",
                                   "batch_end 1",
                                   "batch_start 2",
                                   "batch_end 2",
                                   "epoch_end 0",
                                   "epoch_start 1",
                                   "batch_start 3",
                                   "batch_end 3",
                                   "batch_start 4",
                                   "batch_end 4",
                                   "epoch_end 1",
                                   "train_end",
                                   "fit_end"};
  EXPECT_EQ(log, want);
  EXPECT_EQ(t.global_step(), 4);
  EXPECT_EQ(cs::runtime_stats().traces - traces, 1);  // the step was traced once
}

// After a resume the epoch hooks number the epochs from step 0, as the uninterrupted run does:
// resumed at step 3 of epochs of 2 steps, the run enters epoch 1 partway.
TEST(Trainer, HooksAfterAResumeSeeTheResumedStep) {
  Config c = init_config();
  c["loop"] = {{"max_steps", 3}, {"steps_per_epoch", 2}};
  c["checkpoint"] = {{"steps", 3}};
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    t.fit(tiny(8));
    ASSERT_EQ(t.global_step(), 3);
  }
  c["loop"]["max_steps"] = 6;
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  std::vector<std::string> log;
  t.add_callback(std::make_shared<Recorder>(&log));
  // on_fit_start runs after the checkpoint is loaded: it sees the step the run starts at.
  struct FitStartStep : modelzoo::Callback {
    int64_t* step;
    explicit FitStartStep(int64_t* s) : step(s) {}
    void on_fit_start(modelzoo::Trainer& tr) override { *step = tr.global_step(); }
  };
  int64_t fit_start_step = -1;
  t.add_callback(std::make_shared<FitStartStep>(&fit_start_step));
  t.fit(tiny(8));
  EXPECT_EQ(fit_start_step, 3);
  std::vector<std::string> epochs;
  for (const auto& s : log)
    if (s.rfind("epoch_", 0) == 0 || s.rfind("batch_start", 0) == 0) epochs.push_back(s);
  EXPECT_EQ(epochs, (std::vector<std::string>{"epoch_start 1", "batch_start 4", "epoch_end 1",
                                              "epoch_start 2", "batch_start 5", "batch_start 6",
                                              "epoch_end 2"}));
}

// A linear classifier without fc_mnist's host checks of its labels (Model::check_batch_values),
// so that a bad label reaches the traced step and fails there, on the executor.
class UncheckedLinear : public modelzoo::Model {
 public:
  UncheckedLinear() : Model("UncheckedLinear") {
    w_ = register_parameter("w", cs::zeros({784, 10}));
  }
  cs::Tensor loss(const cs::Batch& b) override {
    return cs::nn::functional::cross_entropy(cs::matmul(b.at("x"), w_), b.at("y"));
  }

 private:
  cs::Tensor w_;
};
MODELZOO_REGISTER(models, "unchecked_linear_for_test", [](const ConfigView&) -> modelzoo::ModelPtr {
  return std::make_shared<UncheckedLinear>();
});

// A step that fails when it runs (a label out of range in the third batch) ends the run at the
// step before it: global_step and the run record's end_step count completed steps, not those
// the loop had queued ahead of the executor. With fc_mnist the label is caught on the host
// before its step (the model's check_batch_values), with the same accounting.
TEST(Trainer, AFailedStepIsNotCountedAsDone) {
  for (std::string model : {"unchecked_linear_for_test", "fc_mnist"}) {
    SCOPED_TRACE(model);
    Config c = init_config();
    if (model != "fc_mnist") c["model"] = {{"name", model}};
    c["model_dir"] = std::string(c["model_dir"]) + "/" + model;
    c["loop"] = {{"max_steps", 6}};
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    Config d = {
        {"data_processor", "TinyData"}, {"batches", 8}, {"batch_size", 4}, {"bad_label_batch", 2}};
    const std::string err = error_of(
        [&] { t.fit(modelzoo::data_processors().create("TinyData", ConfigView(d, "x"), "x")); });
    EXPECT_NE(err.find(model == "fc_mnist"
                           ? "step 3: a batch from its data loader: fc_mnist: y[0] = 99 is outside "
                             "the classes 0..9"
                           : "step 3: traced step 'train_step' failed"),
              std::string::npos)
        << err;
    EXPECT_EQ(t.global_step(), 2);
    const Config record =
        cs::load_config_file(std::string(c["model_dir"]) + "/run_records/run_0001.yaml");
    EXPECT_EQ(record["status"], "failed");
    EXPECT_EQ(record["end_step"], 2);
  }
}

// A validation batch is checked too, named by the step it validates and its batch; the data
// processor and its files are named from the loader's data description.
TEST(Trainer, ABadValidationBatchNamesItsBatchAndData) {
  Config c = init_config();
  c["loop"] = {{"max_steps", 2}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  t.fit(tiny(8));
  Config d = {
      {"data_processor", "TinyData"}, {"batches", 4}, {"batch_size", 4}, {"bad_label_batch", 1}};
  auto val = modelzoo::data_processors().create("TinyData", ConfigView(d, "x"), "x");
  val->set_data_description({{"data_processor", "TinyData"}, {"files", {"a.csv", "b.csv"}}});
  const std::string err = error_of([&] { t.validate(val); });
  EXPECT_NE(err.find("validation at step 2, batch 2: a batch from TinyData (files: "
                     "[\"a.csv\",\"b.csv\"]): fc_mnist: y[0] = 99 is outside the classes 0..9"),
            std::string::npos)
      << err;
}

// A model whose loss fails while being traced (a shape error) fires the exception hooks.
class BrokenModel : public modelzoo::Model {
 public:
  BrokenModel() : Model("Broken") { register_parameter("w", cs::zeros({3, 5})); }
  cs::Tensor loss(const cs::Batch& b) override {
    return cs::sum(cs::matmul(b.at("x"), parameters()[0]));  // [4, 784] @ [3, 5]
  }
};
MODELZOO_REGISTER(models, "broken_for_test", [](const ConfigView&) -> modelzoo::ModelPtr {
  return std::make_shared<BrokenModel>();
});

TEST(Trainer, ExceptionHooks) {
  Config c = init_config();
  c["model"] = {{"name", "broken_for_test"}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  std::vector<std::string> log;
  t.add_callback(std::make_shared<Recorder>(&log));
  std::string err = error_of([&] { t.fit(tiny(8)); });
  EXPECT_NE(err.find("matmul"), std::string::npos) << err;
  std::vector<std::string> tail(log.end() - 4, log.end());
  EXPECT_EQ(tail, (std::vector<std::string>{"batch_start 1", "before_forward", "train_exception",
                                            "fit_exception"}));
}

TEST(Trainer, TrainsAndValidates) {
  Config c = init_config();
  c["loop"] = {{"max_steps", 40}, {"eval_frequency", 20}, {"eval_steps", 3}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  std::vector<std::string> log;
  t.add_callback(std::make_shared<Recorder>(&log));
  double before = t.validate(tiny(3));
  t.fit(tiny(10), tiny(3));
  double after = t.validate(tiny(3));
  EXPECT_LT(after, 0.7 * before) << before << " -> " << after;
  EXPECT_EQ(t.global_step(), 40);
  // validation ran after step 20 and at the end: 3 batches each.
  EXPECT_EQ(std::count(log.begin(), log.end(), "validate_start"), 4);  // + the two direct calls
  EXPECT_EQ(std::count(log.begin(), log.end(), "validate_batch_end 2"), 4);
  EXPECT_TRUE(t.model().is_training());
}

// Two Trainers alive in one process (a sweep in one program): each validation reports its own
// model's metrics under their names. Before, every live metric was computed: the second model's
// accuracy (registered as "eval/accuracy_1") showed in the first's results as NaN (never
// updated there), and the second reported its own under the suffixed name.
TEST(Trainer, TwoTrainersReportOnlyTheirOwnMetrics) {
  Config c1 = init_config();
  Config c2 = init_config();
  c2["model_dir"] = c1["model_dir"].get<std::string>() + "_second";
  modelzoo::Trainer t1(ConfigView(c1, "trainer.init"));
  modelzoo::Trainer t2(ConfigView(c2, "trainer.init"));
  t1.validate(tiny(2));
  t2.validate(tiny(3));
  for (const auto* t : {&t1, &t2}) {
    const auto& r = t->last_validation_metrics();
    ASSERT_EQ(r.count("eval/accuracy"), 1u);
    EXPECT_EQ(r.count("eval/accuracy_1"), 0u);
    EXPECT_EQ(r.size(), 2u);  // eval/loss and eval/accuracy
    for (const auto& [k, v] : r) EXPECT_TRUE(std::isfinite(v)) << k;
  }
}

// A given validation loader runs at the end of fit() even without eval_frequency.
TEST(Trainer, ValidationLoaderRunsAtTheEndWithoutEvalFrequency) {
  Config c = init_config();
  c["loop"] = {{"max_steps", 4}, {"eval_steps", 2}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  std::vector<std::string> log;
  t.add_callback(std::make_shared<Recorder>(&log));
  t.fit(tiny(8), tiny(3));
  EXPECT_EQ(std::count(log.begin(), log.end(), "validate_start"), 1);
  EXPECT_EQ(std::count(log.begin(), log.end(), "validate_batch_end 1"), 1);
  // After training: the last training step came first.
  auto val = std::find(log.begin(), log.end(), "validate_start");
  EXPECT_NE(std::find(log.begin(), val, "batch_end 4"), val);
}

// Every registered scheduler rejects an unknown argument with its key path and the valid keys,
// as an unknown YAML key anywhere else is rejected.
TEST(Trainer, SchedulerArgumentsAreCheckedForEveryScheduler) {
  int checked = 0;
  for (const auto& name : cs::optim::lr_scheduler_names()) {
    auto keys = cs::optim::lr_scheduler_arguments(name);
    if (!keys) continue;  // "SequentialLR (a list)", "ChainedLR (...)": the list forms
    ++checked;
    Config c = init_config();
    c["schedulers"] = cs::parse_config("[{" + name + ": {bogus_arg: 1}}]");
    const std::string err = error_of([&] { modelzoo::Trainer t(ConfigView(c, "trainer.init")); });
    EXPECT_EQ(err.rfind("trainer.init.schedulers[0]." + name +
                            ".bogus_arg: unknown key 'bogus_arg' of " + name + "; valid keys: ",
                        0),
              0u)
        << err;
    for (const auto& k : *keys) EXPECT_NE(err.find(k), std::string::npos) << name << ": " << err;
    // The seed form ({scheduler: Name, ...}) is checked the same way.
    c["schedulers"] = {{"scheduler", name}, {"bogus_arg", 1}};
    const std::string err2 = error_of([&] { modelzoo::Trainer t(ConfigView(c, "trainer.init")); });
    EXPECT_EQ(
        err2.rfind("trainer.init.schedulers.bogus_arg: unknown key 'bogus_arg' of " + name, 0), 0u)
        << err2;
  }
  EXPECT_GE(checked, 15);
  // A wrong type names the argument's key path too.
  Config c = init_config();
  c["schedulers"] = cs::parse_config(
      "[{LinearLR: {initial_learning_rate: fast, end_learning_rate: 0, total_iters: 4}}]");
  EXPECT_EQ(error_of([&] { modelzoo::Trainer t(ConfigView(c, "trainer.init")); }),
            "trainer.init.schedulers[0].LinearLR.initial_learning_rate: expected a number, got "
            "\"fast\"");
}

// Command-line overrides go through the same checks as the file: the same errors, the same
// key paths.
TEST(Trainer, OverriddenKeysAreCheckedLikeTheFile) {
  auto err = [](const std::string& ov) {
    Config root = {{"trainer", {{"init", init_config()}}}};
    modelzoo::apply_override(root, modelzoo::parse_override(ov));
    return error_of(
        [&] { modelzoo::Trainer t(ConfigView(root["trainer"]["init"], "trainer.init")); });
  };
  EXPECT_EQ(err("trainer.init.loop.max_steps=abc"),
            "trainer.init.loop.max_steps: expected an integer, got \"abc\"");
  EXPECT_EQ(err("trainer.init.loop.max_stepz=5")
                .rfind("trainer.init.loop.max_stepz: unknown key (valid keys: ", 0),
            0u);
  EXPECT_EQ(err("trainer.init.optimizer.SGD.lrr=0.1").rfind("trainer.init.optimizer.SGD: ", 0), 0u);
  EXPECT_EQ(err("trainer.init.loop.eval_frequency=5"), "(no error)");  // absent from the file
  Config root = {{"trainer", {{"init", init_config()}}}};
  modelzoo::apply_override(root, modelzoo::parse_override("trainer.init.loop.max_steps=3"));
  modelzoo::Trainer t(ConfigView(root["trainer"]["init"], "trainer.init"));
  t.fit(tiny(8));
  EXPECT_EQ(t.global_step(), 3);
}

TEST(Trainer, GradientAccumulationMatchesOneLargeBatch) {
  // Two micro-batches of 4 with accumulation vs the same 8 samples in one batch: the mean of
  // the two micro-batch losses has the same gradient as the loss of the 8-sample batch.
  Config c1 = init_config();
  c1["optimizer"] = {{"SGD", {{"lr", 0.1}}}};
  c1["loop"] = {{"max_steps", 3}, {"grad_accum_steps", 2}};
  std::vector<float> w_accum, w_big;
  {
    modelzoo::Trainer t(ConfigView(c1, "trainer.init"));
    t.fit(tiny(6));
    w_accum = t.model().parameters()[0].to_vector<float>();
    EXPECT_EQ(t.global_step(), 3);
  }
  class Concat : public cs::utils::data::Loader {
   public:
    TinyLoader inner{6, 4};
    std::optional<cs::Batch> next() override {
      auto a = inner.next();
      if (!a) return std::nullopt;
      auto b = inner.next();
      return cs::Batch{{"x", cs::cat({a->at("x"), b->at("x")}, 0)},
                       {"y", cs::cat({a->at("y"), b->at("y")}, 0)}};
    }
    void reset() override { inner.reset(); }
    int64_t size() const override { return 3; }
  };
  Config c2 = c1;
  c2["loop"] = {{"max_steps", 3}};
  {
    modelzoo::Trainer t(ConfigView(c2, "trainer.init"));
    t.fit(std::make_shared<cs::utils::data::DataLoader>(
        [](const Config&, const cs::utils::data::WorkerInfo&) {
          return std::make_shared<Concat>();
        }));
    w_big = t.model().parameters()[0].to_vector<float>();
  }
  ASSERT_EQ(w_accum.size(), w_big.size());
  double max_diff = 0;
  for (size_t i = 0; i < w_big.size(); ++i)
    max_diff = std::max(max_diff, static_cast<double>(std::abs(w_accum[i] - w_big[i])));
  EXPECT_LT(max_diff, 1e-6);
}

TEST(Trainer, LoopStepErrors) {
  Config c = init_config();
  c["loop"] = Config::object();
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  EXPECT_EQ(error_of([&] { t.fit(tiny(4)); }),
            "trainer.init.loop: One of num_epochs, num_steps, or max_steps must be provided");
}

TEST(Trainer, SchedulersDriveTheLearningRateEveryStep) {
  Config c = init_config();
  c["loop"] = {{"max_steps", 10}};
  c["logging"] = {{"log_steps", 1}, {"progress", false}, {"plot", false}};
  c["schedulers"] = cs::parse_config(
      "[{CosineDecayLR: {initial_learning_rate: 0.1, end_learning_rate: 0.01, total_iters: 8}}]");
  std::string dir = c["model_dir"];
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    EXPECT_EQ(t.schedulers().size(), 1u);
    t.fit(tiny(4));
  }
  auto records = modelzoo::read_metrics_file(std::filesystem::path(dir) / "metrics.jsonl");
  int seen = 0;
  for (const auto& r : records) {
    if (r.name != "lr") continue;
    const double s = static_cast<double>(std::min<int64_t>(r.step - 1, 8));  // rate used by step
    const double want = 0.01 + 0.09 * 0.5 * (1 + std::cos(M_PI * s / 8));
    EXPECT_NEAR(r.value, want, 1e-6 * want) << "step " << r.step;
    ++seen;
  }
  EXPECT_EQ(seen, 10);
}

TEST(Trainer, SchedulerFormsAndErrors) {
  const auto err = error_with;
  // configure_lr_scheduler's own form and a plain number are accepted too.
  EXPECT_EQ(err("schedulers",
                "{scheduler: StepLR, initial_learning_rate: 0.1, step_size: 2, "
                "gamma: 0.5}"),
            "(no error)");
  EXPECT_EQ(err("schedulers", "0.01"), "(no error)");
  EXPECT_EQ(err("schedulers", "[{CosineDecay: {initial_learning_rate: 0.1, decay_steps: 5}}]"),
            "trainer.init.schedulers[0].CosineDecay.decay_steps: 'decay_steps' was renamed; use "
            "'total_iters'");
  EXPECT_EQ(err("schedulers", "[{NoSuchLR: {}}]")
                .rfind("trainer.init.schedulers[0].NoSuchLR: unknown scheduler 'NoSuchLR'; valid "
                       "schedulers: ",
                       0),
            0u);
  EXPECT_EQ(err("precision", "{max_gradient_norm: 1.0, max_gradient_value: 0.5}"),
            "trainer.init.precision: give max_gradient_norm or max_gradient_value, not both");
  EXPECT_EQ(err("precision", "{enabled: true, dtype: f64}"),
            "trainer.init.precision.dtype: must be bf16 or f16, got 'f64'");
  EXPECT_EQ(err("precision", "{enabled: true, dtype: f16, loss_scaling_factor: -4}"),
            "trainer.init.precision.loss_scaling_factor: must be \"dynamic\", a positive static "
            "loss scale or 0.0 (no loss scaling), got -4");
  EXPECT_EQ(err("precision", "{enabled: true, loss_scaling_factor: dynamc}"),
            "trainer.init.precision.loss_scaling_factor: must be \"dynamic\", a positive static "
            "loss scale or 0.0 (no loss scaling), got 'dynamc'");
}

// A GradScaler is built only when loss_scale != 0.0: a factor of 0.0 means no loss scaling,
// even in f16; the scaler's overflow_tolerance defaults to 0.05.
TEST(Trainer, LossScalingFactorZeroMeansNoGradScaler) {
  for (const char* factor : {"0.0", "0"}) {
    Config c = init_config();
    c["precision"] = cs::parse_config(std::string("{enabled: true, dtype: f16, ") +
                                      "loss_scaling_factor: " + factor + "}");
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    EXPECT_EQ(t.grad_scaler(), nullptr) << factor;
  }
  Config c = init_config();
  c["precision"] = cs::parse_config("{enabled: true, dtype: bf16, loss_scaling_factor: 128}");
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  ASSERT_NE(t.grad_scaler(), nullptr);
  EXPECT_FALSE(t.grad_scaler()->dynamic());
  EXPECT_EQ(t.grad_scaler()->loss_scale().item<float>(), 128.0f);
}

TEST(Trainer, MixedPrecisionTrainsAndCheckpointsTheGradScaler) {
  for (const char* dtype : {"bf16", "f16"}) {
    Config c = init_config();
    c["loop"] = {{"max_steps", 30}};
    c["precision"] = {{"enabled", true}, {"dtype", dtype}, {"max_gradient_norm", 5.0}};
    c["checkpoint"] = {{"steps", 0}, {"save_at_end", true}};
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    EXPECT_EQ(t.grad_scaler() != nullptr, std::string(dtype) == "f16");
    double before = t.validate(tiny(3));
    t.fit(tiny(10));
    double after = t.validate(tiny(3));
    EXPECT_LT(after, 0.8 * before) << dtype;
    auto state = t.state_dict();
    EXPECT_EQ(state.contains("grad_scaler"), std::string(dtype) == "f16");
    EXPECT_TRUE(state.contains("optimizer"));
    EXPECT_EQ(t.checkpoints().size(), 1u);
  }
}

// The remaining init keys: backend with cluster_config, seed, checkpoint save_initial /
// keep_last, the CSV and TensorBoard loggers, num_epochs with steps_per_epoch.
TEST(Trainer, BackendCheckpointRetentionLoggersAndEpochs) {
  Config c = init_config();
  c.erase("device");
  c["backend"] = cs::parse_config(
      "{backend_type: CSX, cluster_config: {num_csx: 1, num_workers_per_csx: 2, "
      "job_labels: [team=ml]}}");
  c["loop"] = {{"num_epochs", 3}, {"steps_per_epoch", 2}};
  c["checkpoint"] = {{"steps", 1}, {"keep_last", 2}, {"save_initial_checkpoint", true}};
  c["loggers"] =
      cs::parse_config("[{CSV: {file: " + std::string(c["model_dir"]) + "/m.csv}}, TensorBoard]");
  std::vector<float> w;
  {
    modelzoo::Trainer t(ConfigView(c, "trainer.init"));
    EXPECT_EQ(t.backend()->type_name(), "CSX");
    EXPECT_EQ(t.backend()->options().cluster_config.num_workers_per_csx, 2);
    t.fit(tiny(4));
    EXPECT_EQ(t.global_step(), 6);  // 3 epochs of 2 steps
    auto ckpts = t.checkpoints();
    ASSERT_EQ(ckpts.size(), 2u);  // the newest two of 0 (initial), 1, ..., 6
    EXPECT_EQ(ckpts[0].first, 5);
    EXPECT_EQ(ckpts[1].first, 6);
    w = t.model().parameters()[0].to_vector<float>();
  }
  std::string dir = c["model_dir"];
  auto rows = modelzoo::read_metrics_file(std::filesystem::path(dir) / "m.csv");
  EXPECT_EQ(std::count_if(rows.begin(), rows.end(),
                          [](const modelzoo::MetricRecord& r) { return r.name == "loss"; }),
            3);  // log_steps 2
  bool events = false;
  for (auto& e : std::filesystem::directory_iterator(std::filesystem::path(dir) / "tensorboard"))
    events = events || e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_TRUE(events);
  // The same seed gives the same initial weights: a second phase starting from a fresh
  // model_dir (no autoload) trains to the same weights, and may change cluster_config (the
  // data workers stay at 2: TinyData does not shard, so the worker count changes the batches).
  Config c2 = c;
  c2["model_dir"] = dir + "_2";
  c2["backend"]["cluster_config"]["job_labels"] = {"team=other"};
  std::filesystem::remove_all(dir + "_2");
  modelzoo::Trainer t2(ConfigView(c2, "trainer.init"));
  EXPECT_EQ(t2.backend()->options().cluster_config.job_labels,
            std::vector<std::string>{"team=other"});
  t2.fit(tiny(4));
  EXPECT_EQ(t2.model().parameters()[0].to_vector<float>(), w);
}

// A forward pass that throws under mixed precision does not leave autocast switched on.
TEST(Trainer, FailedForwardClosesTheAutocastScope) {
  Config c = init_config();
  c["model"] = {{"name", "broken_for_test"}};
  c["precision"] = {{"enabled", true}, {"dtype", "bf16"}};
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  EXPECT_NE(error_of([&] { t.fit(tiny(4)); }).find("matmul"), std::string::npos);
  EXPECT_FALSE(cs::amp::autocast_dtype().has_value());
}

// The code form: Trainer(init, backend object). device/backend keys beside it are an error, and
// a change to the backend's cluster_config between two Trainers takes effect for the second only.
TEST(Trainer, CodeFormTakesABackendObject) {
  Config c = init_config();
  c.erase("device");
  cs::BackendOptions o;
  o.cluster_config.num_workers_per_csx = 1;
  auto backend = cs::backend("CSX", o);
  Config with_device = c;
  with_device["device"] = "CSX";
  EXPECT_NE(error_of([&] {
              modelzoo::Trainer t(ConfigView(with_device, "trainer.init"), backend);
            }).find("backend and device are mutually exclusive arguments of Trainer"),
            std::string::npos);
  std::string dir1 = c["model_dir"].get<std::string>() + "/one";
  std::string dir2 = c["model_dir"].get<std::string>() + "/two";
  c["model_dir"] = dir1;
  modelzoo::Trainer t1(ConfigView(c, "trainer.init"), backend);
  backend->options().cluster_config.num_workers_per_csx = 2;
  c["model_dir"] = dir2;
  modelzoo::Trainer t2(ConfigView(c, "trainer.init"), backend);
  EXPECT_EQ(t1.backend(), backend);
  t1.fit(tiny(4));
  t2.fit(tiny(4));
  auto workers = [](const std::string& dir) {
    std::ifstream in(std::filesystem::path(dir) / "run_metadata.json");
    return nlohmann::json::parse(in)["cluster_config"]["num_workers_per_csx"].get<int>();
  };
  EXPECT_EQ(workers(dir1), 1);
  EXPECT_EQ(workers(dir2), 2);
  // The record names where this trainer's reports go: the backend object's artifact_dir.
  std::ifstream in(std::filesystem::path(dir1) / "run_metadata.json");
  EXPECT_EQ(nlohmann::json::parse(in)["artifact_dir"].get<std::string>(),
            backend->options().artifact_dir);
}

// A trainer built from YAML records MODEL_DIR/cerebras_logs, where its reports go (it recorded
// the backend's default, ./cerebras_logs).
TEST(Trainer, RunMetadataNamesWhereTheReportsGo) {
  Config c = init_config();
  const std::string dir = c["model_dir"].get<std::string>();
  modelzoo::Trainer t(ConfigView(c, "trainer.init"));
  t.fit(tiny(4));
  std::ifstream in(std::filesystem::path(dir) / "run_metadata.json");
  EXPECT_EQ(nlohmann::json::parse(in)["artifact_dir"].get<std::string>(),
            (std::filesystem::path(dir) / "cerebras_logs").string());
}
