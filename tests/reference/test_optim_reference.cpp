// Optimizers and LR schedulers against PyTorch (one python run for all configurations, made
// by optim_reference.py).
//
// Optimizers: three parameters ([4, 5], [7], [2, 3, 2]) and 100 steps of given random
// gradients; after every step each parameter element must agree with torch.optim (float32)
// within 1e-5 relative (plus 1e-6 absolute for elements near 0), in eager mode and in a traced
// step replayed 100 times, and the state tensors both have (exp_avg, momentum_buffer, ...) must
// agree at the end. Lamb, Lion and Adafactor are compared with the update rules of their
// papers written out in the script.
//
// Schedulers: the learning rate at steps 0..999 must agree with torch.optim.lr_scheduler within
// 1e-6 relative (plus 1e-10 absolute where torch's value is 0), eagerly and in a traced step
// (optimizer.step(); scheduler.step()) replayed 1000 times without retracing.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "cstorch/cstorch.h"
#include "ref_util.h"

namespace cstorch::reftest {
namespace {

namespace ls = optim::lr_scheduler;

constexpr int kOptSteps = 100, kSchedSteps = 1000;
const std::vector<Shape> kShapes = {{4, 5}, {7}, {2, 3, 2}};

struct OptCase {
  std::string id, type;
  json args;
};

// clang-format off
const std::vector<OptCase>& opt_cases() {
  static const std::vector<OptCase> c = {
      {"sgd", "SGD", {{"lr", 0.1}}},
      {"sgd_momentum", "SGD", {{"lr", 0.05}, {"momentum", 0.9}}},
      {"sgd_nesterov_wd", "SGD", {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.01}}},
      {"sgd_dampening_maximize", "SGD", {{"lr", 0.05}, {"momentum", 0.9}, {"dampening", 0.1}, {"maximize", true}}},
      {"adam", "Adam", {{"lr", 0.01}}},
      {"adam_amsgrad_wd", "Adam", {{"lr", 0.01}, {"amsgrad", true}, {"weight_decay", 0.1}}},
      {"adam_maximize_betas", "Adam", {{"lr", 0.01}, {"maximize", true}, {"betas", {0.8, 0.99}}}},
      {"adamw", "AdamW", {{"lr", 0.01}, {"weight_decay", 0.1}}},
      {"adamw_amsgrad", "AdamW", {{"lr", 0.01}, {"amsgrad", true}}},
      {"adadelta", "Adadelta", json::object()},
      {"adadelta_wd_maximize", "Adadelta", {{"lr", 0.5}, {"rho", 0.95}, {"weight_decay", 0.1}, {"maximize", true}}},
      {"adagrad", "Adagrad", {{"lr", 0.1}}},
      {"adagrad_decay", "Adagrad", {{"lr", 0.1}, {"lr_decay", 0.01}, {"weight_decay", 0.1}, {"initial_accumulator_value", 0.5}}},
      {"adamax", "Adamax", {{"lr", 0.01}}},
      {"adamax_wd_maximize", "Adamax", {{"lr", 0.01}, {"weight_decay", 0.1}, {"maximize", true}}},
      {"asgd", "ASGD", {{"lr", 0.01}}},
      {"asgd_averaging", "ASGD", {{"lr", 0.01}, {"lambd", 1e-3}, {"t0", 20}, {"weight_decay", 0.1}}},
      {"nadam", "NAdam", {{"lr", 0.01}}},
      {"nadam_wd", "NAdam", {{"lr", 0.01}, {"weight_decay", 0.1}, {"momentum_decay", 8e-3}}},
      {"radam", "RAdam", {{"lr", 0.01}}},
      {"radam_wd_betas", "RAdam", {{"lr", 0.01}, {"weight_decay", 0.1}, {"betas", {0.9, 0.99}}}},
      {"rmsprop", "RMSprop", {{"lr", 0.01}}},
      {"rmsprop_momentum_centered_wd", "RMSprop", {{"lr", 0.01}, {"momentum", 0.9}, {"centered", true}, {"weight_decay", 0.1}}},
      {"rmsprop_centered_maximize", "RMSprop", {{"lr", 0.01}, {"centered", true}, {"maximize", true}}},
      {"rprop", "Rprop", {{"lr", 0.01}}},
      {"rprop_etas_maximize", "Rprop", {{"lr", 0.01}, {"etas", {0.3, 1.5}}, {"step_sizes", {1e-4, 1.0}}, {"maximize", true}}},
      {"lamb", "Lamb", {{"lr", 0.01}}},
      {"lamb_wd", "Lamb", {{"lr", 0.01}, {"weight_decay", 0.1}}},
      {"lamb_adam", "Lamb", {{"lr", 0.01}, {"adam", true}}},
      {"lion", "Lion", {{"lr", 1e-3}}},
      {"lion_wd_betas", "Lion", {{"lr", 1e-3}, {"weight_decay", 0.1}, {"betas", {0.95, 0.98}}}},
      {"adafactor", "Adafactor", json::object()},
      {"adafactor_lr_beta1_wd", "Adafactor", {{"lr", 0.01}, {"relative_step", false}, {"beta1", 0.9}, {"weight_decay", 0.1}, {"scale_parameter", false}}},
      {"adafactor_warmup", "Adafactor", {{"warmup_init", true}}},
  };
  return c;
}
// clang-format on

struct SchedCase {
  std::string id;
  double lr;
  std::string torch_expr;
  std::function<ls::SchedulerPtr(optim::Optimizer&, double)> make;
};

using ls::SchedulerPtr;
template <class S, class... A>
SchedulerPtr mk(optim::Optimizer& o, A... a) {
  return std::make_shared<S>(o, a...);
}

// clang-format off
const std::vector<SchedCase>& sched_cases() {
  static const std::vector<SchedCase> c = {
      {"step", 0.1, "lr_scheduler.StepLR(opt, step_size=30, gamma=0.1)",
       [](auto& o, double b) { return mk<ls::StepLR>(o, b, int64_t{30}, 0.1); }},
      {"step_fine", 0.1, "lr_scheduler.StepLR(opt, step_size=7, gamma=0.9)",
       [](auto& o, double b) { return mk<ls::StepLR>(o, b, int64_t{7}, 0.9); }},
      {"multistep", 0.1, "lr_scheduler.MultiStepLR(opt, milestones=[100, 250, 250, 600], gamma=0.5)",
       [](auto& o, double b) { return mk<ls::MultiStepLR>(o, b, std::vector<int64_t>{100, 250, 250, 600}, 0.5); }},
      {"exponential", 0.1, "lr_scheduler.ExponentialLR(opt, gamma=0.99)",
       [](auto& o, double b) { return mk<ls::ExponentialLR>(o, b, int64_t{1}, 0.99); }},
      {"exponential_slow", 0.3, "lr_scheduler.ExponentialLR(opt, gamma=0.9977)",
       [](auto& o, double b) { return mk<ls::ExponentialLR>(o, b, int64_t{1}, 0.9977); }},
      {"cosine", 0.1, "lr_scheduler.CosineAnnealingLR(opt, T_max=1000)",
       [](auto& o, double b) { return mk<ls::CosineAnnealingLR>(o, b, int64_t{1000}, 0.0); }},
      {"cosine_periodic", 0.1, "lr_scheduler.CosineAnnealingLR(opt, T_max=300, eta_min=1e-4)",
       [](auto& o, double b) { return mk<ls::CosineAnnealingLR>(o, b, int64_t{300}, 1e-4); }},
      {"warm_restarts", 0.1, "lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=100)",
       [](auto& o, double b) { return mk<ls::CosineAnnealingWarmRestarts>(o, b, int64_t{100}, int64_t{1}, 0.0); }},
      {"warm_restarts_mult", 0.1, "lr_scheduler.CosineAnnealingWarmRestarts(opt, T_0=50, T_mult=2, eta_min=1e-3)",
       [](auto& o, double b) { return mk<ls::CosineAnnealingWarmRestarts>(o, b, int64_t{50}, int64_t{2}, 1e-3); }},
      {"linear_warmup", 0.1, "lr_scheduler.LinearLR(opt, start_factor=0.1, end_factor=1.0, total_iters=200)",
       [](auto& o, double b) { return mk<ls::LinearLR>(o, b * 0.1, b, int64_t{200}); }},
      {"linear_decay", 0.1, "lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.05, total_iters=800)",
       [](auto& o, double b) { return mk<ls::LinearLR>(o, b, b * 0.05, int64_t{800}); }},
      {"polynomial", 0.1, "lr_scheduler.PolynomialLR(opt, total_iters=600, power=2.0)",
       [](auto& o, double b) { return mk<ls::PolynomialLR>(o, b, 0.0, int64_t{600}, 2.0, false); }},
      {"polynomial_sqrt", 0.1, "lr_scheduler.PolynomialLR(opt, total_iters=1000, power=0.5)",
       [](auto& o, double b) { return mk<ls::PolynomialLR>(o, b, 0.0, int64_t{1000}, 0.5, false); }},
      {"cyclic", 0.01, "lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=150, cycle_momentum=False)",
       [](auto& o, double) { return mk<ls::CyclicLR>(o, 0.01, 0.1, int64_t{150}, std::optional<int64_t>(), std::string("triangular"), 1.0); }},
      {"cyclic_triangular2", 0.01, "lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=40, step_size_down=70, mode='triangular2', cycle_momentum=False)",
       [](auto& o, double) { return mk<ls::CyclicLR>(o, 0.01, 0.1, int64_t{40}, std::optional<int64_t>(70), std::string("triangular2"), 1.0); }},
      {"cyclic_exp_range", 0.01, "lr_scheduler.CyclicLR(opt, base_lr=0.01, max_lr=0.1, step_size_up=90, mode='exp_range', gamma=0.998, cycle_momentum=False)",
       [](auto& o, double) { return mk<ls::CyclicLR>(o, 0.01, 0.1, int64_t{90}, std::optional<int64_t>(), std::string("exp_range"), 0.998); }},
      {"one_cycle", 0.1, "lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=1000, pct_start=0.3, cycle_momentum=False)",
       [](auto& o, double) { return mk<ls::OneCycleLR>(o, 0.1 / 25, 0.1, int64_t{1000}, 0.3, 1e4, false, std::string("cos")); }},
      {"one_cycle_three_phase_linear", 0.1, "lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=1001, pct_start=0.2995, three_phase=True, anneal_strategy='linear', div_factor=10, final_div_factor=100, cycle_momentum=False)",
       [](auto& o, double) { return mk<ls::OneCycleLR>(o, 0.01, 0.1, int64_t{1001}, 0.2995, 100.0, true, std::string("linear")); }},
      {"one_cycle_fractional_cos", 0.1, "lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=1001, pct_start=0.2995, cycle_momentum=False)",
       [](auto& o, double) { return mk<ls::OneCycleLR>(o, 0.1 / 25, 0.1, int64_t{1001}, 0.2995, 1e4, false, std::string("cos")); }},
      {"multiplicative", 0.1, "lr_scheduler.MultiplicativeLR(opt, lr_lambda=lambda e: 0.995)",
       [](auto& o, double b) { return mk<ls::MultiplicativeLR>(o, b, 0.995); }},
      {"lambda", 0.1, "lr_scheduler.LambdaLR(opt, lr_lambda=lambda e: 1.0 / (1.0 + 0.01 * e))",
       [](auto& o, double b) {
         return mk<ls::LambdaLR>(o, b, std::function<Tensor(const Tensor&)>(
                                           [](const Tensor& s) { return 1.0 / (s * 0.01 + 1.0); }));
       }},
      {"sequential_warmup_cosine", 0.1,
       "lr_scheduler.SequentialLR(opt, [lr_scheduler.LinearLR(opt, start_factor=0.01, end_factor=1.0, total_iters=100), lr_scheduler.CosineAnnealingLR(opt, T_max=900)], milestones=[100])",
       [](auto& o, double b) {
         std::vector<SchedulerPtr> s{mk<ls::LinearLR>(o, b * 0.01, b, int64_t{100}),
                                     mk<ls::CosineAnnealingLR>(o, b, int64_t{900}, 0.0)};
         return mk<ls::SequentialLR>(o, s, std::vector<int64_t>{100});
       }},
      {"sequential_exp_step", 0.1,
       "lr_scheduler.SequentialLR(opt, [lr_scheduler.ExponentialLR(opt, gamma=0.99), lr_scheduler.StepLR(opt, step_size=50, gamma=0.5)], milestones=[300])",
       [](auto& o, double b) {
         std::vector<SchedulerPtr> s{mk<ls::ExponentialLR>(o, b, int64_t{1}, 0.99),
                                     mk<ls::StepLR>(o, b, int64_t{50}, 0.5)};
         return mk<ls::SequentialLR>(o, s, std::vector<int64_t>{300});
       }},
      {"chained_exp_step", 0.1,
       "lr_scheduler.ChainedScheduler([lr_scheduler.ExponentialLR(opt, gamma=0.995), lr_scheduler.StepLR(opt, step_size=100, gamma=0.5)])",
       [](auto& o, double b) {
         std::vector<SchedulerPtr> s{mk<ls::ExponentialLR>(o, b, int64_t{1}, 0.995),
                                     mk<ls::StepLR>(o, b, int64_t{100}, 0.5)};
         return mk<ls::ChainedLR>(o, s);
       }},
      {"chained_warmup_exp", 0.1,
       "lr_scheduler.ChainedScheduler([lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=100), lr_scheduler.ExponentialLR(opt, gamma=0.998)])",
       [](auto& o, double b) {
         std::vector<SchedulerPtr> s{mk<ls::LinearLR>(o, b * 0.1, b, int64_t{100}),
                                     mk<ls::ExponentialLR>(o, b, int64_t{1}, 0.998)};
         return mk<ls::ChainedLR>(o, s);
       }},
  };
  return c;
}
// clang-format on

struct Data {
  std::vector<std::vector<double>> init;                // per param
  std::vector<std::vector<std::vector<double>>> grads;  // [step][param]
};

const Data& data() {
  static const Data d = [] {
    Data d;
    Rng rng(777);
    for (auto& s : kShapes) {
      std::vector<double> v(static_cast<size_t>(numel(s)));
      for (auto& x : v) x = round_to(rng.normal(), DType::f32);
      d.init.push_back(v);
    }
    for (int t = 0; t < kOptSteps; ++t) {
      std::vector<std::vector<double>> gs;
      for (auto& s : kShapes) {
        std::vector<double> v(static_cast<size_t>(numel(s)));
        // A drift shared by all steps plus noise, so momentum and sign-based rules see both
        // agreeing and disagreeing gradients.
        for (size_t i = 0; i < v.size(); ++i)
          v[i] = round_to(0.3 * std::sin(static_cast<double>(i)) + rng.normal(), DType::f32);
        gs.push_back(v);
      }
      d.grads.push_back(gs);
    }
    return d;
  }();
  return d;
}

struct Reference {
  std::map<std::string, std::vector<std::vector<double>>> traj;
  std::map<std::string, std::map<std::string, std::vector<double>>> state;
  std::map<std::string, std::vector<double>> lrs;
  std::string error;
};

const Reference& reference() {
  static const Reference r = [] {
    Reference r;
    json params = json::array();
    for (size_t i = 0; i < kShapes.size(); ++i)
      params.push_back(json{{"shape", kShapes[i]}, {"data", data().init[i]}});
    json opts = json::array(), scheds = json::array();
    for (auto& c : opt_cases())
      opts.push_back(json{{"id", c.id}, {"type", c.type}, {"args", c.args}});
    for (auto& c : sched_cases())
      scheds.push_back(
          json{{"id", c.id}, {"expr", c.torch_expr}, {"lr", c.lr}, {"steps", kSchedSteps}});
    json j{
        {"params", params}, {"grads", data().grads}, {"optimizers", opts}, {"schedulers", scheds}};
    auto dir = make_temp_dir("ref_optim");
    auto in = dir / "optim_in.json", out = dir / "optim_out.json";
    write_json(in, j);
    std::string log;
    int rc = run_reference_script("optim_reference.py", {in.string(), out.string()}, &log);
    if (rc != 0) {
      r.error = torch_unavailable_reason();
      if (r.error.empty())
        r.error = "optim_reference.py failed (exit " + std::to_string(rc) + ") on " + in.string() +
                  ":\n" + log;
      return r;
    }
    json o = read_json(out);
    for (auto& [k, v] : o["optimizers"].items()) {
      r.traj[k] = v["trajectory"].get<std::vector<std::vector<double>>>();
      for (auto& [sk, sv] : v["state"].items()) r.state[k][sk] = sv.get<std::vector<double>>();
    }
    for (auto& [k, v] : o["schedulers"].items()) r.lrs[k] = v.get<std::vector<double>>();
    if (!std::getenv("CSTORCH_REF_KEEP")) std::filesystem::remove_all(dir);
    return r;
  }();
  return r;
}

// ---- optimizers ----

std::vector<Tensor> make_params() {
  std::vector<Tensor> ps;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    Tensor p = make_tensor(data().init[i], kShapes[i], DType::f32);
    p.set_requires_grad(true);
    p.set_name("p" + std::to_string(i));
    ps.push_back(p);
  }
  return ps;
}

// loss = sum_i sum(p_i * g_i): its gradient is exactly g_i.
void train_step(const std::vector<Tensor>& ps, const std::vector<Tensor>& gs,
                optim::Optimizer& opt) {
  Tensor loss = sum(ps[0] * gs[0]);
  for (size_t i = 1; i < ps.size(); ++i) loss = loss + sum(ps[i] * gs[i]);
  loss.backward();
  opt.step();
  opt.zero_grad();
}

Batch grad_batch(int t) {
  Batch b;
  for (size_t i = 0; i < kShapes.size(); ++i)
    b["g" + std::to_string(i)] = make_tensor(data().grads[t][i], kShapes[i], DType::f32);
  return b;
}

std::vector<Tensor> batch_grads(const Batch& b) {
  std::vector<Tensor> gs;
  for (size_t i = 0; i < kShapes.size(); ++i) gs.push_back(b.at("g" + std::to_string(i)));
  return gs;
}

std::vector<double> flat(const std::vector<Tensor>& ps) {
  std::vector<double> r;
  for (auto& p : ps)
    for (double v : p.to_vector<double>()) r.push_back(v);
  return r;
}

struct OptRun {
  std::vector<std::vector<double>> traj;
  State state;
};

OptRun run_optimizer(const OptCase& c, bool traced) {
  auto ps = make_params();
  auto opt = optim::configure_optimizer(c.type, ps, c.args);
  OptRun r;
  if (!traced) {
    for (int t = 0; t < kOptSteps; ++t) {
      train_step(ps, batch_grads(grad_batch(t)), *opt);
      r.traj.push_back(flat(ps));
    }
  } else {
    auto step = trace(
        [&](const Batch& b) {
          train_step(ps, batch_grads(b), *opt);
          std::vector<Tensor> out;
          for (auto& p : ps) out.push_back(p * 1.0);
          return out;
        },
        "optim_" + c.id);
    std::vector<std::vector<Tensor>> outs;
    for (int t = 0; t < kOptSteps; ++t) outs.push_back(step(grad_batch(t)));
    for (auto& o : outs) r.traj.push_back(flat(o));
  }
  r.state = opt->state_dict();
  return r;
}

bool close(double got, double want, double rtol, double atol) {
  return std::abs(got - want) <= rtol * std::abs(want) + atol;
}

class OptimizerVsTorch : public ::testing::TestWithParam<std::tuple<size_t, bool>> {};

TEST_P(OptimizerVsTorch, TrajectoryAndStateMatch) {
  auto [ci, traced] = GetParam();
  const OptCase& c = opt_cases()[ci];
  const Reference& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  ASSERT_TRUE(ref.traj.count(c.id)) << "no reference trajectory for " << c.id;
  OptRun run = run_optimizer(c, traced);
  const auto& want = ref.traj.at(c.id);
  ASSERT_EQ(run.traj.size(), want.size());
  int bad = 0;
  double worst = 0;
  for (size_t t = 0; t < want.size(); ++t)
    for (size_t i = 0; i < want[t].size(); ++i) {
      double g = run.traj[t][i], w = want[t][i];
      worst = std::max(worst, std::abs(g - w) / (std::abs(w) + 1e-1));
      if (!close(g, w, 1e-5, 1e-6) && bad++ < 5)
        ADD_FAILURE() << c.id << (traced ? " traced" : " eager") << ": step " << t + 1
                      << " element " << i << ": " << g << " vs torch " << w;
    }
  EXPECT_EQ(bad, 0) << c.id << ": " << bad << " elements out of tolerance";
  // State tensors present in both (torch's names).
  const State& st = run.state.at("state");
  int compared = 0;
  if (ref.state.count(c.id))
    for (const auto& [key, vals] : ref.state.at(c.id)) {
      auto dot = key.find('.');
      std::string idx = key.substr(0, dot), nm = key.substr(dot + 1);
      if (!st.contains(idx) || !st.at(idx).contains(nm)) continue;
      auto got = st.at(idx).at(nm).as_tensor().to_vector<double>();
      ASSERT_EQ(got.size(), vals.size()) << c.id << " state " << key;
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(close(got[i], vals[i], 1e-5, 1e-6))
            << c.id << " state " << key << "[" << i << "]: " << got[i] << " vs torch " << vals[i];
      ++compared;
    }
  if (c.type != "SGD" || c.args.contains("momentum")) {
    EXPECT_GT(compared, 0) << c.id << ": no state tensor in common with torch";
  }
  std::printf("[optim] %-32s %s: max |diff| / (|torch| + 0.1) = %.3g, %d state tensors compared\n",
              c.id.c_str(), traced ? "traced" : "eager ", worst, compared);
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerVsTorch,
                         ::testing::Combine(::testing::Range<size_t>(0, 34), ::testing::Bool()),
                         [](const auto& info) {
                           return opt_cases()[std::get<0>(info.param)].id +
                                  (std::get<1>(info.param) ? "_traced" : "_eager");
                         });

TEST(OptimizerVsTorch, CaseCountMatchesInstantiation) {
  EXPECT_EQ(opt_cases().size(), 34u);
}

// ---- schedulers ----

std::vector<double> run_scheduler(const SchedCase& c, bool traced) {
  Tensor p = zeros({1});
  p.set_requires_grad(true);
  optim::SGD opt({p}, c.lr, 0.9);
  auto sched = c.make(opt, c.lr);
  std::vector<double> lrs;
  if (!traced) {
    lrs.push_back(opt.param_groups()[0].lr.item<double>());
    for (int s = 1; s < kSchedSteps; ++s) {
      opt.step();
      sched->step();
      lrs.push_back(opt.param_groups()[0].lr.item<double>());
    }
    return lrs;
  }
  auto step = trace(
      [&](const Tensor& x) {
        sum(p * x).backward();
        opt.step();
        opt.zero_grad();
        sched->step();
        return opt.param_groups()[0].lr * 1.0;
      },
      "sched_" + c.id);
  lrs.push_back(opt.param_groups()[0].lr.item<double>());
  std::vector<Tensor> outs;
  Tensor x = ones({1});
  int64_t traces_before = runtime_stats().traces;
  for (int s = 1; s < kSchedSteps; ++s) outs.push_back(step(x));
  for (auto& o : outs) lrs.push_back(o.item<double>());
  EXPECT_EQ(runtime_stats().traces - traces_before, 1) << c.id << ": the step was retraced";
  return lrs;
}

class SchedulerVsTorch : public ::testing::TestWithParam<std::tuple<size_t, bool>> {};

TEST_P(SchedulerVsTorch, LearningRateAtEveryStepMatches) {
  auto [ci, traced] = GetParam();
  const SchedCase& c = sched_cases()[ci];
  const Reference& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  ASSERT_TRUE(ref.lrs.count(c.id));
  auto got = run_scheduler(c, traced);
  const auto& want = ref.lrs.at(c.id);
  ASSERT_EQ(got.size(), want.size());
  int bad = 0;
  double worst = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    if (want[s] != 0) worst = std::max(worst, std::abs(got[s] - want[s]) / std::abs(want[s]));
    if (!close(got[s], want[s], 1e-6, 1e-10) && bad++ < 5)
      ADD_FAILURE() << c.id << (traced ? " traced" : " eager") << ": step " << s << ": lr "
                    << got[s] << " vs torch " << want[s] << " (relative "
                    << std::abs(got[s] - want[s]) / std::abs(want[s]) << ")";
  }
  EXPECT_EQ(bad, 0) << c.id << ": " << bad << " of " << want.size() << " steps out of tolerance";
  std::printf("[sched] %-30s %s: max relative error %.3g\n", c.id.c_str(),
              traced ? "traced" : "eager ", worst);
}

INSTANTIATE_TEST_SUITE_P(All, SchedulerVsTorch,
                         ::testing::Combine(::testing::Range<size_t>(0, 25), ::testing::Bool()),
                         [](const auto& info) {
                           return sched_cases()[std::get<0>(info.param)].id +
                                  (std::get<1>(info.param) ? "_traced" : "_eager");
                         });

TEST(SchedulerVsTorch, CaseCountMatchesInstantiation) {
  EXPECT_EQ(sched_cases().size(), 25u);
}

}  // namespace
}  // namespace cstorch::reftest
