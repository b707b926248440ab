// Schedulers without a PyTorch counterpart against their closed-form formulas (computed here
// in double), inside a traced step replayed 600 times; OneCycleLR's edges (arguments torch
// cannot run, steps at and past total_steps) against values printed by torch; errors that
// name the scheduler and argument; configure_lr_scheduler rules and errors; state_dict; a
// weight-decay schedule.
#include <gtest/gtest.h>
#include <cstring>

#include <cmath>
#include <limits>

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

// Values below are torch 1.13's, printed by
//   opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
//   s = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=T, pct_start=p,
//                                           cycle_momentum=False, ...)
//   r = [s.get_last_lr()[0]]; then opt.step(); s.step(); r.append(s.get_last_lr()[0]) per step
// (initial_learning_rate here is torch's max_lr / div_factor, 0.1 / 25 = 0.004 by default).
void expect_torch(double got, double want, const std::string& what) {
  EXPECT_NEAR(got, want, 1e-6 * std::abs(want) + 1e-12) << what;
}

// The values at steps 0 .. n-1, stepping eagerly.
std::vector<double> eager_values(ls::LRScheduler& s, int n) {
  std::vector<double> r;
  for (int i = 0; i < n; ++i) {
    r.push_back(s.get_last_lr()[0]);
    s.step();
  }
  return r;
}

// A phase of zero steps would make its rate 0/0 (NaN weights); torch raises ZeroDivisionError
// for exactly these arguments, at construction (the first phase) or at step total_steps (the
// last), so they are an error at construction. Phases of negative length, which torch runs,
// are accepted.
TEST(Schedulers, OneCycleLRRejectsAPhaseOfZeroStepsAsTorchDoes) {
  Fixture f;
  // pct_start * total_steps = 1: the rise ends where it starts (torch fails at step 0).
  EXPECT_ERROR(ls::OneCycleLR(*f.opt, 0.01, 0.1, 4),
               "OneCycleLR: pct_start 0.25 with total_steps 4 gives the rise from "
               "initial_learning_rate to max_lr zero steps (it starts and ends at step 0)",
               "PyTorch raises ZeroDivisionError", "pct_start * total_steps must not be 1");
  EXPECT_ERROR(ls::OneCycleLR(*f.opt, 0.01, 0.1, 4, 0.25, 1e4, true, "linear"),
               "pct_start 0.25 with total_steps 4 and three_phase gives the rise",
               "pct_start * total_steps must not be 1");
  EXPECT_ERROR(ls::OneCycleLR(*f.opt, 0.01, 0.1, 10, 0.1), "pct_start 0.1 with total_steps 10",
               "pct_start * total_steps must not be 1");
  // The last phase of zero steps (torch fails at step total_steps, the end of the documented
  // loop of one step() per batch).
  EXPECT_ERROR(ls::OneCycleLR(*f.opt, 0.01, 0.1, 4, 1.0),
               "OneCycleLR: pct_start 1 with total_steps 4 gives the fall from max_lr to "
               "initial_learning_rate / final_div_factor zero steps (it starts and ends at step 3)",
               "pct_start must be below 1");
  EXPECT_ERROR(ls::OneCycleLR(*f.opt, 0.01, 0.1, 4, 0.625, 1e4, true),
               "pct_start 0.625 with total_steps 4 and three_phase gives the fall from "
               "initial_learning_rate to initial_learning_rate / final_div_factor zero steps",
               "2 * pct_start * total_steps must not be total_steps + 1 (5)");
  EXPECT_ERROR(optim::configure_lr_scheduler(
                   *f.opt, parse_config("{scheduler: OneCycle, initial_learning_rate: 0.01, "
                                        "max_lr: 0.1, total_steps: 4}")),
               "OneCycleLR: pct_start 0.25 with total_steps 4");

  // Arguments torch runs although a phase is never reached or runs backwards: its values, up
  // to and including step total_steps.
  struct Case {
    std::string name;
    double pct_start;
    bool three_phase;
    std::vector<double> torch;  // steps 0 .. total_steps (4)
  };
  const std::vector<Case> cases = {
      // pct_start * total_steps < 1: the rise is never reached.
      {"pct_start 0.1",
       0.1,
       false,
       {0.09330129698, 0.05868257415, 0.01786094807, 4e-07, 0.01786094807}},
      // The last phase ends before it starts and is first reached at total_steps.
      {"pct_start 0.7, three_phase",
       0.7,
       true,
       {0.004, 0.06033511253, 0.0971052458, 0.028, 0.0010003}},
      // The last phase is never reached.
      {"pct_start 0.75, three_phase", 0.75, true, {0.004, 0.052, 0.1, 0.052, 0.004}},
  };
  for (const auto& c : cases) {
    Fixture g;
    ls::OneCycleLR s(*g.opt, 0.004, 0.1, 4, c.pct_start, 1e4, c.three_phase);
    std::vector<double> got = eager_values(s, 7);
    for (int i = 0; i < 5; ++i)
      expect_torch(got[i], c.torch[i], c.name + ", step " + std::to_string(i));
    // Past total_steps: the value of the last step, 3.
    EXPECT_EQ(got[5], got[3]) << c.name;
    EXPECT_EQ(got[6], got[3]) << c.name;
  }
}

// Steps 0 .. total_steps - 1 are torch's; step total_steps is torch's unless that is negative
// (then the last step's value); later steps (where torch raises) hold the last step's value,
// never a negative one or one that rises again.
TEST(Schedulers, OneCycleLRPastTotalStepsHoldsTheFinalRate) {
  {
    // three_phase, linear: torch's step 20 is -0.000444, so step 19's value stays.
    Fixture f;
    ls::OneCycleLR s(*f.opt, 0.004, 0.1, 20, 0.3, 1e4, true, "linear");
    std::vector<double> got = eager_values(s, 23);
    expect_torch(got[18], 0.0004448, "linear, step 18");
    expect_torch(got[19], 4e-07, "linear, step 19");
    for (int i = 20; i < 23; ++i) EXPECT_EQ(got[i], got[19]) << "linear, step " << i;
  }
  {
    // cos: torch's step 20 continues the cosine back up to step 18's value; kept, then step
    // 19's value from step 21 on.
    Fixture f;
    ls::OneCycleLR s(*f.opt, 0.004, 0.1, 20, 0.3);
    std::vector<double> got = eager_values(s, 23);
    expect_torch(got[18], 0.001253999376, "cos, step 18");
    expect_torch(got[19], 4e-07, "cos, step 19");
    expect_torch(got[20], 0.001253999376, "cos, step 20");
    for (int i = 21; i < 23; ++i) EXPECT_EQ(got[i], got[19]) << "cos, step " << i;
  }
  {
    // linear with a large final rate (div_factor 2.5, final_div_factor 1.25): torch's step 5 is
    // below the final rate but not negative, so it is kept.
    Fixture f;
    ls::OneCycleLR s(*f.opt, 0.04, 0.1, 5, 0.4, 1.25, false, "linear");
    std::vector<double> got = eager_values(s, 8);
    const std::vector<double> torch = {0.04,          0.1,   0.07733333333,
                                       0.05466666667, 0.032, 0.009333333333};
    for (int i = 0; i < 6; ++i) expect_torch(got[i], torch[i], "step " + std::to_string(i));
    EXPECT_EQ(got[6], got[4]);
    EXPECT_EQ(got[7], got[4]);
  }
  // The same in a traced step, where the step is a tensor of the graph: 600 steps of a
  // schedule of 400.
  struct Case {
    std::string name;
    bool three_phase;
    std::string anneal;
    std::vector<double> torch;  // steps 0, 100, 250, 399, 400
  };
  const std::vector<Case> cases = {
      {"three_phase linear",
       true,
       "linear",
       {0.004, 0.08467226891, 0.003701893168, 4e-07, -2.444223602e-05}},
      {"cos", false, "cos", {0.004, 0.09408711626, 0.05504059172, 4e-07, 3.547149676e-06}},
  };
  for (const auto& c : cases) {
    Fixture f;
    ls::OneCycleLR s(*f.opt, 0.004, 0.1, 400, 0.3, 1e4, c.three_phase, c.anneal);
    std::vector<double> got = traced_values(f, s);
    const int steps[] = {0, 100, 250, 399};
    for (int i = 0; i < 4; ++i)
      expect_torch(got[steps[i]], c.torch[i], c.name + ", step " + std::to_string(steps[i]));
    if (c.torch[4] < 0)
      EXPECT_EQ(got[400], got[399]) << c.name;
    else
      expect_torch(got[400], c.torch[4], c.name + ", step 400");
    for (int i = 401; i < kSteps; ++i) {
      EXPECT_EQ(got[i], got[399]) << c.name << ", step " << i;
      if (got[i] != got[399]) break;
    }
  }
}

// A schedule length the base class checks (as total_iters) is named as the scheduler's own
// argument, under the scheduler's name.
TEST(Schedulers, LengthErrorsNameTheSchedulerAndItsArgument) {
  Fixture f;
  auto message = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_EQ(message([&] { ls::CosineAnnealingLR(*f.opt, 0.1, 0); }),
            "CosineAnnealingLR: invalid T_max 0 (must be > 0)");
  EXPECT_EQ(message([&] { ls::OneCycleLR(*f.opt, 0.01, 0.1, 0); }),
            "OneCycleLR: invalid total_steps 0 (must be > 0)");
  EXPECT_EQ(message([&] { ls::LinearLR(*f.opt, 0.1, 0.0, 0); }),
            "LinearLR: invalid total_iters 0 (must be > 0)");
  EXPECT_EQ(message([&] { ls::ConstantLR(*f.opt, 0.1, int64_t{0}); }),
            "ConstantLR: invalid total_iters 0 (must be > 0)");
  // From configuration, where the user wrote T_max or total_steps.
  std::string m = message([&] {
    optim::configure_lr_scheduler(
        *f.opt, parse_config("{scheduler: CosineAnnealing, initial_learning_rate: 0.1, T_max: 0}"));
  });
  EXPECT_NE(m.find("CosineAnnealingLR: invalid T_max 0 (must be > 0)"), std::string::npos) << m;
  EXPECT_EQ(m.find("total_iters"), std::string::npos) << m;
  m = message([&] {
    optim::configure_lr_scheduler(*f.opt,
                                  parse_config("{scheduler: OneCycle, initial_learning_rate: "
                                               "0.01, max_lr: 0.1, total_steps: 0}"));
  });
  EXPECT_NE(m.find("OneCycleLR: invalid total_steps 0 (must be > 0)"), std::string::npos) << m;
  EXPECT_EQ(m.find("total_iters"), std::string::npos) << m;
}

// Rates, factors and bounds that are infinite or NaN are refused, as the optimizers refuse an
// infinite learning rate, by an error naming the scheduler, the argument and the value; the
// optimizer keeps its rate.
TEST(Schedulers, NonFiniteArgumentsAreErrorsNamingTheArgument) {
  Fixture f;
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto pow2 = [](const Tensor& s) { return pow(full_like(s, 2.0), s); };
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] { ls::ConstantLR(*f.opt, inf); },
       "ConstantLR: invalid learning_rate inf (must be >= 0 and finite)"},
      {[&] { ls::ConstantLR(*f.opt, nan); },
       "ConstantLR: invalid learning_rate nan (must be >= 0 and finite)"},
      {[&] { ls::ConstantLR(*f.opt, -0.1); },
       "ConstantLR: invalid learning_rate -0.1 (must be >= 0 and finite)"},
      {[&] { ls::LinearLR(*f.opt, inf, 0.1, 10); },
       "LinearLR: invalid initial_learning_rate inf (must be >= 0 and finite)"},
      {[&] { ls::LinearLR(*f.opt, 0.1, -inf, 10); },
       "LinearLR: invalid end_learning_rate -inf (must be >= 0 and finite)"},
      {[&] { ls::PolynomialLR(*f.opt, nan, 0.0, 10); },
       "PolynomialLR: invalid initial_learning_rate nan (must be >= 0 and finite)"},
      {[&] { ls::PolynomialLR(*f.opt, 0.1, inf, 10); },
       "PolynomialLR: invalid end_learning_rate inf (must be >= 0 and finite)"},
      {[&] { ls::PolynomialLR(*f.opt, 0.1, 0.0, 10, inf); },
       "PolynomialLR: invalid power inf (must be >= 0 and finite)"},
      {[&] { ls::ExponentialLR(*f.opt, inf, 1, 0.5); },
       "ExponentialLR: invalid initial_learning_rate inf (must be finite)"},
      {[&] { ls::ExponentialLR(*f.opt, 0.1, 1, inf); },
       "ExponentialLR: invalid decay_rate inf (must be > 0 and finite)"},
      {[&] { ls::ExponentialLR(*f.opt, 0.1, 1, 0.0); },
       "ExponentialLR: invalid decay_rate 0 (must be > 0 and finite)"},
      {[&] { ls::InverseExponentialTimeDecayLR(*f.opt, inf, 1.0, 10, 0.5); },
       "InverseExponentialTimeDecayLR: invalid initial_learning_rate inf (must be finite)"},
      {[&] { ls::InverseExponentialTimeDecayLR(*f.opt, 0.1, nan, 10, 0.5); },
       "InverseExponentialTimeDecayLR: invalid step_exponent nan (must be finite)"},
      {[&] { ls::InverseExponentialTimeDecayLR(*f.opt, 0.1, 1.0, 10, inf); },
       "InverseExponentialTimeDecayLR: invalid decay_rate inf (must be finite)"},
      {[&] { ls::InverseSquareRootDecayLR(*f.opt, nan); },
       "InverseSquareRootDecayLR: invalid initial_learning_rate nan (must be finite)"},
      {[&] { ls::InverseSquareRootDecayLR(*f.opt, 1.0, inf); },
       "InverseSquareRootDecayLR: invalid scale inf (must be finite)"},
      {[&] { ls::CosineDecayLR(*f.opt, inf, 0.0, 10); },
       "CosineDecayLR: invalid initial_learning_rate inf (must be finite)"},
      {[&] { ls::CosineDecayLR(*f.opt, 0.1, nan, 10); },
       "CosineDecayLR: invalid end_learning_rate nan (must be finite)"},
      {[&] { ls::CosineAnnealingLR(*f.opt, inf, 10); },
       "CosineAnnealingLR: invalid initial_learning_rate inf (must be finite)"},
      {[&] { ls::CosineAnnealingLR(*f.opt, 0.1, 10, inf); },
       "CosineAnnealingLR: invalid eta_min inf (must be finite)"},
      {[&] { ls::CosineAnnealingWarmRestarts(*f.opt, nan, 10); },
       "CosineAnnealingWarmRestarts: invalid initial_learning_rate nan (must be finite)"},
      {[&] { ls::CosineAnnealingWarmRestarts(*f.opt, 0.1, 10, 2, -inf); },
       "CosineAnnealingWarmRestarts: invalid eta_min -inf (must be finite)"},
      {[&] { ls::StepLR(*f.opt, inf, 3); },
       "StepLR: invalid initial_learning_rate inf (must be finite)"},
      {[&] { ls::StepLR(*f.opt, 0.1, 3, inf); }, "StepLR: invalid gamma inf (must be finite)"},
      {[&] { ls::MultiStepLR(*f.opt, nan, {3}); },
       "MultiStepLR: invalid initial_learning_rate nan (must be finite)"},
      {[&] { ls::MultiStepLR(*f.opt, 0.1, {3}, nan); },
       "MultiStepLR: invalid gamma nan (must be finite)"},
      {[&] { ls::MultiplicativeLR(*f.opt, inf, 0.9); },
       "MultiplicativeLR: invalid initial_learning_rate inf (must be finite)"},
      {[&] { ls::MultiplicativeLR(*f.opt, 0.1, inf); },
       "MultiplicativeLR: invalid coefficient inf (must be > 0 and finite)"},
      {[&] { ls::LambdaLR(*f.opt, inf, pow2); },
       "LambdaLR: invalid initial_learning_rate inf (must be finite)"},
      {[&] { ls::CyclicLR(*f.opt, nan, 0.1); }, "CyclicLR: invalid base_lr nan (must be finite)"},
      {[&] { ls::CyclicLR(*f.opt, 0.01, inf); }, "CyclicLR: invalid max_lr inf (must be finite)"},
      {[&] { ls::CyclicLR(*f.opt, 0.01, 0.1, 10, std::nullopt, "exp_range", inf); },
       "CyclicLR: invalid gamma inf (must be finite)"},
      {[&] { ls::OneCycleLR(*f.opt, inf, 0.1, 100); },
       "OneCycleLR: invalid initial_learning_rate inf (must be finite)"},
      {[&] { ls::OneCycleLR(*f.opt, 0.01, inf, 100); },
       "OneCycleLR: invalid max_lr inf (must be finite)"},
      {[&] { ls::OneCycleLR(*f.opt, 0.01, 0.1, 100, 0.25, 0.0); },
       "OneCycleLR: invalid final_div_factor 0 (must be > 0 and finite)"},
      {[&] { ls::OneCycleLR(*f.opt, 0.01, 0.1, 100, 0.25, nan); },
       "OneCycleLR: invalid final_div_factor nan (must be > 0 and finite)"},
      {[&] {
         ls::PiecewiseConstantLR(*f.opt, {0.1, inf}, {5});
       },
       "PiecewiseConstantLR: invalid learning_rates[1] inf (must be finite)"},
  };
  for (const auto& [make, want] : cases) {
    EXPECT_EQ(error_message(make), want);
    EXPECT_NEAR(f.opt->param_groups()[0].lr.item<double>(), 0.1, 1e-7) << want;
  }
}

// Finite arguments can still give a value that is not finite as f32 (the schedules compute in
// f32): where the value is computed eagerly (construction, load_state_dict) that is an error
// naming the scheduler, the driven key and the step, and nothing is written.
TEST(Schedulers, AComputedValueThatIsNotFiniteIsAnErrorNamingTheStep) {
  Fixture f;
  // 1e38 * 1e38 / sqrt(1): each argument finite as f32, their value not.
  EXPECT_EQ(error_message([&] { ls::InverseSquareRootDecayLR(*f.opt, 1e38, 1e38); }),
            "InverseSquareRootDecayLR: the computed lr at step 0 is inf, not a finite number");
  EXPECT_NEAR(f.opt->param_groups()[0].lr.item<double>(), 0.1, 1e-7);
  // A rate argument beyond f32 is refused as an argument, before anything is computed.
  EXPECT_EQ(error_message([&] { ls::ConstantLR(*f.opt, 1e39); }),
            "ConstantLR: invalid learning_rate 1e+39 (must be >= 0 and finite as f32, at most "
            "3.4028235e+38)");
  // 10^s overflows f32 at s = 39: resuming there is refused and the scheduler keeps its step.
  ls::ExponentialLR grow(*f.opt, 1.0, 1, 10.0);
  EXPECT_EQ(error_message([&] {
              grow.load_state_dict(State::map({{"last_epoch", 39}}));
            }),
            "ExponentialLR: the computed lr at step 39 is inf, not a finite number");
  EXPECT_EQ(grow.state_dict().at("last_epoch").as_int(), 0);
  EXPECT_NEAR(grow.get_last_lr()[0], 1.0, 1e-7);
  grow.load_state_dict(State::map({{"last_epoch", 38}}));
  EXPECT_NEAR(grow.get_last_lr()[0] / 1e38, 1.0, 1e-5);
  // The driven key is named.
  Tensor q = zeros({1});
  q.set_requires_grad(true);
  optim::AdamW adamw({q}, 1e-3, 0.9, 0.999, 1e-8, 0.01);
  EXPECT_EQ(error_message([&] {
              ls::InverseSquareRootDecayLR({adamw, "weight_decay"}, 1e38, 1e38);
            }),
            "InverseSquareRootDecayLR: the computed weight_decay at step 0 is inf, not a finite "
            "number");
}

// Every built-in schedule that says it is elementwise (what check_steps relies on) gives, for a
// vector of steps, bitwise each step's own value, over cycles, phases, milestones and past the
// schedule's end.
TEST(Schedulers, ElementwiseClosedFormsGiveEachStepsValue) {
  using Make = std::function<std::shared_ptr<ls::LRScheduler>(optim::Optimizer&)>;
  const std::vector<Make> makes = {
      [](auto& o) { return std::make_shared<ls::ConstantLR>(o, 0.03, 40); },
      [](auto& o) { return std::make_shared<ls::PolynomialLR>(o, 0.1, 0.01, 150, 2.0, true); },
      [](auto& o) { return std::make_shared<ls::LinearLR>(o, 0.0, 0.2, 90); },
      [](auto& o) { return std::make_shared<ls::ExponentialLR>(o, 0.1, 7, 0.5, true); },
      [](auto& o) {
        return std::make_shared<ls::InverseExponentialTimeDecayLR>(o, 0.1, 1.5, 100, 0.3);
      },
      [](auto& o) { return std::make_shared<ls::InverseSquareRootDecayLR>(o, 2.0, 0.5, 40); },
      [](auto& o) { return std::make_shared<ls::CosineDecayLR>(o, 0.1, 0.001, 150); },
      [](auto& o) { return std::make_shared<ls::CosineAnnealingLR>(o, 0.1, 60, 0.01); },
      [](auto& o) { return std::make_shared<ls::CosineAnnealingWarmRestarts>(o, 0.1, 10, 2); },
      [](auto& o) { return std::make_shared<ls::StepLR>(o, 0.1, 30, 0.5); },
      [](auto& o) {
        return std::make_shared<ls::MultiStepLR>(o, 0.1, std::vector<int64_t>{20, 75}, 0.3);
      },
      [](auto& o) { return std::make_shared<ls::MultiplicativeLR>(o, 0.1, 0.97); },
      [](auto& o) {
        return std::make_shared<ls::CyclicLR>(o, 0.01, 0.1, 20, 30, "exp_range", 0.99);
      },
      [](auto& o) { return std::make_shared<ls::OneCycleLR>(o, 0.01, 0.1, 150, 0.3, 1e4, true); },
      [](auto& o) {
        return std::make_shared<ls::PiecewiseConstantLR>(o, std::vector<double>{0.1, 0.05, 0.01},
                                                         std::vector<int64_t>{100, 150});
      },
      [](auto& o) {
        auto a = std::make_shared<ls::LinearLR>(o, 0.0, 0.1, 10);
        auto b = std::make_shared<ls::CosineDecayLR>(o, 0.1, 0.0, 90);
        return std::make_shared<ls::SequentialLR>(o, std::vector<ls::SchedulerPtr>{a, b},
                                                  std::vector<int64_t>{10});
      },
      [](auto& o) {
        auto a = std::make_shared<ls::StepLR>(o, 0.1, 30, 0.5);
        auto b = std::make_shared<ls::CosineAnnealingLR>(o, 1.0, 60, 0.1);
        return std::make_shared<ls::ChainedLR>(o, std::vector<ls::SchedulerPtr>{a, b});
      },
  };
  constexpr int64_t n = 200;
  for (const auto& make : makes) {
    Fixture f;
    auto s = make(*f.opt);
    EXPECT_TRUE(s->elementwise()) << s->name();
    const std::vector<float> all =
        s->closed_form_lr(arange(0.0, static_cast<double>(n), 1.0, DType::f32)).to_vector<float>();
    ASSERT_EQ(all.size(), static_cast<size_t>(n)) << s->name();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float one =
          s->closed_form_lr(scalar_tensor(static_cast<double>(i), DType::f32)).item<float>();
      if (std::memcmp(&one, &all[i], sizeof(float)) != 0 && bad++ < 3)
        ADD_FAILURE() << s->name() << " step " << i << ": " << all[i] << " vs " << one;
    }
  }
}

// check_steps: the values of the next steps, before they are taken. 10^s leaves f32 at step 39:
// from step 0, 38 more steps pass and 39 do not (the error names step 39 and the run's end);
// from a restored step 30 the same step is found; nothing is written by a check. Inside a
// SequentialLR the owner checks its parts (the growth starting at its milestone 5, step 44);
// a LambdaLR (one step at a time) and a user-written schedule are checked at the last step.
TEST(Schedulers, CheckStepsNamesTheFirstStepWhoseValueIsNotFinite) {
  Fixture f;
  ls::ExponentialLR grow(*f.opt, 1.0, 1, 10.0);
  EXPECT_NO_THROW(grow.check_steps(38));
  EXPECT_EQ(error_message([&] { grow.check_steps(100); }),
            "ExponentialLR: the computed lr at step 39 is inf, not a finite number (the "
            "schedule's values were checked through step 100, where this run ends)");
  EXPECT_NEAR(grow.get_last_lr()[0], 1.0, 1e-7);
  grow.load_state_dict(State::map({{"last_epoch", 30}}));
  EXPECT_NO_THROW(grow.check_steps(8));
  EXPECT_EQ(error_message([&] { grow.check_steps(9); }),
            "ExponentialLR: the computed lr at step 39 is inf, not a finite number (the "
            "schedule's values were checked through step 39, where this run ends)");
  EXPECT_NEAR(grow.get_last_lr()[0] / 1e30, 1.0, 1e-5);

  Fixture g;
  auto warm = std::make_shared<ls::LinearLR>(*g.opt, 0.0, 1.0, 5);
  auto up = std::make_shared<ls::ExponentialLR>(*g.opt, 1.0, 1, 10.0);
  ls::SequentialLR seq(*g.opt, {warm, up}, {5});
  EXPECT_TRUE(seq.elementwise());
  EXPECT_NO_THROW(seq.check_steps(43));
  EXPECT_EQ(error_message([&] { seq.check_steps(50); }),
            "SequentialLR: the computed lr at step 44 is inf, not a finite number (the "
            "schedule's values were checked through step 50, where this run ends)");
  EXPECT_NO_THROW(up->check_steps(1000));  // nested: its owner checks

  Fixture h;
  ls::LambdaLR lam(*h.opt, 1.0, [](const Tensor& s) { return exp(s * 3.0); });
  EXPECT_FALSE(lam.elementwise());
  // exp(3 s) overflows f32 from s = 30 on; only the last step is computed.
  EXPECT_NO_THROW(lam.check_steps(29));
  EXPECT_EQ(error_message([&] { lam.check_steps(40); }),
            "LambdaLR: the computed lr at step 40 is inf, not a finite number (the schedule's "
            "values were checked through step 40, where this run ends)");
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
  // YAML's .inf / .nan are numbers, refused by the scheduler's own checks; an integer argument
  // names the value in YAML's spelling (JSON would show null).
  EXPECT_EQ(error_message([&] { cfg("{scheduler: Constant, learning_rate: .inf}"); }),
            "ConstantLR: invalid learning_rate inf (must be >= 0 and finite)");
  EXPECT_EQ(error_message([&] { cfg(".nan"); }),
            "ConstantLR: invalid learning_rate nan (must be >= 0 and finite)");
  EXPECT_EQ(error_message([&] {
              cfg("{scheduler: Linear, initial_learning_rate: 0.1, end_learning_rate: -.Inf, "
                  "total_iters: 10}");
            }),
            "LinearLR: invalid end_learning_rate -inf (must be >= 0 and finite)");
  EXPECT_EQ(error_message([&] {
              cfg("{scheduler: Step, initial_learning_rate: 0.1, step_size: 3, gamma: "
                  ".INF}");
            }),
            "StepLR: invalid gamma inf (must be finite)");
  EXPECT_EQ(error_message([&] {
              cfg("[{scheduler: Constant, learning_rate: 0.1, total_iters: 5}, {scheduler: "
                  "PiecewiseConstant, learning_rates: [0.1, .NaN], milestones: [3]}]");
            }),
            "PiecewiseConstantLR: invalid learning_rates[1] nan (must be finite)");
  EXPECT_EQ(error_message([&] {
              cfg("{scheduler: Linear, initial_learning_rate: 0.1, end_learning_rate: 0, "
                  "total_iters: .inf}");
            }),
            "configure_lr_scheduler: learning_rate (LinearLR).total_iters: expected an integer, "
            "got .inf");
  EXPECT_EQ(error_message([&] {
              cfg("{scheduler: MultiStep, initial_learning_rate: 0.1, milestones: [2, -.inf]}");
            }),
            "configure_lr_scheduler: learning_rate (MultiStepLR).milestones: expected integers, "
            "got -.inf");
  // A quoted '.inf' is a string.
  EXPECT_EQ(error_message([&] { cfg("{scheduler: Constant, learning_rate: '.inf'}"); }),
            "configure_lr_scheduler: learning_rate (ConstantLR).learning_rate: expected a number, "
            "got \".inf\"");
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
