// DataLoader, step arguments and DataExecutor: every step-argument combination and error, the
// checkpoint schedule, exactly-once delivery over 1/2/4 sharded workers,
// deterministic order whatever the timing, restartable state (in process; the new-process
// resume is tests/e2e/test_data_resume.cpp), worker errors surfacing without hanging threads,
// closures seeing their step's state, and the data-wait counter.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <set>
#include <thread>

#include "cstorch/cstorch.h"
#include "cstorch/data/dataset.h"
#include "cstorch/utils/data.h"
#include "unit/test_util.h"

namespace cs = cstorch;
using cs::Batch;
using cs::Config;
using cs::State;
using cs::Tensor;
using cs::testing::expect_error;
using cs::utils::data::compute_num_steps;
using cs::utils::data::DataExecutor;
using cs::utils::data::DataLoader;
using cs::utils::data::Loader;
using cs::utils::data::StepArgs;
using cs::utils::data::WorkerInfo;

namespace {

// Runs `body` on another thread and fails (instead of hanging) if it takes over 20 s.
template <class F>
void within_timeout(F body) {
  auto fut = std::async(std::launch::async, body);
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "timed out: a thread is hanging";
  fut.get();  // rethrows assertion-free exceptions
}

// Sample ids 0..n-1 as an i64 tensor "id" and a float feature "x" = id * 0.5.
Batch id_data(int64_t n) {
  std::vector<int64_t> ids(static_cast<size_t>(n));
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    ids[static_cast<size_t>(i)] = i;
    x[static_cast<size_t>(i)] = 0.5f * static_cast<float>(i);
  }
  return Batch{{"id", cs::from_vector(ids, {n})}, {"x", cs::from_vector(x, {n})}};
}

// input_fn over a DatasetLoader of id_data(n), shuffled by seed, sharded by worker.
cs::utils::data::InputFn id_input_fn() {
  return [](const Config& a, const WorkerInfo& w) -> std::shared_ptr<Loader> {
    auto ds = std::make_shared<cs::data::TensorDataset>(id_data(a.at("n").get<int64_t>()));
    cs::data::LoaderOptions o;
    o.batch_size = a.at("batch_size").get<int64_t>();
    o.shuffle = a.value("shuffle", false);
    o.seed = a.value("seed", 0);
    o.drop_last = a.value("drop_last", false);
    o.worker = w;
    return std::make_shared<cs::data::DatasetLoader>(ds, o);
  };
}

std::vector<int64_t> ids_of(const Batch& b) {
  return b.at("id").to_vector<int64_t>();
}

// The ids of one epoch of `dl`, batch by batch.
std::vector<std::vector<int64_t>> one_epoch(DataLoader& dl) {
  std::vector<std::vector<int64_t>> out;
  while (auto b = dl.next()) out.push_back(ids_of(*b));
  return out;
}

// A loader of `n` batches whose i-th batch is {"id": [i]}; optional delay and failure.
class CountingLoader : public Loader {
 public:
  CountingLoader(int64_t n, int64_t fail_at = -1, int delay_us = 0)
      : n_(n), fail_at_(fail_at), delay_us_(delay_us) {}
  std::optional<Batch> next() override {
    if (i_ >= n_) return std::nullopt;
    if (i_ == fail_at_) cs::fail("CountingLoader: batch {} is broken", i_);
    if (delay_us_) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
    int64_t v = i_++;
    return Batch{{"id", cs::from_vector(std::vector<int64_t>{v}, {1})}};
  }
  void reset() override { i_ = 0; }
  int64_t size() const override { return n_; }

 private:
  int64_t n_, fail_at_;
  int delay_us_;
  int64_t i_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Step arguments

TEST(StepArgs, EveryCombination) {
  struct Row {
    std::optional<int64_t> num_steps, max_steps, num_epochs, steps_per_epoch;
    int64_t initial_step, length, want;
  };
  const std::optional<int64_t> no;
  const Row rows[] = {
      // num_steps alone; with max_steps (min of both); initial_step only limits max_steps
      {10, no, no, no, 0, 7, 10},
      {10, 25, no, no, 0, 7, 10},
      {30, 25, no, no, 0, 7, 25},
      {30, 25, no, no, 5, 7, 20},
      {10, no, no, no, 5, 7, 10},
      // max_steps alone: max_steps - initial_step
      {no, 25, no, no, 0, 7, 25},
      {no, 25, no, no, 24, 7, 1},
      {no, 25, no, no, 0, -1, 25},  // length unknown is fine without num_epochs
      // num_epochs: steps_per_epoch defaults to the loader length
      {no, no, 3, no, 0, 7, 21},
      {no, no, 3, 5, 0, 7, 15},
      {no, no, 3, 7, 0, 7, 21},
      {no, no, 3, 5, 0, -1, 15},  // unknown length, steps_per_epoch given
      {no, 100, 3, no, 0, 7, 21},
      {no, 10, 3, no, 0, 7, 10},
      {no, 10, 3, no, 4, 7, 6},
      {no, 10, 3, 2, 4, 7, 6},
      {no, 100, 3, 2, 4, 7, 6},
      // steps_per_epoch next to num_steps (only checked against the length)
      {9, no, no, 5, 0, 7, 9},
  };
  for (const auto& r : rows) {
    StepArgs a{r.num_steps, r.max_steps, r.num_epochs, r.steps_per_epoch, r.initial_step};
    EXPECT_EQ(compute_num_steps(a, r.length), r.want)
        << "num_steps=" << r.num_steps.value_or(-1) << " max_steps=" << r.max_steps.value_or(-1)
        << " num_epochs=" << r.num_epochs.value_or(-1)
        << " steps_per_epoch=" << r.steps_per_epoch.value_or(-1)
        << " initial_step=" << r.initial_step << " length=" << r.length;
  }
}

TEST(StepArgs, Errors) {
  const std::optional<int64_t> no;
  try {
    compute_num_steps(StepArgs{}, 7);
    FAIL() << "no error";
  } catch (const cs::Error& e) {
    EXPECT_STREQ(e.what(), "One of num_epochs, num_steps, or max_steps must be provided");
  }
  // initial_step without any of the three is still that error.
  EXPECT_ERROR(compute_num_steps(StepArgs{no, no, no, 5, 3}, 7), "One of num_epochs, num_steps");
  EXPECT_ERROR(compute_num_steps(StepArgs{10, no, 2, no, 0}, 7), "num_epochs and num_steps",
               "mutually exclusive");
  EXPECT_ERROR(compute_num_steps(StepArgs{no, 10, no, no, 10}, 7), "initial_step (10)",
               "less than max_steps (10)");
  EXPECT_ERROR(compute_num_steps(StepArgs{no, 10, no, no, 12}, 7), "initial_step (12)");
  EXPECT_ERROR(compute_num_steps(StepArgs{5, 10, no, no, 11}, 7), "initial_step (11)");
  EXPECT_ERROR(compute_num_steps(StepArgs{no, no, 2, 8, 0}, 7), "steps_per_epoch (8)",
               "loader's length (7");
  EXPECT_ERROR(compute_num_steps(StepArgs{no, no, 2, no, 0}, -1), "num_epochs needs",
               "steps_per_epoch");
  EXPECT_ERROR(compute_num_steps(StepArgs{no, no, 2, no, 0}, 0), "empty");
  EXPECT_ERROR(compute_num_steps(StepArgs{0, no, no, no, 0}, 7), "num_steps must be positive");
  EXPECT_ERROR(compute_num_steps(StepArgs{no, -1, no, no, 0}, 7), "max_steps must be positive");
  EXPECT_ERROR(compute_num_steps(StepArgs{no, no, 0, no, 0}, 7), "num_epochs must be positive");
  EXPECT_ERROR(compute_num_steps(StepArgs{no, no, 1, 0, 0}, 7), "steps_per_epoch must be positive");
  EXPECT_ERROR(compute_num_steps(StepArgs{5, no, no, no, -1}, 7), "initial_step must be >= 0");
}

TEST(StepArgs, ReadFromDataLoaderArgsAndNotForwarded) {
  Config seen;
  DataLoader dl(
      [&](const Config& a, const WorkerInfo& w) -> std::shared_ptr<Loader> {
        if (w.id == 0) seen = a;
        return std::make_shared<CountingLoader>(3 + w.id);
      },
      {{"num_epochs", 2}, {"initial_step", 1}, {"num_workers", 3}, {"prefetch", 1}, {"k", "v"}});
  EXPECT_EQ(dl.num_workers(), 3);
  EXPECT_EQ(dl.size(), 3 + 4 + 5);
  EXPECT_EQ(dl.num_steps(), 24);
  EXPECT_EQ(dl.step_args().initial_step, 1);
  EXPECT_EQ(seen, (Config{{"k", "v"}}));  // step and worker arguments are not forwarded
  EXPECT_ERROR(DataLoader(id_input_fn(), {{"num_steps", "ten"}}), "'num_steps'",
               "must be an integer");
  EXPECT_ERROR(DataLoader(id_input_fn(), {{"num_workers", 0}}), "num_workers");
  EXPECT_ERROR(DataLoader(id_input_fn(), Config::array()), "map of named arguments");
  DataLoader none(id_input_fn(), {{"n", 10}, {"batch_size", 2}});
  EXPECT_ERROR(DataExecutor ex(none),
               "One of num_epochs, num_steps, or max_steps must be provided");
}

TEST(StepArgs, WorkerCountFromBackendClusterConfig) {
  // The test process's backend is CPU; its cluster config supplies num_workers_per_csx.
  auto b = cs::backend("CPU");
  int old = b->options().cluster_config.num_workers_per_csx;
  b->options().cluster_config.num_workers_per_csx = 3;
  DataLoader dl(id_input_fn(), {{"n", 10}, {"batch_size", 2}});
  b->options().cluster_config.num_workers_per_csx = old;
  EXPECT_EQ(dl.num_workers(), 3);
  DataLoader explicit_one(id_input_fn(), {{"n", 10}, {"batch_size", 2}, {"num_workers", 1}});
  EXPECT_EQ(explicit_one.num_workers(), 1);
}

// ---------------------------------------------------------------------------------------------
// DataExecutor

TEST(DataExecutor, CheckpointSchedule) {
  DataLoader dl(id_input_fn(), {{"n", 10}, {"batch_size", 2}, {"num_workers", 1}});
  {
    DataExecutor ex(dl, 10, 3);
    EXPECT_EQ(ex.checkpoint_steps(), (std::vector<int64_t>{2, 5, 8, 9}));
    for (int64_t s = 0; s < 10; ++s)
      EXPECT_EQ(ex.is_checkpoint_step(s), s == 2 || s == 5 || s == 8 || s == 9) << s;
    EXPECT_FALSE(ex.is_checkpoint_step(11));
  }
  {
    DataExecutor ex(dl, 10, 0);
    EXPECT_EQ(ex.checkpoint_steps(), (std::vector<int64_t>{9}));
  }
  {
    DataExecutor ex(dl, 10, 5);
    EXPECT_EQ(ex.checkpoint_steps(), (std::vector<int64_t>{4, 9}));
  }
  {
    DataExecutor ex(dl, 3, 100);  // interval beyond the run: only the last step
    EXPECT_EQ(ex.checkpoint_steps(), (std::vector<int64_t>{2}));
  }
  EXPECT_ERROR(DataExecutor(dl, 10, -1), "checkpoint_steps must be >= 0");
  EXPECT_ERROR(DataExecutor(dl, 0, 1), "num_steps must be positive");
  // A resumed run numbers its steps from initial_step; the schedule stays on the global grid.
  DataLoader resumed(
      id_input_fn(),
      {{"n", 10}, {"batch_size", 2}, {"num_workers", 1}, {"initial_step", 45}, {"max_steps", 100}});
  DataExecutor ex(resumed, {.checkpoint_steps = 10});
  EXPECT_EQ(ex.num_steps(), 55);
  EXPECT_EQ(ex.checkpoint_steps(), (std::vector<int64_t>{49, 59, 69, 79, 89, 99}));
}

TEST(DataExecutor, NumbersStepsAndReiteratesTheLoader) {
  DataLoader dl(
      id_input_fn(),
      {{"n", 6}, {"batch_size", 2}, {"num_workers", 1}, {"initial_step", 3}, {"num_steps", 7}});
  DataExecutor ex(dl);
  std::vector<int64_t> steps, first_ids;
  for (const Batch& b : ex) {
    steps.push_back(ex.step());
    EXPECT_EQ(cs::current_step(), ex.step());
    first_ids.push_back(ids_of(b)[0]);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(first_ids, (std::vector<int64_t>{0, 2, 4, 0, 2, 4, 0}));  // 3 batches per epoch
  EXPECT_EQ(DataExecutor::current(), nullptr);
}

TEST(DataExecutor, EmptyLoaderIsAnError) {
  within_timeout([] {
    DataLoader dl(id_input_fn(),
                  {{"n", 3}, {"batch_size", 4}, {"drop_last", true}, {"num_workers", 2}});
    EXPECT_EQ(dl.size(), 0);
    DataExecutor ex(dl, 5);
    EXPECT_ERROR(ex.begin(), "DataExecutor: the data loader produced no batches", "it is empty");
  });
}

TEST(DataExecutor, OnlyOneAtATime) {
  DataLoader dl(id_input_fn(), {{"n", 6}, {"batch_size", 2}, {"num_workers", 1}});
  DataExecutor a(dl, 2);
  EXPECT_ERROR(DataExecutor(dl, 2), "another DataExecutor is already running");
}

TEST(DataExecutor, CheckpointClosureOnlyAtCheckpointStepsWithItsStepsState) {
  cs::manual_seed(0);
  Tensor w = cs::zeros({1});
  auto step = cs::trace([&](const Batch& b) {
    cs::NoGradGuard ng;
    w.add_(cs::ones({1}));
    return cs::sum(b.at("x"));
  });
  cs::set_lookahead(3);  // the client runs ahead of the closures
  std::vector<std::pair<int64_t, float>> seen;
  std::vector<int64_t> positions;
  DataLoader dl(id_input_fn(), {{"n", 20}, {"batch_size", 2}, {"num_workers", 2}});
  auto save = cs::checkpoint_closure([&](const Tensor& t, int64_t s) {
    seen.emplace_back(s, t.item<float>());
    // The loader position as of step s, although the client may have taken later batches.
    positions.push_back(dl.state_dict().at("batches_total").as_int());
  });
  {
    DataExecutor ex(dl, 10, 4);
    for (const Batch& b : ex) {
      step(b);
      if (ex.is_checkpoint_step(ex.step())) save(w, ex.step());
      if (ex.step() == 5)
        EXPECT_ERROR(save(w, ex.step()), "step 5 is not a checkpoint step",
                     "checkpoints can be taken at steps 3, 7, 9");
    }
  }
  cs::set_lookahead(2);
  EXPECT_EQ(seen, (std::vector<std::pair<int64_t, float>>{{3, 4.f}, {7, 8.f}, {9, 10.f}}));
  EXPECT_EQ(positions, (std::vector<int64_t>{4, 8, 10}));
  EXPECT_ERROR(save(w, 0), "no DataExecutor is running");
}

// cstorch::save() in a plain step closure fetches the weights: inside a loop it works at the
// loop's checkpoint steps only; elsewhere the closure fails with the reason, the error reaching
// the client at its next synchronisation point. A save on the client thread (which waits for
// the queued steps first) and a save in a closure queued outside any loop are not restricted.
TEST(DataExecutor, SaveInAStepClosureOnlyAtCheckpointSteps) {
  auto dir = std::filesystem::temp_directory_path() /
             ("cstorch_closure_save_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  Tensor w = cs::ones({2});
  auto file = [&](int64_t s) { return (dir / ("c" + std::to_string(s) + ".mdl")).string(); };
  auto save = cs::step_closure([&](int64_t s) { cs::save(State::map({{"w", w}}), file(s)); });
  DataLoader dl(id_input_fn(), {{"n", 20}, {"batch_size", 2}, {"num_workers", 1}});
  std::string error;
  try {
    DataExecutor ex(dl, 10, 4);
    for (const Batch& b : ex) {
      (void)b;
      if (ex.step() == 1) cs::save(State::map({{"w", w}}), file(100 + ex.step()));
      if (ex.step() == 3 || ex.step() == 5) save(ex.step());
    }
  } catch (const cs::Error& e) {
    error = e.what();
  }
  EXPECT_TRUE(std::filesystem::exists(file(101)));
  EXPECT_TRUE(std::filesystem::exists(file(3)));
  EXPECT_FALSE(std::filesystem::exists(file(5)));
  EXPECT_NE(error.find("step 5: step closure failed: cstorch::save: step 5 is not a checkpoint "
                       "step; checkpoints can be taken at steps 3, 7, 9. It is only possible to "
                       "fetch weights on predetermined checkpoint steps (checkpoint_steps=4 "
                       "given to the DataExecutor, and the last step); this is so to make "
                       "training more performant"),
            std::string::npos)
      << error;
  save(7);  // no loop is running
  cs::synchronize();
  EXPECT_TRUE(std::filesystem::exists(file(7)));
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// A range-for over the DataLoader

// The loop runs exactly the batches a DataExecutor with default options runs: as many as the
// step arguments say (num_steps=3 of a 6-batch epoch is 3 batches), numbered from initial_step
// (cstorch::current_step()), re-iterating the loader when an epoch ends.
TEST(DataLoaderLoop, StopsAtTheStepArgumentsAsDataExecutorDoes) {
  const std::vector<std::pair<Config, size_t>> cases = {
      {{{"num_steps", 3}}, 3},
      {{{"num_epochs", 2}}, 12},  // two workers, each with 3 batches of its 5 samples
      {{{"num_epochs", 3}, {"steps_per_epoch", 2}}, 6},
      {{{"max_steps", 7}, {"initial_step", 3}}, 4},
      {{{"num_steps", 12}, {"max_steps", 8}}, 8},
      {{{"num_steps", 13}}, 13},
  };
  for (const auto& [extra, want] : cases) {
    Config args{{"n", 10}, {"batch_size", 2}, {"num_workers", 2}};
    args.update(extra);
    DataLoader a(id_input_fn(), args), b(id_input_fn(), args);
    std::vector<std::vector<int64_t>> looped, executed;
    std::vector<int64_t> loop_steps, executor_steps;
    for (const Batch& batch : a) {
      looped.push_back(ids_of(batch));
      loop_steps.push_back(cs::current_step());
      EXPECT_NE(DataExecutor::current(), nullptr);
    }
    EXPECT_EQ(DataExecutor::current(), nullptr);
    DataExecutor ex(b);
    for (const Batch& batch : ex) {
      executed.push_back(ids_of(batch));
      executor_steps.push_back(ex.step());
    }
    EXPECT_EQ(looped.size(), want) << extra.dump();
    EXPECT_EQ(looped, executed) << extra.dump();
    EXPECT_EQ(loop_steps, executor_steps) << extra.dump();
  }
  DataLoader none(id_input_fn(), {{"n", 10}, {"batch_size", 2}});
  EXPECT_ERROR(none.begin(), "One of num_epochs, num_steps, or max_steps must be provided");
}

// The loop lives in the iterators: leaving it early ends it, and iterating again starts a new
// loop that continues from the loader's position. One loop runs at a time.
TEST(DataLoaderLoop, LeavingEarlyEndsTheLoop) {
  DataLoader dl(id_input_fn(),
                {{"n", 10}, {"batch_size", 2}, {"num_workers", 1}, {"num_steps", 4}});
  DataLoader other(id_input_fn(), {{"n", 4}, {"batch_size", 2}, {"num_workers", 1}});
  std::vector<int64_t> first, second;
  for (const Batch& b : dl) {
    first.push_back(ids_of(b)[0]);
    EXPECT_ERROR(DataExecutor(other, 1), "another DataExecutor is already running");
    if (first.size() == 2) break;
  }
  EXPECT_EQ(DataExecutor::current(), nullptr);
  for (const Batch& b : dl) second.push_back(ids_of(b)[0]);
  EXPECT_EQ(first, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(second, (std::vector<int64_t>{4, 6, 8, 0}));
}

// Without cstorch::configure() the loop's checkpoint_steps is 0: the last step only.
TEST(DataLoaderLoop, WithoutConfigureOnlyTheLastStepIsACheckpointStep) {
  DataLoader dl(id_input_fn(),
                {{"n", 10}, {"batch_size", 2}, {"num_workers", 1}, {"num_steps", 4}});
  std::vector<int64_t> saved;
  auto save = cs::checkpoint_closure([&](int64_t s) { saved.push_back(s); });
  int64_t i = 0;
  for (const Batch& b : dl) {
    (void)b;
    if (i == 1)
      EXPECT_ERROR(save(i), "checkpoint_closure: step 1 is not a checkpoint step",
                   "checkpoints can be taken at steps 3.",
                   "(the last step only, checkpoint_steps being 0 by default: cstorch::configure "
                   "was not called)");
    if (i == 3) save(i);
    ++i;
  }
  EXPECT_EQ(saved, (std::vector<int64_t>{3}));
}

TEST(DataExecutor, ReportsTimeWaitedForData) {
  DataLoader dl(
      [](const Config&, const WorkerInfo&) -> std::shared_ptr<Loader> {
        return std::make_shared<CountingLoader>(100, -1, 20000);  // 20 ms per batch
      },
      {{"num_workers", 1}});
  DataExecutor ex(dl, 4);
  for (const Batch& b : ex) (void)b;
  // Every batch takes 20 ms to make and the client does nothing else: it waits ~80 ms.
  EXPECT_GT(ex.data_wait_seconds(), 0.04);
  EXPECT_GE(dl.data_wait_seconds(), ex.data_wait_seconds());
  EXPECT_EQ(ex.data_waits(), 4);
}

// ---------------------------------------------------------------------------------------------
// Workers: exactly once, deterministic order

TEST(DataLoaderWorkers, EverySampleOfAnEpochExactlyOnce) {
  for (int workers : {1, 2, 4}) {
    for (bool shuffle : {false, true}) {
      SCOPED_TRACE(testing::Message() << workers << " workers, shuffle " << shuffle);
      DataLoader dl(id_input_fn(), {{"n", 103},
                                    {"batch_size", 4},
                                    {"shuffle", shuffle},
                                    {"seed", 7},
                                    {"num_workers", workers}});
      EXPECT_EQ(dl.num_workers(), workers);
      for (int epoch = 0; epoch < 2; ++epoch) {
        std::vector<int64_t> all;
        for (auto& b : one_epoch(dl)) all.insert(all.end(), b.begin(), b.end());
        ASSERT_EQ(all.size(), 103u);
        std::set<int64_t> unique(all.begin(), all.end());
        EXPECT_EQ(unique.size(), 103u);
        EXPECT_EQ(*unique.begin(), 0);
        EXPECT_EQ(*unique.rbegin(), 102);
      }
    }
  }
}

TEST(DataLoaderWorkers, TensorLoaderShardsAreDisjoint) {
  for (int workers : {2, 4}) {
    DataLoader dl(
        [](const Config&, const WorkerInfo& w) -> std::shared_ptr<Loader> {
          return std::make_shared<cs::utils::data::TensorLoader>(id_data(50), 3, true, 5, false, w);
        },
        {{"num_workers", workers}});
    std::multiset<int64_t> seen;
    for (auto& b : one_epoch(dl)) seen.insert(b.begin(), b.end());
    EXPECT_EQ(seen.size(), 50u);
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 50u);
  }
}

TEST(DataLoaderWorkers, OrderDoesNotDependOnTiming) {
  // Workers that sleep for pseudo-random times still give the same round-robin sequence.
  auto make = [](int salt) {
    return [salt](const Config&, const WorkerInfo& w) -> std::shared_ptr<Loader> {
      auto ds = std::make_shared<cs::data::TensorDataset>(id_data(60));
      auto slow = cs::data::map(ds, [salt, w](cs::data::Sample s) {
        int64_t id = s.at("id").item<int64_t>();
        std::this_thread::sleep_for(
            std::chrono::microseconds(((id * 37 + salt * 11 + w.id) % 7) * 100));
        return s;
      });
      cs::data::LoaderOptions o;
      o.batch_size = 5;
      o.shuffle = true;
      o.seed = 3;
      o.worker = w;
      return std::make_shared<cs::data::DatasetLoader>(slow, o);
    };
  };
  DataLoader a(make(1), {{"num_workers", 3}, {"prefetch", 1}});
  DataLoader b(make(2), {{"num_workers", 3}, {"prefetch", 3}});
  auto ea = one_epoch(a), eb = one_epoch(b);
  EXPECT_EQ(ea, eb);
  ASSERT_EQ(ea.size(), 12u);
  // Round robin: batch k comes from worker k % 3; a worker's ids are its shard of the order.
  auto order = cs::data::epoch_indices(60, true, 3, 0, {0, 1});
  for (size_t k = 0; k < ea.size(); ++k) {
    int64_t w = static_cast<int64_t>(k % 3), j = static_cast<int64_t>(k / 3);
    for (int64_t i = 0; i < 5; ++i)
      EXPECT_EQ(ea[k][static_cast<size_t>(i)], order[static_cast<size_t>((j * 5 + i) * 3 + w)]);
  }
}

TEST(DataLoaderWorkers, UnevenWorkersAndStepsPerEpoch) {
  // Worker i has 2 + i batches; a worker whose epoch ended is skipped in the round robin.
  DataLoader dl(
      [](const Config&, const WorkerInfo& w) -> std::shared_ptr<Loader> {
        return std::make_shared<CountingLoader>(2 + w.id);
      },
      {{"num_workers", 3}});
  auto e = one_epoch(dl);
  std::vector<int64_t> flat;
  for (auto& b : e) flat.push_back(b[0]);
  EXPECT_EQ(flat, (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 2, 2, 3}));
  // steps_per_epoch cuts epochs short; each epoch restarts every worker.
  DataLoader cut(
      [](const Config&, const WorkerInfo& w) -> std::shared_ptr<Loader> {
        return std::make_shared<CountingLoader>(4);
      },
      {{"num_workers", 2}, {"steps_per_epoch", 3}});
  EXPECT_EQ(cut.size(), 3);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> got;
    for (auto& b : one_epoch(cut)) got.push_back(b[0]);
    EXPECT_EQ(got, (std::vector<int64_t>{0, 0, 1})) << "epoch " << epoch;
  }
}

// ---------------------------------------------------------------------------------------------
// Restartable state (in process)

TEST(DataLoaderState, ResumedLoaderSeesTheSameBatches) {
  // Uneven shards (53 samples, batch 4: worker batch counts 7 and 7, the last ones partial),
  // shuffling, and a resume point in the second epoch.
  Config args{{"n", 53}, {"batch_size", 4}, {"shuffle", true}, {"seed", 11}, {"num_workers", 2}};
  std::vector<std::vector<int64_t>> ref;
  {
    DataLoader dl(id_input_fn(), args);
    while (ref.size() < 40) {
      auto b = dl.next();
      if (b) ref.push_back(ids_of(*b));
    }
  }
  for (size_t cut : {0u, 1u, 5u, 13u, 14u, 17u}) {
    SCOPED_TRACE(testing::Message() << "resume after " << cut << " batches");
    State st;
    {
      DataLoader dl(id_input_fn(), args);
      size_t got = 0;
      while (got < cut) {
        auto b = dl.next();
        if (b) {
          ASSERT_EQ(ids_of(*b), ref[got]);
          ++got;
        }
      }
      st = dl.state_dict();
    }
    DataLoader resumed(id_input_fn(), args);
    resumed.load_state_dict(st);
    size_t got = cut;
    while (got < ref.size()) {
      auto b = resumed.next();
      if (b) {
        ASSERT_EQ(ids_of(*b), ref[got]);
        ++got;
      }
    }
  }
}

TEST(DataLoaderState, StepsPerEpochAndPerWorkerCounts) {
  Config args{{"n", 40},   {"batch_size", 3},  {"shuffle", true},
              {"seed", 2}, {"num_workers", 3}, {"steps_per_epoch", 5}};
  std::vector<std::vector<int64_t>> ref;
  {
    DataLoader dl(id_input_fn(), args);
    while (ref.size() < 23)
      if (auto b = dl.next()) ref.push_back(ids_of(*b));
  }
  DataLoader dl(id_input_fn(), args);
  for (int i = 0; i < 7;)
    if (dl.next()) ++i;
  State st = dl.state_dict();
  EXPECT_EQ(st.at("epoch").as_int(), 1);
  EXPECT_EQ(st.at("batches_in_epoch").as_int(), 2);
  EXPECT_EQ(st.at("batches_total").as_int(), 7);
  const State& w0 = st.at("workers")[0];
  EXPECT_EQ(w0.at("batches").as_int(), 3);  // epoch 0: workers 0,1,2,0,1; epoch 1: 0,1
  EXPECT_EQ(w0.at("samples").as_int(), 9);
  EXPECT_TRUE(w0.at("loader").at("samples_streamed").is_int());
  DataLoader resumed(id_input_fn(), args);
  resumed.load_state_dict(st);
  for (size_t got = 7; got < ref.size();)
    if (auto b = resumed.next()) {
      ASSERT_EQ(ids_of(*b), ref[got]);
      ++got;
    }
}

TEST(DataLoaderState, Errors) {
  DataLoader two(id_input_fn(), {{"n", 10}, {"batch_size", 2}, {"num_workers", 2}});
  State st = two.state_dict();
  DataLoader four(id_input_fn(), {{"n", 10}, {"batch_size", 2}, {"num_workers", 4}});
  EXPECT_ERROR(four.load_state_dict(st), "saved with 2 workers", "has 4");
  State bad = st;
  bad.erase("workers");
  EXPECT_ERROR(two.load_state_dict(bad), "DataLoader.load_state_dict", "workers");
  // A state of another data set size is refused by the worker's loader (raised on first use).
  DataLoader other(id_input_fn(), {{"n", 12}, {"batch_size", 2}, {"num_workers", 2}});
  other.load_state_dict(st);
  EXPECT_ERROR(other.next(), "DataLoader worker 0 of 2", "restoring the saved data position",
               "10 samples", "this one has 12");
  // Not restartable.
  DataLoader plain(
      [](const Config&, const WorkerInfo&) -> std::shared_ptr<Loader> {
        return std::make_shared<CountingLoader>(3);
      },
      {{"num_workers", 1}});
  EXPECT_ERROR(plain.state_dict(), "worker 0's loader is not restartable");
}

// ---------------------------------------------------------------------------------------------
// Errors from workers

TEST(DataLoaderErrors, InputFnThatThrowsNamesTheWorker) {
  within_timeout([] {
    DataLoader dl(
        [](const Config&, const WorkerInfo& w) -> std::shared_ptr<Loader> {
          if (w.id == 1) cs::fail("cannot reach the data for shard {}", w.id);
          return std::make_shared<CountingLoader>(1000);
        },
        {{"num_workers", 3}, {"num_steps", 5}});
    EXPECT_ERROR(dl.next(), "DataLoader worker 1 of 3", "input_fn failed",
                 "cannot reach the data for shard 1");
    EXPECT_ERROR(dl.next(), "DataLoader worker 1 of 3");  // the failure sticks
    EXPECT_ERROR(DataExecutor ex(dl), "DataLoader worker 1 of 3");
  });
  within_timeout([] {
    DataLoader dl(
        [](const Config&, const WorkerInfo&) -> std::shared_ptr<Loader> { return nullptr; },
        {{"num_workers", 2}});
    EXPECT_ERROR(dl.size(), "DataLoader worker 0 of 2", "returned no loader");
  });
}

TEST(DataLoaderErrors, FailureMidStreamSurfacesInOrderAndStopsWorkers) {
  within_timeout([] {
    DataLoader dl(
        [](const Config&, const WorkerInfo& w) -> std::shared_ptr<Loader> {
          return std::make_shared<CountingLoader>(1000, w.id == 1 ? 2 : -1);
        },
        {{"num_workers", 2}, {"prefetch", 4}});
    // Batches 0, 1 of both workers arrive, then worker 1's third batch fails.
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(dl.next().has_value());
    EXPECT_ERROR(dl.next(), "DataLoader worker 1 of 2", "CountingLoader: batch 2 is broken");
  });
  within_timeout([] {
    // Destroying a loader whose workers are blocked on full queues does not hang.
    DataLoader dl(
        [](const Config&, const WorkerInfo&) -> std::shared_ptr<Loader> {
          return std::make_shared<CountingLoader>(1000000);
        },
        {{"num_workers", 4}, {"prefetch", 1}});
    ASSERT_TRUE(dl.next().has_value());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  });
}

TEST(DataLoaderErrors, ErrorInsideTheDataExecutorLoop) {
  within_timeout([] {
    DataLoader dl(
        [](const Config&, const WorkerInfo& w) -> std::shared_ptr<Loader> {
          return std::make_shared<CountingLoader>(10, w.id == 0 ? 3 : -1);
        },
        {{"num_workers", 2}, {"num_steps", 50}});
    DataExecutor ex(dl);
    int64_t steps = 0;
    EXPECT_ERROR(
        for (const Batch& b
             : ex) {
          (void)b;
          ++steps;
        },
        "DataLoader worker 0 of 2", "batch 3 is broken");
    EXPECT_EQ(steps, 6);
  });
  EXPECT_EQ(DataExecutor::current(), nullptr);
}
