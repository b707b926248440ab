// Schedulers without a PyTorch counterpart against their closed-form formulas (computed here
// in double), inside a traced step replayed 600 times; configure_lr_scheduler rules and
// errors; state_dict; a weight-decay schedule.
#include <gtest/gtest.h>

#include <cmath>

#include "cstorch/cstorch.h"
#include "unit/test_util.h"

namespace cstorch::testing {
namespace {

namespace ls = optim::lr_scheduler;
constexpr int kSteps = 600;

struct Fixture {
  Tensor p;
  std::unique_ptr<optim::SGD> opt;
  Fixture() {
    p = zeros({1});
    p.set_requires_grad(true);
    opt = std::make_unique<optim::SGD>(std::vector<Tensor>{p}, 0.1);
  }
};

// The value at steps 0 .. kSteps-1, from a traced step (optimizer step, scheduler step).
std::vector<double> traced_values(Fixture& f, ls::LRScheduler& s, const std::string& key = "lr") {
  std::vector<double> r{f.opt->hyper_tensor(0, key).item<double>()};
  auto step = trace([&](const Tensor& x) {
    sum(f.p * x).backward();
    f.opt->step();
    f.opt->zero_grad();
    s.step();
    return f.opt->hyper_tensor(0, key) * 1.0;
  });
  std::vector<Tensor> outs;
  for (int i = 1; i < kSteps; ++i) outs.push_back(step(ones({1})));
  for (auto& o : outs) r.push_back(o.item<double>());
  return r;
}

void expect_formula(const std::vector<double>& got, const std::function<double(double)>& f,
                    const std::string& what) {
  ASSERT_EQ(got.size(), static_cast<size_t>(kSteps));
  int bad = 0;
  for (int s = 0; s < kSteps; ++s) {
    double want = f(s);
    if (!(std::abs(got[s] - want) <= 1e-6 * std::abs(want) + 1e-12) && bad++ < 5)
      ADD_FAILURE() << what << ": step " << s << ": " << got[s] << " vs formula " << want;
  }
}

TEST(Schedulers, ClosedFormsMatchTheFormulasInATracedStep) {
  struct Case {
    std::string name;
    std::function<std::shared_ptr<ls::LRScheduler>(optim::Optimizer&)> make;
    std::function<double(double)> formula;
  };
  const double pi = M_PI;
  std::vector<Case> cases = {
      {"ConstantLR", [](auto& o) { return std::make_shared<ls::ConstantLR>(o, 0.03); },
       [](double) { return 0.03; }},
      {"PolynomialLR",
       [](auto& o) { return std::make_shared<ls::PolynomialLR>(o, 0.1, 0.001, 400, 1.5); },
       [](double s) {
         return s >= 400 ? 0.001 : (0.1 - 0.001) * std::pow(1 - s / 400, 1.5) + 0.001;
       }},
      {"PolynomialLR_cycle",
       [](auto& o) { return std::make_shared<ls::PolynomialLR>(o, 0.1, 0.01, 150, 2.0, true); },
       [](double s) {
         double d = 150 * std::max(1.0, std::ceil(s / 150));
         return (0.1 - 0.01) * std::pow(1 - s / d, 2.0) + 0.01;
       }},
      {"PolynomialLR_warmup",
       [](auto& o) { return std::make_shared<ls::PolynomialLR>(o, 0.0, 0.2, 300, 1.0); },
       [](double s) { return s >= 300 ? 0.2 : (0.0 - 0.2) * (1 - s / 300) + 0.2; }},
      {"ExponentialLR_T",
       [](auto& o) { return std::make_shared<ls::ExponentialLR>(o, 0.1, 70, 0.5); },
       [](double s) { return 0.1 * std::pow(0.5, s / 70); }},
      {"ExponentialLR_staircase",
       [](auto& o) { return std::make_shared<ls::ExponentialLR>(o, 0.1, 70, 0.5, true); },
       [](double s) { return 0.1 * std::pow(0.5, std::floor(s / 70)); }},
      {"InverseExponentialTimeDecayLR",
       [](auto& o) {
         return std::make_shared<ls::InverseExponentialTimeDecayLR>(o, 0.1, 1.5, 100, 0.3);
       },
       [](double s) { return 0.1 / (1 + 0.3 * std::pow(s, 1.5) / 100); }},
      {"InverseExponentialTimeDecayLR_staircase",
       [](auto& o) {
         return std::make_shared<ls::InverseExponentialTimeDecayLR>(o, 0.1, 1.0, 50, 0.3, true);
       },
       [](double s) { return 0.1 / (1 + 0.3 * std::floor(s / 50)); }},
      {"InverseSquareRootDecayLR",
       [](auto& o) { return std::make_shared<ls::InverseSquareRootDecayLR>(o, 2.0, 0.5, 40); },
       [](double s) { return 2.0 * 0.5 / std::sqrt(std::max(40.0, s)); }},
      {"CosineDecayLR",
       [](auto& o) { return std::make_shared<ls::CosineDecayLR>(o, 0.1, 0.001, 450); },
       [pi](double s) {
         return 0.001 + (0.1 - 0.001) * 0.5 * (1 + std::cos(pi * std::min(s, 450.0) / 450));
       }},
      {"PiecewiseConstantLR",
       [](auto& o) {
         return std::make_shared<ls::PiecewiseConstantLR>(o, std::vector<double>{0.1, 0.05, 0.01},
                                                          std::vector<int64_t>{100, 350});
       },
       [](double s) { return s < 100   ? 0.1
                             : s < 350 ? 0.05
                                       : 0.01; }},
  };
  for (auto& c : cases) {
    Fixture f;
    auto s = c.make(*f.opt);
    expect_formula(traced_values(f, *s), c.formula, c.name);
  }
}

TEST(Schedulers, WeightDecayScheduleDrivesTheGroupValue) {
  Fixture f;
  optim::AdamW opt({f.p}, 1e-3, 0.9, 0.999, 1e-8, 0.01);
  f.opt.reset();
  ls::CosineDecayLR wd({opt, "weight_decay"}, 0.1, 0.0, 100);
  EXPECT_NEAR(opt.param_groups()[0].tensors.at("weight_decay").item<double>(), 0.1, 1e-7);
  EXPECT_NEAR(opt.param_groups()[0].lr.item<double>(), 1e-3, 1e-7);  // lr untouched
  for (int i = 0; i < 50; ++i) wd.step();
  EXPECT_NEAR(wd.get_last_lr()[0], 0.05, 1e-7);
  State sd = opt.state_dict();
  EXPECT_NEAR(sd.at("param_groups")[0].at("weight_decay").as_double(), 0.05, 1e-7);
}

TEST(Schedulers, StateDictRestoresTheStep) {
  Fixture f;
  ls::StepLR a(*f.opt, 0.1, 10, 0.5);
  for (int i = 0; i < 25; ++i) a.step();
  State sd = a.state_dict();
  EXPECT_EQ(sd.at("last_epoch").as_int(), 25);
  Fixture g;
  ls::StepLR b(*g.opt, 0.1, 10, 0.5);
  b.load_state_dict(sd);
  EXPECT_NEAR(b.get_last_lr()[0], 0.025, 1e-7);
  b.step();
  a.step();
  EXPECT_EQ(a.get_last_lr(), b.get_last_lr());
  expect_error([&] { b.load_state_dict(State::map({{"epoch", 3}})); }, {"'last_epoch'"});
}

TEST(Schedulers, NestedSchedulerCannotStepAlone) {
  Fixture f;
  auto warm = std::make_shared<ls::LinearLR>(*f.opt, 0.0, 0.1, 10);
  auto decay = std::make_shared<ls::CosineDecayLR>(*f.opt, 0.1, 0.0, 90);
  ls::SequentialLR seq(*f.opt, {warm, decay}, {10});
  EXPECT_NEAR(seq.get_last_lr()[0], 0.0, 1e-12);
  expect_error([&] { warm->step(); }, {"part of a SequentialLR"});
  expect_error([&] { ls::SequentialLR(*f.opt, {warm, decay}, {}); }, {"expected 1 milestones"});
}

// A user scheduler that does not call start(): its first value is written at first use.
class Halving : public ls::LRScheduler {
 public:
  explicit Halving(optim::Optimizer& o) : LRScheduler(o) {}
  Tensor closed_form_lr(const Tensor& s) const override { return pow(scalar_tensor(0.5), s); }
  std::string name() const override { return "Halving"; }
};

TEST(Schedulers, UserSchedulerStartsAtFirstUse) {
  Fixture f;
  Halving h(*f.opt);
  EXPECT_NEAR(f.opt->param_groups()[0].lr.item<double>(), 0.1, 1e-7);  // not yet written
  f.opt->step();  // the optimizer's step writes the first value before updating
  EXPECT_NEAR(f.opt->param_groups()[0].lr.item<double>(), 1.0, 1e-7);
  h.step();
  EXPECT_NEAR(h.get_last_lr()[0], 0.5, 1e-7);
}

TEST(ConfigureLRScheduler, NumberMapAndListRules) {
  Fixture f;
  auto c = optim::configure_lr_scheduler(*f.opt, 0.02);
  EXPECT_EQ(c->name(), "ConstantLR");
  EXPECT_NEAR(c->get_last_lr()[0], 0.02, 1e-7);
  auto cos = optim::configure_lr_scheduler(
      *f.opt, parse_config("{scheduler: cosinedecay, initial_learning_rate: 0.1, "
                           "end_learning_rate: 0.0, total_iters: 100}"));
  EXPECT_EQ(cos->name(), "CosineDecayLR");
  // A list: SequentialLR with milestones the running sum of total_iters (10, then 10 + 20).
  auto seq = optim::configure_lr_scheduler(
      *f.opt, parse_config("[{scheduler: Linear, initial_learning_rate: 0.0, end_learning_rate: "
                           "0.1, total_iters: 10}, {scheduler: Constant, learning_rate: 0.1, "
                           "total_iters: 20}, {scheduler: Exponential, initial_learning_rate: "
                           "0.1, total_iters: 1, decay_rate: 0.5}]"));
  EXPECT_EQ(seq->name(), "SequentialLR");
  std::vector<double> v;
  for (int s = 0; s < 33; ++s) {
    v.push_back(seq->get_last_lr()[0]);
    seq->step();
  }
  EXPECT_NEAR(v[5], 0.05, 1e-8);
  EXPECT_NEAR(v[10], 0.1, 1e-8);
  EXPECT_NEAR(v[29], 0.1, 1e-8);
  EXPECT_NEAR(v[30], 0.1, 1e-8);
  EXPECT_NEAR(v[32], 0.025, 1e-8);
  auto chain = optim::configure_lr_scheduler(
      *f.opt, parse_config("[{scheduler: Exponential, initial_learning_rate: 0.1, total_iters: 1, "
                           "decay_rate: 0.5, main_scheduler: ChainedLR}, {scheduler: Step, "
                           "initial_learning_rate: 0.2, step_size: 2, gamma: 0.1}]"));
  EXPECT_EQ(chain->name(), "ChainedLR");
  for (int s = 0; s < 3; ++s) chain->step();
  EXPECT_NEAR(chain->get_last_lr()[0], 0.1 * 0.125 * 0.1, 1e-7);  // 0.1 * 0.5^3 * 0.1^1
}

TEST(ConfigureLRScheduler, Errors) {
  Fixture f;
  auto cfg = [&](const std::string& y) { optim::configure_lr_scheduler(*f.opt, parse_config(y)); };
  expect_error([&] { cfg("{scheduler: Cosyne, initial_learning_rate: 0.1}"); },
               {"unknown scheduler 'Cosyne'", "CosineDecayLR", "StepLR", "OneCycleLR"});
  expect_error(
      [&] { cfg("{scheduler: StepLR, initial_learning_rate: 0.1, step_size: 3, gama: 0.1}"); },
      {"unknown key 'gama'", "gamma"});
  expect_error(
      [&] {
        cfg("{scheduler: CosineDecay, initial_learning_rate: 0.1, end_learning_rate: 0, "
            "decay_steps: 10}");
      },
      {"'decay_steps' was renamed; use 'total_iters'"});
  expect_error(
      [&] {
        cfg("{scheduler: CosineDecay, learning_rate: 0.1, end_learning_rate: 0, total_iters: 10}");
      },
      {"'learning_rate' was renamed; use 'initial_learning_rate'"});
  expect_error([&] { cfg("{scheduler: PiecewiseConstant, values: [0.1, 0.2], milestones: [3]}"); },
               {"'values' was renamed; use 'learning_rates'"});
  expect_error(
      [&] { cfg("{scheduler: PiecewiseConstant, learning_rates: [0.1, 0.2], boundaries: [3]}"); },
      {"'boundaries' was renamed; use 'milestones'"});
  expect_error(
      [&] { cfg("{scheduler: Exponential, base_lr: 0.1, total_iters: 1, decay_rate: 0.5}"); },
      {"'base_lr' was renamed; use 'initial_learning_rate'"});
  expect_error([&] { cfg("{scheduler: Constant, learning_rate: -0.1}"); },
               {"invalid learning_rate -0.1"});
  expect_error(
      [&] {
        cfg("[{scheduler: Step, initial_learning_rate: 0.1, step_size: 3}, {scheduler: Constant, "
            "learning_rate: 0.1}]");
      },
      {"learning_rate[0]", "needs 'total_iters'"});
  expect_error([&] { cfg("{scheduler: Lambda}"); }, {"LambdaLR needs a function"});
  expect_error([&] { cfg("{scheduler: StepLR, initial_learning_rate: 0.1}"); },
               {"missing required key 'step_size'"});
  expect_error(
      [&] { cfg("[{scheduler: Constant, learning_rate: 0.1, main_scheduler: Parallel}]"); },
      {"main_scheduler", "expected ChainedLR or SequentialLR"});
}

// Parameter groups given different rates: a scheduler sets one rate for every group (the
// documented behaviour), and says so once for the optimizer, naming the values.
class TwoGroupOptimizer : public optim::Optimizer {
 public:
  explicit TwoGroupOptimizer(std::vector<optim::ParamGroup> g)
      : Optimizer(std::move(g), {{"lr", 0.1}}) {}
  void preinitialize() override {}
  void step() override {}
  std::vector<std::string> state_names_to_sparsify() const override { return {}; }
  std::string name() const override { return "TwoGroupOptimizer"; }
};

TEST(Schedulers, GroupsWithDifferentRatesAreWarnedOnce) {
  auto param = [] { return zeros({2}).set_requires_grad(true); };
  std::vector<optim::ParamGroup> groups(2);
  groups[0].params = {param()};
  groups[0].options["lr"] = 0.1;
  groups[1].params = {param()};
  groups[1].options["lr"] = 0.01;
  TwoGroupOptimizer opt(std::move(groups));
  ::testing::internal::CaptureStderr();
  ls::StepLR a(opt, 0.1, 2, 0.5);
  ls::StepLR b(opt, 0.1, 2, 0.5);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string want =
      "warning: a scheduler of lr on an optimizer whose 2 parameter groups have different "
      "values (0.1, 0.01): it sets one value for every group";
  EXPECT_NE(err.find(want), std::string::npos) << err;
  EXPECT_EQ(err.find("warning", err.find(want) + 1), std::string::npos) << err;  // once
  EXPECT_EQ(a.get_last_lr(), (std::vector<double>{0.1f, 0.1f}));
  // Groups of one rate: nothing said.
  std::vector<optim::ParamGroup> same(2);
  same[0].params = {param()};
  same[1].params = {param()};
  TwoGroupOptimizer opt2(std::move(same));
  ::testing::internal::CaptureStderr();
  ls::StepLR c(opt2, 0.1, 2, 0.5);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace cstorch::testing
