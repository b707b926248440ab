// Tracing, replay, state writes, step closures, execution errors and eager/traced agreement.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <cstorch/cstorch.h>

#include "runtime/trace_context.h"

namespace cs = cstorch;
using cs::Tensor;

namespace cstorch::detail {
void end_step_numbering(int64_t next);  // src/runtime/executor.cpp: as a DataExecutor's loop ends
}

namespace {
Tensor vec(std::vector<float> v) {
  return cs::from_vector(v, {static_cast<int64_t>(v.size())});
}
}  // namespace

TEST(Trace, BodyRunsOnceAndReplaysWithNewBatches) {
  int body_runs = 0;
  Tensor w = vec({1, 2, 3});
  auto step = cs::trace([&](const Tensor& x) {
    ++body_runs;  // a non-tensor value: only the first (tracing) run sees it change
    return x * w + 1.0;
  });
  auto a = step(vec({1, 1, 1}));
  auto b = step(vec({2, 0, -1}));
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{2, 3, 4}));
  EXPECT_EQ(b.to_vector<float>(), (std::vector<float>{3, 1, -2}));
  EXPECT_EQ(body_runs, 1);
}

TEST(Trace, NewSignatureTracesAgainAndIsCached) {
  int body_runs = 0;
  auto step = cs::trace([&](const Tensor& x) {
    ++body_runs;
    return cs::sum(x * 2.0);
  });
  EXPECT_FLOAT_EQ(step(vec({1, 2})).item<float>(), 6);
  EXPECT_FLOAT_EQ(step(vec({1, 2, 3})).item<float>(), 12);
  EXPECT_FLOAT_EQ(step(vec({4, 4})).item<float>(), 16);
  EXPECT_FLOAT_EQ(step(vec({1, 1, 1})).item<float>(), 6);
  EXPECT_EQ(body_runs, 2);
}

TEST(Trace, ReadingAValueInsideTheStepIsAnError) {
  auto step = cs::trace([&](const Tensor& x) {
    auto y = cs::exp(x);
    (void)y.item<float>();
    return y;
  });
  try {
    step(vec({1}));
    FAIL() << "expected an error";
  } catch (const cs::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("inside a traced step"), std::string::npos) << m;
    EXPECT_NE(m.find("'exp'"), std::string::npos) << m;
    EXPECT_NE(m.find("step_closure"), std::string::npos) << m;
  }
}

// A save in the body would run once, at tracing, and write the weights before the first step
// on every later call's behalf (tried as a new user would: no error, a stale file).
TEST(Trace, SavingACheckpointInsideTheStepIsAnError) {
  Tensor w = vec({1, 2});
  const std::string path =
      (std::filesystem::temp_directory_path() / "cstorch_trace_save.mdl").string();
  auto step = cs::trace([&](const Tensor& x) {
    cs::save(cs::State::map({{"w", w}}), path);
    return x * w;
  });
  try {
    step(vec({1, 1}));
    FAIL() << "expected an error";
  } catch (const cs::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("save " + path + ": called inside a traced step"), std::string::npos) << m;
    EXPECT_NE(m.find("checkpoint closure"), std::string::npos) << m;
  }
  EXPECT_FALSE(std::filesystem::exists(path));
}

// train()/eval() between calls of one traced step: the step is traced again for the mode it
// now finds (the replay kept dropping values in eval mode, tried as a new user would), and each
// mode's graph is kept.
TEST(Trace, AChangedTrainingModeTracesTheStepAgain) {
  cs::manual_seed(3);
  cs::nn::Sequential m(cs::nn::Dropout(0.5));
  int body_runs = 0;
  auto step = cs::trace([&](const Tensor& x) {
    ++body_runs;
    return m(x);
  });
  auto dropped = [](const Tensor& y) {
    int zeros = 0;
    for (float v : y.to_vector<float>()) zeros += v == 0.f;
    return zeros;
  };
  const Tensor x = cs::ones({64});
  EXPECT_GT(dropped(step(x)), 0);  // training: about half dropped
  m->eval();
  EXPECT_EQ(step(x).to_vector<float>(), std::vector<float>(64, 1.f));
  EXPECT_EQ(body_runs, 2);
  m->train();
  EXPECT_GT(dropped(step(x)), 0);
  m->eval();
  EXPECT_EQ(dropped(step(x)), 0);
  EXPECT_EQ(body_runs, 2);  // both modes' graphs were kept
}

TEST(Trace, InPlaceUpdatesBecomeStateWritesCommittedPerExecution) {
  Tensor counter = cs::zeros({});
  Tensor acc = cs::zeros({2});
  auto step = cs::trace([&](const Tensor& x) {
    counter.add_(cs::ones({}));
    acc.add_(x);
    return acc * 1.0;
  });
  for (int i = 0; i < 5; ++i) step(vec({1, 2}));
  EXPECT_FLOAT_EQ(counter.item<float>(), 5);
  EXPECT_EQ(acc.to_vector<float>(), (std::vector<float>{5, 10}));
  // An eager update between steps is seen by the next replay.
  counter.fill_(100);
  step(vec({0, 0}));
  EXPECT_FLOAT_EQ(counter.item<float>(), 101);
}

TEST(Trace, StepClosuresRunInOrderWithMaterialisedValues) {
  Tensor state = cs::zeros({});
  auto step = cs::trace([&](const Tensor& x) {
    state.add_(x);
    return state * 1.0;
  });
  std::vector<std::pair<int, float>> seen;
  auto record = cs::step_closure([&](const Tensor& v, int i) {
    seen.push_back({i, v.item<float>()});
  });
  for (int i = 0; i < 20; ++i) record(step(cs::full({}, 1.0)), i);
  cs::synchronize();
  ASSERT_EQ(seen.size(), 20u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(seen[i].first, i);
    EXPECT_FLOAT_EQ(seen[i].second, static_cast<float>(i + 1));
  }
}

// Inside a step closure, current_step() is the step the closure was queued after (it was the
// client's current step, which runs ahead: "step 4 (current_step() says 7)").
TEST(Trace, CurrentStepInsideAStepClosureIsItsStep) {
  Tensor state = cs::zeros({});
  auto step = cs::trace([&](const Tensor& x) {
    state.add_(x);
    return state * 1.0;
  });
  std::vector<std::pair<int64_t, int64_t>> seen;  // (the step passed, current_step())
  auto record = cs::step_closure([&](const Tensor&, int64_t s) {
    seen.push_back({s, cs::current_step()});
  });
  const int64_t before = cs::current_step();
  for (int64_t s = 100; s < 120; ++s) {
    cs::set_current_step(s);
    record(step(cs::full({}, 1.0)), s);
  }
  cs::synchronize();
  cs::detail::end_step_numbering(before);  // the implicit counter again, for the other tests
  ASSERT_EQ(seen.size(), 20u);
  for (const auto& [s, current] : seen) EXPECT_EQ(current, s);
}

// A step closure reading, through a captured variable, a result of a step queued after it: an
// error (it read the buffer before that step wrote it, a made-up 0.25). Passed as an argument,
// the same tensor is read once its step has run.
TEST(Trace, AStepClosureReadingALaterStepsResultIsAnError) {
  Tensor state = cs::zeros({});
  auto step = cs::trace([&](const Tensor& x) {
    state.add_(x);
    return state * 1.0;
  });
  Tensor later;
  std::mutex m;
  cs::set_lookahead(4);
  auto peek = cs::step_closure([&] {
    std::lock_guard<std::mutex> l(m);
    (void)later.item<float>();
  });
  (void)step(cs::full({}, 0.0));  // traced now: the calls below only queue
  cs::synchronize();
  // Hold the executor until both steps are queued and `later` is the second one's result.
  std::atomic<bool> release{false};
  cs::step_closure([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  })();
  Tensor first = step(cs::full({}, 1.0));
  {
    std::lock_guard<std::mutex> l(m);
    later = first;  // set before the closure is queued: its own step's result, fine
  }
  peek();
  Tensor second = step(cs::full({}, 1.0));
  {
    std::lock_guard<std::mutex> l(m);
    later = second;  // when the closure runs, `later` is the next step's result
  }
  release = true;
  try {
    cs::synchronize();
    ADD_FAILURE() << "no error";
  } catch (const cs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("reads a result of a step queued after it"),
              std::string::npos)
        << e.what();
  }
  cs::set_lookahead(2);
}

// A loop left by an exception while its step closures are queued: the closures refer to the
// loop's locals, which the unwinding destroys. The closure object's destruction waits for
// them first (they ran on freed stack memory: a crash or heap corruption).
// In a loop that is not traced, a step closure sees its tensor arguments as they were when it
// was called: later eager updates (in place, or an optimizer's update of a parameter) wait for
// it. Before, the closures ran on the executor while the loop went on, and read later values (a
// checkpoint closure saved a later step's weights beside this step's data position).
TEST(Trace, AClosureInAnUntracedLoopSeesItsArgumentsAsCalled) {
  Tensor w = cs::zeros({4});
  Tensor p = cs::zeros({4});
  p.set_requires_grad(true);
  cs::optim::SGD sgd({p}, 1.0);
  std::vector<float> seen_w, seen_p;
  auto record = cs::step_closure([&](const Tensor& a, const Tensor& b) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the loop would run ahead
    seen_w.push_back(a.to_vector<float>()[0]);
    seen_p.push_back(b.to_vector<float>()[0]);
  });
  for (int i = 1; i <= 6; ++i) {
    w.add_(cs::ones({4}));  // eager, in place
    cs::sum(p * -1.0).backward();
    sgd.step();  // p += 1 (lr 1, gradient -1)
    sgd.zero_grad();
    record(w, p);
  }
  cs::synchronize();
  EXPECT_EQ(seen_w, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(seen_p, (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(Trace, LeavingALoopByAnExceptionWaitsForItsQueuedClosures) {
  auto step = cs::trace([](const Tensor& x) { return x * 2.0; });
  std::atomic<int> ran{0};
  bool alive_when_run = true;
  auto body = [&] {
    std::vector<float> losses;  // a local the closures write to
    struct Alive {
      bool*& flag;
      bool value = true;
      ~Alive() { value = false; }
    };
    bool* flag = &alive_when_run;
    Alive alive{flag};
    auto record = cs::step_closure([&](const Tensor& l) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      if (!alive.value) *alive.flag = false;
      losses.push_back(l.item<float>());
      ++ran;
    });
    for (int i = 0; i < 10; ++i) {
      record(step(cs::full({}, 1.0)));
      if (i == 5) throw std::runtime_error("leaving the loop");
    }
  };
  EXPECT_THROW(body(), std::runtime_error);
  EXPECT_EQ(ran.load(), 6);  // all queued calls ran before the locals went
  EXPECT_TRUE(alive_when_run);
  cs::synchronize();
}

// An exception of the body's own (std::map::at of a batch key the batch lacks) is a
// cstorch::Error naming the step: it escaped a caller's catch of cstorch::Error.
TEST(Trace, TheBodysOwnExceptionsBecomeErrorsNamingTheStep) {
  auto step = cs::trace([](const cs::Batch& b) { return b.at("y") * 2.0; }, "train_step");
  cs::Batch bad{{"label", cs::ones({2})}};
  try {
    step(bad);
    ADD_FAILURE() << "no error";
  } catch (const cs::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("trace 'train_step': the step's body threw std::out_of_range"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("a batch key the batch lacks"), std::string::npos) << m;
  }
}

// An error found while tracing a new signature (a batch with another feature count) names the
// step and the traced function, as an error found while a step runs does.
TEST(Trace, ATracingErrorNamesTheStepAndTheFunction) {
  Tensor w = cs::ones({4, 3});
  auto step = cs::trace([&](const cs::Batch& b) { return cs::sum(cs::linear(b.at("x"), w)); },
                        "train_step");
  step(cs::Batch{{"x", cs::ones({8, 3})}});
  cs::synchronize();
  cs::set_current_step(7);  // as a DataExecutor would
  try {
    step(cs::Batch{{"x", cs::ones({8, 5})}});
    ADD_FAILURE() << "no error";
  } catch (const cs::Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("step 7: tracing 'train_step' failed: linear: ", 0), 0u) << m;
    EXPECT_NE(m.find("[8, 5]"), std::string::npos) << m;
  }
}

// An index out of range found while a step runs names the table it indexes: the op's inputs,
// a parameter by its name (a model whose vocabulary is smaller than its data's).
TEST(Trace, AnIndexOutOfRangeNamesTheTableItIndexes) {
  Tensor table = cs::ones({5, 3});
  table.set_requires_grad(true);
  table.set_name("wte.weight");
  auto step = cs::trace(
      [&](const cs::Batch& b) { return cs::sum(cs::embedding(b.at("ids"), table)); }, "lookup");
  step(cs::Batch{{"ids", cs::from_vector(std::vector<int64_t>{0, 4}, {2})}});
  cs::synchronize();
  step(cs::Batch{{"ids", cs::from_vector(std::vector<int64_t>{0, 7}, {2})}});
  try {
    cs::synchronize();
    FAIL() << "expected the step to fail";
  } catch (const cs::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("inputs 'wte.weight' f32[5, 3], i64[2]"), std::string::npos) << m;
    EXPECT_NE(m.find("index 7"), std::string::npos) << m;
  }
}

TEST(Trace, ExecutionErrorSurfacesWithStepAndOp) {
  auto step = cs::trace([&](const cs::Batch& b) { return cs::nll_loss(b.at("x"), b.at("y")); },
                        "train_step");
  Tensor x = cs::log_softmax(cs::zeros({2, 3}), 1);
  step(cs::Batch{{"x", x}, {"y", cs::from_vector(std::vector<int64_t>{0, 1}, {2})}});
  cs::synchronize();
  cs::set_current_step(41);  // as a DataExecutor would
  auto bad = step(cs::Batch{{"x", x}, {"y", cs::from_vector(std::vector<int64_t>{0, 7}, {2})}});
  try {
    cs::synchronize();
    FAIL() << "expected the step to fail";
  } catch (const cs::StepError& e) {  // which step and which job, without parsing the message
    EXPECT_EQ(e.step(), 41);
    EXPECT_EQ(e.job(), "traced step 'train_step'");
    std::string m = e.what();
    EXPECT_EQ(m.rfind("step 41: traced step 'train_step' failed: ", 0), 0u) << m;
    EXPECT_NE(m.find("nll_loss"), std::string::npos) << m;
    EXPECT_NE(m.find("7"), std::string::npos) << m;
  }
  // The executor keeps working after reporting the failure.
  auto ok = step(cs::Batch{{"x", x}, {"y", cs::from_vector(std::vector<int64_t>{2, 1}, {2})}});
  EXPECT_NEAR(ok.item<float>(), std::log(3.0f), 1e-6);
}

TEST(Trace, TensorFromInsideATraceCannotBeReadAfterwards) {
  Tensor leaked;
  auto step = cs::trace([&](const Tensor& x) {
    leaked = x * 3.0;
    return x + 1.0;
  });
  step(vec({1}));
  EXPECT_THROW(leaked.item<float>(), cs::Error);
}

TEST(Trace, RandomDrawsAreFreshOnEveryReplay) {
  cs::manual_seed(7);
  auto step = cs::trace([&](const Tensor& x) { return cs::dropout(x, 0.5, true); });
  auto a = step(cs::ones({64})).to_vector<float>();
  auto b = step(cs::ones({64})).to_vector<float>();
  EXPECT_NE(a, b);
  cs::manual_seed(7);
  auto c = step(cs::ones({64})).to_vector<float>();
  EXPECT_EQ(a, c);
}

// The same training step, eager and traced, gives the same parameters.
TEST(Trace, TracedAndEagerTrainingStepsAgree) {
  auto make = [] {
    cs::manual_seed(3);
    return cs::nn::Sequential(cs::nn::Linear(12, 16), cs::nn::ReLU(), cs::nn::Linear(16, 5));
  };
  auto m1 = make();
  auto m2 = make();
  cs::optim::SGD o1(m1->parameters(), 0.1, 0.9);
  cs::optim::SGD o2(m2->parameters(), 0.1, 0.9);
  auto body = [](cs::nn::Sequential& m, cs::optim::Optimizer& o, const Tensor& x, const Tensor& y) {
    auto loss = cs::cross_entropy(m(x), y);
    loss.backward();
    o.step();
    o.zero_grad();
    return loss;
  };
  auto traced = cs::trace([&](const Tensor& x, const Tensor& y) { return body(m2, o2, x, y); });
  cs::manual_seed(11);
  for (int i = 0; i < 6; ++i) {
    Tensor x = cs::randn({8, 12});
    Tensor y = cs::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2}, {8});
    float le = body(m1, o1, x, y).item<float>();
    float lt = traced(x, y).item<float>();
    EXPECT_NEAR(le, lt, 1e-6f * std::max(1.0f, std::abs(le))) << "step " << i;
  }
  auto p1 = m1->parameters(), p2 = m2->parameters();
  for (size_t i = 0; i < p1.size(); ++i) {
    auto a = p1[i].to_vector<float>(), b = p2[i].to_vector<float>();
    for (size_t j = 0; j < a.size(); ++j) ASSERT_NEAR(a[j], b[j], 1e-6f) << "param " << i;
  }
}

TEST(Trace, GradientsKeptAcrossStepsPersist) {
  Tensor w = vec({1, 2});
  w.set_requires_grad(true);
  auto step = cs::trace([&](const Tensor& x) {
    auto l = cs::sum(w * x);
    l.backward();  // no zero_grad: gradients accumulate from step to step
    return l;
  });
  step(vec({1, 1}));
  step(vec({2, 3}));
  cs::synchronize();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{3, 4}));
}

TEST(Trace, FailureInsideTheBodyRestoresState) {
  Tensor s = vec({1, 2});
  auto step = cs::trace([&](const Tensor& x) {
    s.add_(x);
    return cs::matmul(s, cs::zeros({3, 3}));  // shape error while tracing
  });
  EXPECT_THROW(step(vec({1, 1})), cs::Error);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 2}));
  EXPECT_EQ((s + 1.0).to_vector<float>(), (std::vector<float>{2, 3}));
}

TEST(Runtime, ThreadCountReachesTheExecutorThread) {
  int seen = -1;
  cs::set_num_threads(1);
  cs::step_closure([&] { seen = omp_get_max_threads(); })();
  cs::synchronize();
  EXPECT_EQ(seen, 1);
  cs::set_num_threads(2);
  cs::step_closure([&] { seen = omp_get_max_threads(); })();
  cs::synchronize();
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(cs::get_num_threads(), 2);
}

namespace {
// x * x of 200,000 elements of 1e-20 (large enough for the kernel to run on its thread's team):
// 1e-40 is a denormal f32, flushed to 0 under set_flush_denormal(true). Counts nonzero results.
struct DenormalProbe {
  static constexpr int64_t n = 200000;
  Tensor x = cs::full({n}, 1e-20);
  std::function<Tensor(const Tensor&)> product = cs::trace([](const Tensor& a) { return a * a; });
  static int64_t nonzero(const Tensor& t) {
    int64_t c = 0;
    for (float v : t.to_vector<float>()) c += v != 0.f;
    return c;
  }
  int64_t eager() const { return nonzero(x * x); }    // on the calling thread's team
  int64_t compiled() { return nonzero(product(x)); }  // on the executor thread's team
};
}  // namespace

TEST(Runtime, FlushDenormalReachesEagerOpsCompiledStepsAndTheirTeams) {
  cs::set_num_threads(2);
  DenormalProbe p;
  ASSERT_TRUE(cs::set_flush_denormal(true));
  EXPECT_EQ(p.eager(), 0);
  EXPECT_EQ(p.compiled(), 0);
  cs::set_flush_denormal(false);  // PyTorch's default
  EXPECT_EQ(p.eager(), p.n);
  EXPECT_EQ(p.compiled(), p.n);
  EXPECT_GT((p.x * p.x).to_vector<float>()[p.n - 1], 0.f);
}

namespace {
// Threads of this process now: /proc/self/task lists each one.
int process_threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}
// The thread count once it settles at `want` (an ended thread leaves the list shortly after its
// join returns), or the last count seen within a second.
int threads_settling_at(int want) {
  int n = process_threads();
  for (int i = 0; i < 100 && n != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = process_threads();
  }
  return n;
}
// Blocks this (client) thread on the executor for a while.
void block_on_executor() {
  cs::step_closure([] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); })();
  cs::synchronize();
}
}  // namespace

// Idle OpenMP teams of other threads make libgomp cut its spin-wait short for every team, so a
// client thread that blocks on the executor ends its own idle team, and an idle executor ends
// its team for the client's eager kernels. Denormal modes survive a team's restart.
TEST(Runtime, BlockedClientAndIdleExecutorEndTheirIdleTeams) {
  cs::set_num_threads(2);
  DenormalProbe p;
  (void)p.product(p.x);
  block_on_executor();
  // Neither thread has a team once the executor has been idle for a while.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const int base = process_threads();
  (void)(p.x * p.x);  // eager: this thread's team starts (one more thread)
  EXPECT_EQ(threads_settling_at(base + 1), base + 1);
  block_on_executor();  // blocked: this thread's team ended
  EXPECT_EQ(threads_settling_at(base), base);
  (void)p.product(p.x);  // the executor's team starts, then ends once the executor is idle
  cs::synchronize();
  EXPECT_EQ(threads_settling_at(base), base);

  // Teams started after set_flush_denormal inherit the modes from their first thread.
  ASSERT_TRUE(cs::set_flush_denormal(true));
  block_on_executor();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(threads_settling_at(base), base);
  EXPECT_EQ(p.eager(), 0);     // eager, on a new team
  EXPECT_EQ(p.compiled(), 0);  // compiled, on the executor's new team
  cs::set_flush_denormal(false);
  EXPECT_EQ(p.eager(), p.n);
}

// PyTorch's usual order (zero_grad first): gradients exist between calls but the body drops
// them before use, so one extra variant is traced at most, not one per call.
TEST(Trace, ZeroGradFirstBodyIsNotRetracedEveryCall) {
  cs::manual_seed(2);
  cs::nn::Sequential m(cs::nn::Linear(6, 8), cs::nn::ReLU(), cs::nn::Linear(8, 3));
  cs::optim::SGD opt(m->parameters(), 0.1, 0.9);
  int traces = 0;
  auto step = cs::trace([&](const Tensor& x, const Tensor& y) {
    ++traces;
    opt.zero_grad();
    auto loss = cs::cross_entropy(m(x), y);
    loss.backward();
    opt.step();
    return loss;
  });
  Tensor x = cs::randn({4, 6});
  Tensor y = cs::from_vector(std::vector<int64_t>{0, 1, 2, 0}, {4});
  float first = 0, last = 0;
  for (int i = 0; i < 30; ++i) {
    auto l = step(x, y);
    if (i == 0) first = l.item<float>();
    if (i == 29) last = l.item<float>();
  }
  EXPECT_LE(traces, 2);
  EXPECT_LT(last, first);
}

// Tracing a new signature while earlier steps are still queued (the last, smaller batch).
TEST(Trace, RetracingWhileStepsAreQueuedIsSafe) {
  cs::manual_seed(4);
  cs::nn::Sequential m(cs::nn::Linear(32, 64), cs::nn::ReLU(), cs::nn::Linear(64, 4));
  cs::optim::SGD opt(m->parameters(), 0.01, 0.9);
  auto step = cs::trace([&](const Tensor& x) {
    auto loss = cs::sum(m(x));
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  });
  for (int round = 0; round < 20; ++round)
    for (int64_t b : {16, 16, 16, 5}) step(cs::randn({b, 32}));
  EXPECT_NO_THROW(cs::synchronize());
}

// Gradient accumulation split over two traced functions (one only accumulates, the other
// also steps and sets the gradients to none): the .grad handles each leaves must be re-applied
// on every replay, or the next call would see the wrong gradient presence.
TEST(Trace, AccumulateThenStepAcrossTwoTracedFunctionsMatchesEager) {
  auto run = [](bool traced) {
    cs::manual_seed(1);
    cs::nn::Linear fc(3, 2);
    auto opt = cs::optim::configure_optimizer("SGD", fc->parameters(), {{"lr", 0.1}});
    auto x1 = cs::randn({4, 3}), x2 = cs::randn({4, 3});
    auto body = [&](const Tensor& x, bool update) {
      auto loss = cs::mean(fc(x));
      (loss * 0.5).backward();
      if (update) {
        opt->step();
        opt->zero_grad();
      }
      return loss;
    };
    auto accumulate = cs::trace([&](const Tensor& x) { return body(x, false); });
    auto step = cs::trace([&](const Tensor& x) { return body(x, true); });
    for (int i = 0; i < 3; ++i) {
      if (traced) {
        accumulate(x1);
        EXPECT_TRUE(fc->weight.grad().defined());
        step(x2);
        EXPECT_FALSE(fc->weight.grad().defined());
      } else {
        body(x1, false);
        body(x2, true);
      }
    }
    return fc->weight.to_vector<float>();
  };
  auto eager = run(false);
  int64_t traces = cs::runtime_stats().traces;
  auto traced = run(true);
  ASSERT_EQ(eager.size(), traced.size());
  for (size_t i = 0; i < eager.size(); ++i) EXPECT_FLOAT_EQ(eager[i], traced[i]) << i;
  EXPECT_EQ(cs::runtime_stats().traces - traces, 2);  // one variant each: no re-trace per call
}
