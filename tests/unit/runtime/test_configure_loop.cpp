// cstorch::configure() drives the training loop: checkpoint_steps is the default of every
// DataExecutor and of a range-for over the DataLoader and decides where weights may be fetched;
// model_dir holds checkpoints saved by a relative path and the compile reports. configure() may
// be called once per process, so each test here needs a process of its own (CTest runs each
// test alone; run them one by one with --gtest_filter).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "cstorch/data/dataset.h"
#include "unit/test_util.h"

namespace cs = cstorch;
namespace fs = std::filesystem;
using cs::Batch;
using cs::Config;
using cs::State;
using cs::Tensor;
using cs::utils::data::DataExecutor;
using cs::utils::data::DataLoader;
using cs::utils::data::Loader;
using cs::utils::data::WorkerInfo;

namespace {

fs::path fresh_dir(const std::string& name) {
  auto d =
      fs::temp_directory_path() / ("cstorch_configure_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

// configure() with compile reports kept under `dir` (not in the default /opt location).
std::shared_ptr<cs::Backend> configure(const fs::path& dir, int64_t checkpoint_steps,
                                       bool validate_only = false) {
  cs::ConfigureOptions o;
  o.model_dir = (dir / "model").string();
  o.compile_dir = (dir / "compile").string();
  o.checkpoint_steps = checkpoint_steps;
  o.validate_only = validate_only;
  return cs::configure(o);
}

// Batches of the rows [i] of x = 0..n-1 (n x 1), `batch_size` rows each.
cs::utils::data::InputFn ramp_input_fn() {
  return [](const Config& a, const WorkerInfo& w) -> std::shared_ptr<Loader> {
    const int64_t n = a.at("n").get<int64_t>();
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i);
    return std::make_shared<cs::utils::data::TensorLoader>(Batch{{"x", cs::from_vector(x, {n, 1})}},
                                                           a.at("batch_size").get<int64_t>(), false,
                                                           0, false, w);
  };
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> r;
  for (const auto& e : fs::directory_iterator(dir)) r.push_back(e.path().filename().string());
  std::sort(r.begin(), r.end());
  return r;
}

}  // namespace

TEST(ConfigureLoop, CheckpointStepsIsTheDataExecutorsDefault) {
  auto dir = fresh_dir("executor");
  configure(dir, 3);
  DataLoader dl(ramp_input_fn(), {{"n", 8}, {"batch_size", 2}, {"num_workers", 1}});
  {
    DataExecutor ex(dl, 10);
    EXPECT_EQ(ex.checkpoint_interval(), 3);
    EXPECT_TRUE(ex.checkpoint_from_configure());
    EXPECT_EQ(ex.checkpoint_steps(), (std::vector<int64_t>{2, 5, 8, 9}));
  }
  {
    DataExecutor ex(dl, {.num_steps = 10, .checkpoint_steps = 0});  // given: overrides
    EXPECT_EQ(ex.checkpoint_steps(), (std::vector<int64_t>{9}));
  }
  fs::remove_all(dir);
}

// The custom loop of the configure() API: a range-for over the DataLoader, the loss read in a
// step closure, and `if (i % checkpoint_steps == 0) save_checkpoint(i)` with save_checkpoint a
// plain step closure that calls cstorch::save with a relative file name. It saves at steps 0,
// 4, 8 (and the last step, 9, is allowed too); the files land in model_dir.
TEST(ConfigureLoop, RangeForOverTheDataLoaderSavesAtTheConfiguredSteps) {
  auto dir = fresh_dir("loop");
  const int64_t checkpoint_steps = 4;
  configure(dir, checkpoint_steps);
  Tensor w = cs::zeros({1});
  auto training_step = cs::trace([&](const Batch& b) {
    cs::NoGradGuard no_grad;
    w.add_(cs::sum(b.at("x")));
    return cs::sum(b.at("x"));
  });
  std::vector<float> losses;
  auto post_training_step =
      cs::step_closure([&](const Tensor& loss) { losses.push_back(loss.item<float>()); });
  auto save_checkpoint = cs::step_closure([&](int64_t step) {
    cs::save(State::map({{"model", State::map({{"w", w}})}, {"global_step", step}}),
             "checkpoint_" + std::to_string(step) + ".mdl");
  });
  // 3 batches per epoch: the loop re-iterates the loader and stops after num_steps = 10.
  DataLoader dataloader(ramp_input_fn(),
                        {{"n", 6}, {"batch_size", 2}, {"num_workers", 1}, {"num_steps", 10}});
  int64_t i = 0;
  for (const Batch& batch : dataloader) {
    auto loss = training_step(batch);
    post_training_step(loss);
    if (i % checkpoint_steps == 0) save_checkpoint(i);
    if (i == 9) save_checkpoint(i);  // the last step
    ++i;
  }
  EXPECT_EQ(i, 10);
  ASSERT_EQ(losses.size(), 10u);
  EXPECT_EQ(losses[3], 1.f);  // batch {0, 1} again
  EXPECT_EQ(files_in(dir / "model"),
            (std::vector<std::string>{"checkpoint_0.mdl", "checkpoint_4.mdl", "checkpoint_8.mdl",
                                      "checkpoint_9.mdl"}));
  // w after step s is the sum of the x seen so far; checkpoint_4 holds it as of step 4, although
  // the client had already queued later steps when the closure ran.
  State s = cs::load("checkpoint_4.mdl");  // relative: read from model_dir as well
  EXPECT_EQ(s.at("global_step").as_int(), 4);
  EXPECT_EQ(s.at("model").at("w").as_tensor().item<float>(), 1 + 5 + 9 + 1 + 5);
  fs::remove_all(dir);
}

// A save at any other step is refused with the reason: weights can be fetched only on the
// checkpoint steps configured in cstorch::configure (and the last step).
TEST(ConfigureLoop, SaveAtAnotherStepIsRefusedWithTheReason) {
  auto dir = fresh_dir("refused");
  configure(dir, 4);
  Tensor w = cs::zeros({1});
  auto save_checkpoint = cs::step_closure([&](int64_t step) {
    cs::save(State::map({{"w", w}}), "checkpoint_" + std::to_string(step) + ".mdl");
  });
  auto closure = cs::checkpoint_closure([&](int64_t) {});
  const std::string reason =
      "checkpoints can be taken at steps 0, 4, 8, 9. It is only possible to fetch weights on "
      "predetermined checkpoint steps (checkpoint_steps=4 configured in cstorch::configure, and "
      "the last step); this is so to make training more performant";
  DataLoader dataloader(ramp_input_fn(),
                        {{"n", 6}, {"batch_size", 2}, {"num_workers", 1}, {"num_steps", 10}});
  std::string error, job;
  int64_t failed_step = -1;
  try {
    int64_t i = 0;
    for (const Batch& batch : dataloader) {
      (void)batch;
      if (i == 2) {
        EXPECT_ERROR(closure(i), "checkpoint_closure: step 2 is not a checkpoint step; " + reason);
        save_checkpoint(i);  // refused when it runs; the error reaches the loop's next sync
      }
      ++i;
    }
  } catch (const cs::StepError& e) {
    error = e.what();
    failed_step = e.step();
    job = e.job();
  }
  EXPECT_EQ(error, "step 2: step closure failed: cstorch::save: step 2 is not a checkpoint step; " +
                       reason);
  EXPECT_EQ(failed_step, 2);
  EXPECT_EQ(job, "step closure");
  EXPECT_FALSE(fs::exists(dir / "model" / "checkpoint_2.mdl"));
  fs::remove_all(dir);
}

// model_dir: saves by a relative path write there (creating it); loads by a relative path read
// there, else from the working directory; absolute paths are kept; the compile_only /
// validate_only reports go to <model_dir>/cerebras_logs.
TEST(ConfigureLoop, ModelDirHoldsCheckpointsAndReports) {
  auto dir = fresh_dir("model_dir");
  auto be = configure(dir, 0, /*validate_only=*/true);
  EXPECT_EQ(be->options().artifact_dir, (dir / "model" / "cerebras_logs").string());
  cs::save(State::map({{"a", cs::ones({2})}}), "sub.mdl");
  EXPECT_TRUE(fs::exists(dir / "model" / "sub.mdl"));
  EXPECT_EQ(cs::load("sub.mdl").at("a").as_tensor().to_vector<float>(), (std::vector<float>{1, 1}));
  cs::save_pt(State::map({{"a", cs::ones({1})}}), "w.pt");
  EXPECT_TRUE(fs::exists(dir / "model" / "w.pt"));
  const fs::path absolute = dir / "elsewhere.mdl";
  cs::save(State::map({{"a", cs::ones({1})}}), absolute.string());
  EXPECT_TRUE(fs::exists(absolute));
  EXPECT_ERROR(cs::load("missing.mdl"),
               "load missing.mdl: no such file in model_dir '" + (dir / "model").string() +
                   "' (set by cstorch::configure) nor in the working directory");
  // A relative path that is not in model_dir is read from the working directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  EXPECT_EQ(cs::load("elsewhere.mdl").at("a").as_tensor().to_vector<float>(),
            (std::vector<float>{1}));
  fs::current_path(cwd);

  auto step = cs::trace([](const Tensor& x) { return x * 2.0; }, "double");
  step(cs::ones({3}));
  EXPECT_TRUE(fs::exists(dir / "model" / "cerebras_logs" / "double-validate-0.txt"));
  fs::remove_all(dir);
}
