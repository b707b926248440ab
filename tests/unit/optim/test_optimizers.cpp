// Optimizer base behaviour: state_dict shape and exact resume, configure_optimizer lookup and
// errors, the preinitialize contract (state_names_to_sparsify recorded only), tensor-held
// (scheduled) hyper-parameters.
#include <gtest/gtest.h>

#include <limits>

#include "cstorch/cstorch.h"
#include "unit/test_util.h"

namespace cstorch::testing {
namespace {

std::vector<Tensor> params(uint32_t seed) {
  Tensor a = rt({3, 4}, seed), b = rt({5}, seed + 1);
  a.set_requires_grad(true).set_name("a");
  b.set_requires_grad(true).set_name("b");
  return {a, b};
}

void set_grads(const std::vector<Tensor>& ps, int step) {
  Tensor loss = zeros({});
  for (size_t i = 0; i < ps.size(); ++i)
    loss = loss + sum(ps[i] * rt(ps[i].shape(), 100 + 10 * step + static_cast<uint32_t>(i)));
  loss.backward();
}

std::vector<float> values(const std::vector<Tensor>& ps) {
  std::vector<float> r;
  for (auto& p : ps)
    for (float v : p.to_vector<float>()) r.push_back(v);
  return r;
}

const std::vector<std::pair<std::string, Config>> kConfigs = {
    {"SGD", {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.1}}},
    {"Adam", {{"lr", 0.01}, {"amsgrad", true}}},
    {"AdamW", {{"lr", 0.01}}},
    {"Adadelta", Config::object()},
    {"Adafactor", Config::object()},
    {"Adagrad", {{"lr", 0.1}}},
    {"Adamax", Config::object()},
    {"ASGD", {{"t0", 3}}},
    {"Lamb", Config::object()},
    {"Lion", Config::object()},
    {"NAdam", Config::object()},
    {"RAdam", Config::object()},
    {"RMSprop", {{"momentum", 0.5}, {"centered", true}}},
    {"Rprop", Config::object()},
};

TEST(OptimizerStateDict, ResumedOptimizerContinuesBitwise) {
  for (const auto& [type, args] : kConfigs) {
    SCOPED_TRACE(type);
    // Uninterrupted: 10 steps.
    auto pa = params(1);
    auto oa = optim::configure_optimizer(type, pa, args);
    for (int s = 0; s < 10; ++s) {
      set_grads(pa, s);
      oa->step();
      oa->zero_grad();
    }
    // Interrupted after 5: a fresh optimizer on copies of the parameters loads the state dict.
    auto pb = params(1);
    auto ob = optim::configure_optimizer(type, pb, args);
    for (int s = 0; s < 5; ++s) {
      set_grads(pb, s);
      ob->step();
      ob->zero_grad();
    }
    State sd = ob->state_dict();
    auto pc = params(7);  // different values: the parameters are restored separately
    {
      NoGradGuard ng;
      for (size_t i = 0; i < pc.size(); ++i) pc[i].copy_(pb[i]);
    }
    auto oc = optim::configure_optimizer(type, pc, args);
    oc->load_state_dict(sd);
    ob.reset();  // the loaded state must not alias the old optimizer's buffers
    for (int s = 5; s < 10; ++s) {
      set_grads(pc, s);
      oc->step();
      oc->zero_grad();
    }
    EXPECT_EQ(values(pa), values(pc));
  }
}

TEST(OptimizerStateDict, PyTorchShape) {
  auto ps = params(1);
  optim::Adam opt(ps, 0.01, 0.9, 0.999, 1e-8, 0.0, /*amsgrad=*/true);
  set_grads(ps, 0);
  opt.step();
  State sd = opt.state_dict();
  ASSERT_EQ(sd.keys(), (std::vector<std::string>{"state", "param_groups"}));
  EXPECT_EQ(sd.at("state").keys(), (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(sd.at("state").at("0").keys(),
            (std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"}));
  EXPECT_EQ(sd.at("state").at("1").at("step").as_tensor().item<float>(), 1.0f);
  const State& g = sd.at("param_groups")[0];
  // The configured number itself (as PyTorch keeps the Python float), not its f32 rounding.
  EXPECT_EQ(g.at("lr").as_double(), 0.01);
  EXPECT_EQ(g.at("params")[0].as_int(), 0);
  EXPECT_EQ(g.at("params")[1].as_int(), 1);
  // torch.optim.Adam's names and types: one "betas" pair, booleans as booleans.
  EXPECT_FALSE(g.contains("beta1") || g.contains("beta2"));
  ASSERT_TRUE(g.at("betas").is_list());
  EXPECT_DOUBLE_EQ(g.at("betas")[0].as_double(), 0.9);
  EXPECT_DOUBLE_EQ(g.at("betas")[1].as_double(), 0.999);
  EXPECT_TRUE(g.at("amsgrad").is_bool() && g.at("amsgrad").as_bool());
  EXPECT_TRUE(g.at("maximize").is_bool() && !g.at("maximize").as_bool());
}

TEST(OptimizerStateDict, TorchNamesAndTypesPerOptimizer) {
  auto ps = params(1);
  optim::Rprop rp(ps, 0.01, 0.4, 1.3, 1e-5, 10);
  set_grads(ps, 0);
  rp.step();
  State sd = rp.state_dict();
  const State& g = sd.at("param_groups")[0];
  EXPECT_DOUBLE_EQ(g.at("etas")[0].as_double(), 0.4);
  EXPECT_DOUBLE_EQ(g.at("etas")[1].as_double(), 1.3);
  EXPECT_DOUBLE_EQ(g.at("step_sizes")[0].as_double(), 1e-5);
  EXPECT_DOUBLE_EQ(g.at("step_sizes")[1].as_double(), 10.0);
  // torch keeps Rprop's, RMSprop's and Adadelta's step as a Python int.
  ASSERT_TRUE(sd.at("state").at("0").at("step").is_int());
  EXPECT_EQ(sd.at("state").at("0").at("step").as_int(), 1);

  // SGD with dampening: before the first step there is no momentum buffer (torch: None) and
  // the internal first-step flag never appears in the dict.
  auto ps2 = params(1);
  optim::SGD sgd(ps2, 0.1, 0.9, 0.1, 0, false, false);
  State s0 = sgd.state_dict();
  EXPECT_EQ(s0.at("state").size(), 0u);
  EXPECT_TRUE(s0.at("param_groups")[0].at("nesterov").is_bool());
  set_grads(ps2, 0);
  sgd.step();
  State s1 = sgd.state_dict();
  EXPECT_EQ(s1.at("state").at("0").keys(), (std::vector<std::string>{"momentum_buffer"}));
}

TEST(OptimizerStateDict, ReadsTorchAndOlderLayouts) {
  // Three ways to say the same Adam state: what state_dict() writes now, the older cstorch
  // layout (beta1/beta2 numbers, 0/1 booleans), and torch's (execution switches, step as an
  // integer-valued tensor, ids that are not 0..n-1).
  auto pa = params(1);
  optim::Adam a(pa, 0.01, 0.8, 0.95, 1e-8, 0.0, true);
  for (int s = 0; s < 3; ++s) {
    set_grads(pa, s);
    a.step();
    a.zero_grad();
  }
  State now = a.state_dict();
  State old = now;
  State& og = old.at("param_groups")[0];
  og.erase("betas");
  og.set("beta1", 0.8);
  og.set("beta2", 0.95);
  og.set("amsgrad", 1.0);
  og.set("maximize", 0.0);
  State torch_sd = now;
  State& tg = torch_sd.at("param_groups")[0];
  tg.set("foreach", State());
  tg.set("capturable", false);
  tg.set("differentiable", false);
  tg.set("fused", false);
  tg.set("initial_lr", 0.01);
  tg.set("params", State(std::vector<State>{State(7), State(3)}));
  State tstate = State::map();
  tstate.set("7", now.at("state").at("0"));
  tstate.set("3", now.at("state").at("1"));
  torch_sd.set("state", tstate);
  for (const State* sd : {&now, &old, &torch_sd}) {
    auto pb = params(1);
    optim::Adam b(pb, 0.5, 0.1, 0.2, 1e-8, 0.0, true);  // other hyper-parameters: restored
    b.load_state_dict(*sd);
    EXPECT_EQ(b.state_dict(), now);
  }
  // A pair that is not a pair of numbers.
  State bad = now;
  bad.at("param_groups")[0].set("betas", State(std::vector<State>{State(0.9)}));
  auto pc = params(3);
  optim::Adam c(pc, 0.01, 0.9, 0.999, 1e-8, 0.0, true);
  expect_error([&] { c.load_state_dict(bad); }, {"param_groups.0.betas", "pair of numbers"});

  // SGD with dampening from torch's layout: a buffer means "past the first step" (without
  // it, the next step would take the gradient as the buffer, undamped).
  auto pd = params(1);
  optim::SGD d(pd, 0.1, 0.9, 0.5);
  for (int s = 0; s < 2; ++s) {
    set_grads(pd, s);
    d.step();
    d.zero_grad();
  }
  State torch_sgd = d.state_dict();
  EXPECT_FALSE(torch_sgd.at("state").at("0").contains("initialized"));
  std::vector<Tensor> pe;  // fresh parameters holding pd's values
  for (auto& p : pd) {
    Tensor t = from_vector(p.to_vector<float>(), p.shape());
    t.set_requires_grad(true).set_name(p.name());
    pe.push_back(t);
  }
  optim::SGD e(pe, 0.1, 0.9, 0.5);
  e.load_state_dict(torch_sgd);
  set_grads(pd, 2);
  set_grads(pe, 2);
  d.step();
  e.step();
  EXPECT_EQ(values(pd), values(pe));
  // SGD without momentum: torch writes momentum_buffer None.
  auto pf = params(4);
  optim::SGD f(pf, 0.1);
  State none_buf = f.state_dict();
  State ns = State::map();
  ns.set("0", State::map({{"momentum_buffer", State()}}));
  none_buf.set("state", ns);
  f.load_state_dict(none_buf);
}

TEST(OptimizerStateDict, BadDictsNameTheKeyPath) {
  auto ps = params(1);
  optim::Adam opt(ps);
  State sd = opt.state_dict();
  State bad = sd;
  bad.at("state").at("0").set("exp_avg", State(zeros({2})));
  expect_error([&] { opt.load_state_dict(bad); }, {"state.0.exp_avg", "shape [2]", "[3, 4]"});
  bad = sd;
  bad.at("state").at("1").set("bogus", State(zeros({5})));
  expect_error([&] { opt.load_state_dict(bad); }, {"state.1.bogus", "no state 'bogus'"});
  bad = sd;
  bad.at("state").set("9", sd.at("state").at("0"));
  expect_error([&] { opt.load_state_dict(bad); }, {"state.9", "not a parameter id"});
  bad = sd;
  bad.erase("param_groups");
  expect_error([&] { opt.load_state_dict(bad); }, {"'state' and 'param_groups'"});
  bad = sd;
  bad.at("param_groups")[0].set("nonsense", State(1.0));
  expect_error([&] { opt.load_state_dict(bad); }, {"param_groups.0.nonsense", "unknown"});
  // Another kind of optimizer's dict says so (it named one key only).
  optim::SGD sgd(ps, 0.1, 0.9);
  expect_error([&] { opt.load_state_dict(sgd.state_dict()); },
               {"unknown hyper-parameter for Adam (the dict's group has", "momentum", "nesterov",
                "the state of another kind of optimizer? This one is Adam"});
}

// A dict from the same kind of optimizer under other hyper-parameters (a later phase turns
// momentum off, or on): as torch's load_state_dict, the dict's hyper-parameters win, and the
// state follows them, so the loaded optimizer continues exactly as the saved one would have.
TEST(OptimizerStateDict, ADictWithOtherStateSwitchesContinuesAsSaved) {
  const std::vector<std::tuple<std::string, Config, Config>> cases = {
      {"SGD", {{"lr", 0.1}, {"momentum", 0.9}}, {{"lr", 0.1}}},
      {"SGD", {{"lr", 0.1}}, {{"lr", 0.1}, {"momentum", 0.9}}},
      {"SGD", {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.1}}, {{"lr", 0.1}}},
      {"Adam", {{"lr", 0.01}, {"amsgrad", true}}, {{"lr", 0.01}}},
      {"Adam", {{"lr", 0.01}}, {{"lr", 0.01}, {"amsgrad", true}}},
      {"RMSprop", {{"momentum", 0.5}, {"centered", true}}, Config::object()},
      {"RMSprop", Config::object(), {{"momentum", 0.5}, {"centered", true}}},
  };
  for (const auto& [type, saved_args, loading_args] : cases) {
    SCOPED_TRACE(type + " " + saved_args.dump() + " into " + loading_args.dump());
    auto pa = params(1);
    auto oa = optim::configure_optimizer(type, pa, saved_args);
    for (int s = 0; s < 3; ++s) {
      set_grads(pa, s);
      oa->step();
      oa->zero_grad();
    }
    State sd = oa->state_dict();
    auto pb = params(1);
    {
      NoGradGuard ng;
      for (size_t i = 0; i < pb.size(); ++i) pb[i].copy_(pa[i]);
    }
    auto ob = optim::configure_optimizer(type, pb, loading_args);
    ob->load_state_dict(sd);
    for (int s = 3; s < 6; ++s) {
      set_grads(pa, s);
      oa->step();
      oa->zero_grad();
      set_grads(pb, s);
      ob->step();
      ob->zero_grad();
    }
    EXPECT_EQ(values(pa), values(pb));
    EXPECT_EQ(ob->state_dict(), oa->state_dict()) << ob->state_dict().repr() << "\n"
                                                  << oa->state_dict().repr();
  }
  // Another kind's state is still an error: SGD's buffer is no state of Adam's.
  auto ps = params(1);
  optim::SGD sgd(ps, 0.1, 0.9);
  set_grads(ps, 0);
  sgd.step();
  State sd = sgd.state_dict();
  sd.at("param_groups")[0] = optim::Adam(ps).state_dict().at("param_groups")[0];
  optim::Adam adam(ps);
  expect_error([&] { adam.load_state_dict(sd); }, {"state.0.momentum_buffer", "no state"});
}

// A dict loaded after the step was traced: the hyper-parameters the compiled step holds as
// constants (momentum, an untensored weight_decay) trace it again, so its replays give the eager
// results (they went on with the old values: plain SGD, and no retrace). Each case: SGD(lr 0.1)
// steps once, loads the dict of a configured SGD, then steps three times.
TEST(OptimizerStateDict, ALoadAfterTracingTracesTheStepAgain) {
  for (const Config& from : {Config{{"lr", 0.1}, {"momentum", 0.9}},
                             Config{{"lr", 0.1}, {"weight_decay", 0.5}}, Config{{"lr", 0.1}}}) {
    SCOPED_TRACE(from.dump());
    auto src = params(1);
    auto so = optim::configure_optimizer("SGD", src, from);
    set_grads(src, 0);
    so->step();
    so->zero_grad();
    const State sd = so->state_dict();
    std::vector<std::vector<float>> result;
    std::vector<int64_t> traces;
    for (bool traced : {false, true}) {
      auto ps = params(2);
      auto o = optim::configure_optimizer("SGD", ps, Config{{"lr", 0.1}});
      auto body = [&] {
        sum(ps[0] * ps[0]).backward();
        o->step();
        o->zero_grad();
      };
      auto step = trace([&](const Tensor& x) {
        body();
        return x * 1.0;
      });
      auto run = [&] { traced ? (void)step(ones({1})) : body(); };
      const int64_t t0 = runtime_stats().traces;
      run();
      synchronize();
      o->load_state_dict(sd);
      for (int s = 0; s < 3; ++s) run();
      synchronize();
      result.push_back(values(ps));
      traces.push_back(runtime_stats().traces - t0);
    }
    EXPECT_EQ(result[0], result[1]);
    // Traced again only where the dict changed a constant of the step.
    EXPECT_EQ(traces[1], from.size() > 1 ? 2 : 1);
  }
}

TEST(ConfigureOptimizer, EveryNameCaseInsensitiveWithAlias) {
  for (const auto& name : optim::optimizer_names()) {
    std::string upper = name;
    for (auto& c : upper) c = static_cast<char>(std::toupper(c));
    Config args = {{"learning_rate", 0.01}};
    if (name == "Adafactor") args = {{"learning_rate", 0.01}, {"relative_step", false}};
    auto opt = optim::configure_optimizer(upper, params(1), args);
    EXPECT_EQ(opt->name(), name);
    EXPECT_NEAR(opt->param_groups()[0].lr.item<float>(), 0.01, 1e-9) << name;
  }
  EXPECT_EQ(optim::optimizer_names().size(), 14u);
}

TEST(ConfigureOptimizer, Errors) {
  expect_error(
      [] {
        optim::configure_optimizer("Adamm", params(1), {{"lr", 0.1}});
      },
      {"unknown optimizer type 'Adamm'", "SGD", "Adam", "Lion", "Rprop"});
  expect_error(
      [] {
        optim::configure_optimizer("SGD", params(1), {{"lr", -0.1}});
      },
      {"invalid learning rate -0.1"});
  // A misspelt argument is an error listing the valid ones, not a warning and a default.
  expect_error(
      [] {
        optim::configure_optimizer("SGD", params(1), {{"lr", 0.1}, {"momentun", 0.9}});
      },
      {"configure_optimizer(SGD): unknown argument 'momentun'", "valid arguments:", "momentum",
       "nesterov"});
  expect_error(
      [] {
        optim::configure_optimizer("SGD", params(1), {{"lr", 0.1}, {"learning_rate", 0.2}});
      },
      {"either 'lr' or its alias 'learning_rate'"});
  expect_error(
      [] {
        optim::configure_optimizer("Adam", params(1), {{"betas", {0.9}}});
      },
      {"'betas' must be a list of two numbers"});
  expect_error(
      [] {
        optim::configure_optimizer("Adafactor", params(1), {{"lr", 0.1}, {"relative_step", true}});
      },
      {"mutually exclusive"});
  // A switch is true or false (1 / 0): 2 was taken as true, and "yes" called "not a number".
  for (const Config& v : {Config(2), Config("yes")})
    expect_error(
        [&] {
          optim::configure_optimizer("SGD", params(1),
                                     {{"lr", 0.1}, {"momentum", 0.9}, {"nesterov", v}});
        },
        {"'nesterov' must be true or false, got " + v.dump()});
  EXPECT_NO_THROW(optim::configure_optimizer("SGD", params(1),
                                             {{"lr", 0.1}, {"momentum", 0.9}, {"nesterov", 1}}));
  auto ps = params(1);
  optim::SGD sgd(ps, 0.1);
  expect_error([&] { sgd.set_lr(0, -1); }, {"invalid learning rate -1"});
  // Infinity passes `>= 0` but makes the first step's parameters NaN: refused everywhere a rate
  // or a non-negative hyper-parameter is taken.
  const double inf = std::numeric_limits<double>::infinity();
  expect_error([&] { sgd.set_lr(0, inf); }, {"invalid learning rate inf", "finite"});
  expect_error(
      [&] {
        optim::configure_optimizer("SGD", params(1), {{"lr", inf}});
      },
      {"invalid learning rate inf", "finite"});
  expect_error([&] { optim::AdamW(params(1), 0.01, 0.9, 0.999, 1e-8, inf); },
               {"AdamW", "invalid weight_decay inf", "finite"});
  expect_error([&] { optim::SGD(params(1), 0.1, inf); },
               {"SGD: invalid momentum inf (must be >= 0 and finite)"});
  expect_error([&] { optim::SGD(params(1), 0.1, 0.9, 0.0, inf); },
               {"SGD: invalid weight_decay inf (must be >= 0 and finite)"});
  expect_error([&] { optim::SGD(params(1), 0.1, 0.9, -inf); },
               {"SGD: invalid dampening -inf (must be finite)"});
  expect_error(
      [&] {
        sgd.add_param_group({rt({2}, 9).set_requires_grad(true)}, {{"lr", inf}});
      },
      {"group 1", "invalid lr inf", "finite"});
  State sd = sgd.state_dict();
  sd.at("param_groups")[0].set("lr", inf);
  expect_error([&] { sgd.load_state_dict(sd); },
               {"param_groups.0.lr", "invalid learning rate inf"});
  // Finite as a double but not as f32, the step's type: 1e39 became an infinite f32 rate and
  // the same NaN parameters. Refused everywhere infinity is, with the f32 limit named; the
  // largest f32 itself is taken.
  const char* f32_rule = "must be >= 0 and finite as f32, at most 3.4028235e+38";
  expect_error([&] { optim::SGD(params(1), 1e39); }, {"invalid learning rate 1e+39", f32_rule});
  expect_error([&] { sgd.set_lr(0, 1e39); }, {"invalid learning rate 1e+39", f32_rule});
  expect_error([&] { optim::SGD(params(1), 0.1, 1e39); },
               {"SGD: invalid momentum 1e+39", f32_rule});
  expect_error([&] { optim::AdamW(params(1), 0.01, 0.9, 0.999, 1e39); },
               {"AdamW: invalid eps 1e+39", f32_rule});
  optim::SGD fresh(params(1), 0.1);  // sgd's state exists: it takes no more groups
  expect_error(
      [&] {
        fresh.add_param_group({rt({2}, 9).set_requires_grad(true)}, {{"weight_decay", 1e39}});
      },
      {"group 1", "invalid weight_decay 1e+39", f32_rule});
  sd.at("param_groups")[0].set("lr", 1e39);
  expect_error([&] { sgd.load_state_dict(sd); },
               {"param_groups.0.lr", "invalid learning rate 1e+39", f32_rule});
  EXPECT_EQ(sgd.param_groups()[0].options.at("lr"), 0.1);  // the refusals changed nothing
  EXPECT_NO_THROW(sgd.set_lr(0, std::numeric_limits<float>::max()));
  EXPECT_EQ(sgd.param_groups()[0].lr.item<float>(), std::numeric_limits<float>::max());
}

// add_param_group: a group's options apply to its parameters only (the update of the group
// with weight decay 0 is the same as an optimizer built with weight decay 0), and the refused
// calls name what is wrong and leave the optimizer as it was. (Against torch.optim's groups:
// tests/reference/test_optim_interchange.cpp.)
TEST(ParamGroups, AGroupsOptionsApplyToItsParametersOnly) {
  auto ps = params(1), qs = params(1);
  optim::AdamW grouped({ps[0]}, 0.01, 0.9, 0.999, 1e-8, 0.1);
  grouped.add_param_group({ps[1]}, {{"weight_decay", 0.0}, {"lr", 0.02}});
  ASSERT_EQ(grouped.param_groups().size(), 2u);
  EXPECT_EQ(grouped.param_groups()[1].options.at("beta2"), 0.999);  // a default it took
  optim::AdamW decayed({qs[0]}, 0.01, 0.9, 0.999, 1e-8, 0.1);
  optim::AdamW plain({qs[1]}, 0.02, 0.9, 0.999, 1e-8, 0.0);
  for (int step = 0; step < 3; ++step) {
    set_grads(ps, step);
    set_grads(qs, step);
    grouped.step();
    decayed.step();
    plain.step();
    grouped.zero_grad();
    decayed.zero_grad();
    plain.zero_grad();
  }
  EXPECT_EQ(values(ps), values(qs));
  // The same groups in a traced step (each group's options are constants of its graph).
  auto rs = params(1);
  optim::AdamW traced_opt({rs[0]}, 0.01, 0.9, 0.999, 1e-8, 0.1);
  traced_opt.add_param_group({rs[1]}, {{"weight_decay", 0.0}, {"lr", 0.02}});
  auto step = trace([&](const Tensor& g0, const Tensor& g1) {
    (sum(rs[0] * g0) + sum(rs[1] * g1)).backward();
    traced_opt.step();
    traced_opt.zero_grad();
    return rs[0] * 1.0;
  });
  for (int t = 0; t < 3; ++t)
    step(rt(rs[0].shape(), 100 + 10 * t), rt(rs[1].shape(), 101 + 10 * t));
  // (fp32 rounding of a few ops ordered differently once compiled, over three steps.)
  const auto traced_v = values(rs), eager_v = values(qs);
  expect_close(D(traced_v.begin(), traced_v.end()), D(eager_v.begin(), eager_v.end()), 1e-6);
  // state_dict numbers the parameters across the groups, each group with its own options.
  State sd = grouped.state_dict();
  EXPECT_EQ(sd.at("param_groups")[1].at("weight_decay").as_double(), 0.0);
  EXPECT_EQ(sd.at("param_groups")[1].at("params")[0].as_int(), 1);
}

TEST(ParamGroups, RefusedGroupsNameWhatIsWrong) {
  auto ps = params(1);
  Tensor extra = rt({2}, 7);
  extra.set_requires_grad(true).set_name("extra");
  optim::AdamW opt({ps[0]}, 0.01);
  expect_error(
      [&] {
        opt.add_param_group({ps[1]}, {{"momentum", 0.9}});
      },
      {"AdamW", "group 1", "unknown hyper-parameter 'momentum'", "valid keys:", "beta1"});
  expect_error(
      [&] {
        opt.add_param_group({ps[1]}, {{"beta2", 1.0}});
      },
      {"group 1", "invalid beta2 1", "[0, 1)"});
  expect_error(
      [&] {
        opt.add_param_group({ps[1]}, {{"weight_decay", -0.1}});
      },
      {"group 1", "invalid weight_decay -0.1"});
  expect_error([&] { opt.add_param_group({ps[0]}); },
               {"parameter 0 ('a') of group 1", "more than one place"});
  expect_error([&] { opt.add_param_group({}); }, {"parameter group 1 is empty"});
  EXPECT_EQ(opt.param_groups().size(), 1u);  // none of them was kept
  opt.add_param_group({ps[1]});
  EXPECT_EQ(opt.param_groups().size(), 2u);
  set_grads(ps, 0);
  opt.step();
  expect_error([&] { opt.add_param_group({extra}); },
               {"AdamW", "add_param_group", "state already exists", "before"});
  EXPECT_EQ(opt.param_groups().size(), 2u);
}

// A user optimizer that (wrongly) creates state in step().
class Sloppy : public optim::Optimizer {
 public:
  explicit Sloppy(std::vector<Tensor> p) : Optimizer(std::move(p), {{"lr", 0.1}}) {}
  void preinitialize() override {}
  void step() override {
    ensure_initialized();
    create_state(param_groups()[0].params[0], "late", zeros({}));
  }
  std::vector<std::string> state_names_to_sparsify() const override { return {}; }
  std::string name() const override { return "Sloppy"; }
};

TEST(OptimizerContract, StateOutsidePreinitializeIsAnError) {
  Sloppy s(params(1));
  expect_error([&] { s.step(); }, {"Sloppy", "'late'", "outside preinitialize()"});
}

TEST(OptimizerContract, GlobalStepAndSparsifyNames) {
  auto ps = params(1);
  optim::Lion lion(ps);
  EXPECT_FALSE(lion.has_state(ps[0], "step"));
  optim::NAdam nadam(params(2));
  EXPECT_EQ(nadam.state_names_to_sparsify(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  optim::RMSprop rms(params(3));
  EXPECT_EQ(rms.state_names_to_sparsify(),
            (std::vector<std::string>{"square_avg", "momentum_buffer", "grad_avg"}));
}

// state_names_to_sparsify() is recorded only: there is no weight sparsity, so nothing calls
// it, and two optimizers that differ only in the names they return update their parameters
// and save their state identically.
class SgdSparsifyingNothing : public optim::SGD {
 public:
  using optim::SGD::SGD;
  std::vector<std::string> state_names_to_sparsify() const override { return {}; }
};

TEST(OptimizerContract, SparsifyNamesAreRecordedOnly) {
  auto pa = params(1), pb = params(1);
  optim::SGD a(pa, 0.1, 0.9);
  SgdSparsifyingNothing b(pb, 0.1, 0.9);
  ASSERT_NE(a.state_names_to_sparsify(), b.state_names_to_sparsify());
  for (int s = 0; s < 3; ++s) {
    set_grads(pa, s);
    set_grads(pb, s);
    a.step();
    b.step();
    a.zero_grad();
    b.zero_grad();
  }
  EXPECT_EQ(values(pa), values(pb));
  EXPECT_EQ(a.state_dict(), b.state_dict());
}

TEST(ScheduledHyperParameters, WeightDecayTensorChangesACompiledStep) {
  // SGD with weight decay held as a tensor: p -= lr * (g + wd * p). With a zero gradient the
  // update is p *= 1 - lr * wd, so a change of wd between replays shows up at once.
  Tensor p = fv({1.0f, 2.0f});
  p.set_requires_grad(true);
  optim::SGD opt({p}, 0.5, 0, 0, /*weight_decay=*/0.0);
  Tensor& wd = opt.hyper_tensor(0, "weight_decay");
  auto step = trace([&](const Tensor& x) {
    sum(p * x).backward();
    opt.step();
    opt.zero_grad();
    return p * 1.0;
  });
  Tensor zero = zeros({2});
  expect_close(step(zero).to_vector<double>(), {1.0, 2.0}, 0);  // wd 0: no change
  wd.fill_(0.2);
  expect_close(step(zero).to_vector<double>(), {0.9, 1.8}, 1e-6);
  expect_error([&] { opt.hyper_tensor(0, "momentum"); },
               {"'momentum' cannot be driven by a scheduler", "lr, weight_decay"});
  optim::Rprop rprop(params(1));
  expect_error([&] { rprop.hyper_tensor(0, "lr"); }, {"Rprop", "'lr'", "schedulable keys: none"});
  // Adafactor's relative steps never read lr: a schedule of it was accepted and changed nothing.
  auto relative = optim::configure_optimizer("Adafactor", params(1), Config::object());
  expect_error(
      [&] { optim::configure_lr_scheduler(*relative, Config(0.01)); },
      {"Adafactor", "'lr' cannot be driven by a scheduler", "schedulable keys: weight_decay"});
  auto fixed =
      optim::configure_optimizer("Adafactor", params(1), {{"lr", 0.1}, {"relative_step", false}});
  EXPECT_NO_THROW(optim::configure_lr_scheduler(*fixed, Config(0.01)));
}

}  // namespace
}  // namespace cstorch::testing
