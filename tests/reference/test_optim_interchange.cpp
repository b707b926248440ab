// Optimizer state moved between cstorch and PyTorch mid-run (optim_interchange.py runs torch
// once for every case).
//
// cstorch -> PyTorch: cstorch trains N steps, saves {"model", "optimizer"} to HDF5 and
// converts it to .pt (what `cszoo checkpoint convert` does), and also saves it straight to .pt;
// torch.optim.<Name>.load_state_dict takes each file's optimizer state (its layout checked in
// the script) and trains M more steps. The result must equal cstorch training N + M steps.
// PyTorch -> cstorch: torch trains N steps and torch.save-s {"model": state_dict, "optimizer":
// opt.state_dict()}; cstorch loads both and trains M more; the result must equal torch's N + M.
//
// Every optimizer both libraries have is covered in both directions, with non-default options
// where the layouts differ (pairs, booleans, SGD's first-step rule under dampening).
// Tolerance: 1e-5 relative plus 1e-6 absolute per parameter element. Both sides compute the
// same float32 updates, but not with the same operation order (cstorch fuses terms and forms
// bias corrections as -expm1(t ln b), torch as 1 - b^t in double), so each step differs by a
// few ulps; over 8 steps that stays well below 1e-5 relative. A state that was not carried
// over (a momentum buffer restarted, a step count reset to 0) changes the parameters by far
// more (the first step of Adam alone moves every element by about lr).
#include <gtest/gtest.h>

#include <cmath>

#include "cstorch/cstorch.h"
#include "ref_util.h"

namespace cstorch::reftest {
namespace {

constexpr int kN = 4, kM = 4;
const std::vector<std::pair<std::string, Shape>> kParams = {
    {"fc.weight", {4, 5}}, {"fc.bias", {4}}, {"emb", {2, 3, 2}}};

struct Case {
  std::string id, type;
  json args;
  // Parameter groups (optional): [{"params": [indices into kParams]}, {"params": [...],
  // options...}, ...]; the first group takes `args`, the others override some of them
  // (add_param_group; "betas" as torch names the pair).
  json groups = nullptr;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.id;
}

// clang-format off
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"sgd", "SGD", {{"lr", 0.1}}},
      {"sgd_momentum", "SGD", {{"lr", 0.05}, {"momentum", 0.9}}},
      {"sgd_nesterov_wd", "SGD", {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}, {"weight_decay", 0.01}}},
      {"sgd_dampening_maximize", "SGD", {{"lr", 0.05}, {"momentum", 0.9}, {"dampening", 0.1}, {"maximize", true}}},
      {"adam", "Adam", {{"lr", 0.01}}},
      {"adam_amsgrad_betas_wd", "Adam", {{"lr", 0.01}, {"amsgrad", true}, {"betas", {0.8, 0.99}}, {"weight_decay", 0.1}}},
      {"adamw", "AdamW", {{"lr", 0.01}, {"weight_decay", 0.1}}},
      {"adamw_amsgrad_maximize", "AdamW", {{"lr", 0.01}, {"amsgrad", true}, {"maximize", true}}},
      {"adadelta", "Adadelta", {{"lr", 0.5}, {"rho", 0.95}, {"weight_decay", 0.1}}},
      {"adagrad", "Adagrad", {{"lr", 0.1}, {"lr_decay", 0.01}, {"initial_accumulator_value", 0.5}}},
      {"adamax", "Adamax", {{"lr", 0.01}, {"betas", {0.85, 0.995}}}},
      {"asgd", "ASGD", {{"lr", 0.01}, {"lambd", 1e-3}, {"t0", 2}}},
      {"nadam", "NAdam", {{"lr", 0.01}, {"momentum_decay", 8e-3}}},
      {"radam", "RAdam", {{"lr", 0.01}, {"betas", {0.9, 0.99}}}},
      {"rmsprop", "RMSprop", {{"lr", 0.01}, {"momentum", 0.9}, {"centered", true}}},
      {"rprop", "Rprop", {{"lr", 0.01}, {"etas", {0.3, 1.5}}, {"step_sizes", {1e-4, 1.0}}}},
      // Two groups: weight decay off and a rate and betas of its own for the bias and the
      // embedding (the usual split); and groups that number the parameters out of model order.
      {"adamw_groups", "AdamW", {{"lr", 0.01}, {"weight_decay", 0.1}},
       json::array({{{"params", {0}}}, {{"params", {1, 2}}, {"weight_decay", 0.0}, {"lr", 0.02}, {"betas", {0.8, 0.95}}}})},
      {"sgd_groups_out_of_order", "SGD", {{"lr", 0.05}, {"momentum", 0.9}},
       json::array({{{"params", {0, 2}}}, {{"params", {1}}, {"lr", 0.1}, {"momentum", 0.5}}})},
  };
  return c;
}
// clang-format on

struct Data {
  std::vector<std::vector<double>> init;                // per parameter
  std::vector<std::vector<std::vector<double>>> grads;  // [step][parameter]
};

const Data& data() {
  static const Data d = [] {
    Data d;
    Rng rng(4242);
    for (auto& [name, s] : kParams) {
      std::vector<double> v(static_cast<size_t>(numel(s)));
      for (auto& x : v) x = round_to(rng.normal(), DType::f32);
      d.init.push_back(v);
    }
    for (int t = 0; t < kN + kM; ++t) {
      std::vector<std::vector<double>> gs;
      for (auto& [name, s] : kParams) {
        std::vector<double> v(static_cast<size_t>(numel(s)));
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

std::vector<Tensor> make_params(const std::vector<std::vector<double>>& values) {
  std::vector<Tensor> ps;
  for (size_t i = 0; i < kParams.size(); ++i) {
    Tensor p = make_tensor(values[i], kParams[i].second, DType::f32);
    p.set_requires_grad(true);
    p.set_name(kParams[i].first);
    ps.push_back(p);
  }
  return ps;
}

// loss = sum_i sum(p_i * g_i): its gradient is exactly the given g_i.
void train(const std::vector<Tensor>& ps, optim::Optimizer& opt, int first, int count) {
  for (int t = first; t < first + count; ++t) {
    Tensor loss;
    for (size_t i = 0; i < ps.size(); ++i) {
      Tensor term = sum(ps[i] * make_tensor(data().grads[t][i], kParams[i].second, DType::f32));
      loss = loss.defined() ? loss + term : term;
    }
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
}

// The case's optimizer over `ps`: one group, or its groups (the first built by
// configure_optimizer, the others added with their options).
std::unique_ptr<optim::Optimizer> make_optimizer(const Case& c, const std::vector<Tensor>& ps) {
  if (c.groups.is_null()) return optim::configure_optimizer(c.type, ps, c.args);
  auto pick = [&](const json& g) {
    std::vector<Tensor> r;
    for (int i : g.at("params")) r.push_back(ps[static_cast<size_t>(i)]);
    return r;
  };
  auto opt = optim::configure_optimizer(c.type, pick(c.groups[0]), c.args);
  for (size_t k = 1; k < c.groups.size(); ++k) {
    std::map<std::string, double> options;
    for (auto& [key, v] : c.groups[k].items()) {
      if (key == "params") continue;
      if (key == "betas") {
        options["beta1"] = v[0];
        options["beta2"] = v[1];
      } else {
        options[key] = v;
      }
    }
    opt->add_param_group(pick(c.groups[k]), options);
  }
  return opt;
}

std::vector<double> flat(const std::vector<Tensor>& ps) {
  std::vector<double> r;
  for (auto& p : ps)
    for (double v : p.to_vector<double>()) r.push_back(v);
  return r;
}

State model_state(const std::vector<Tensor>& ps) {
  State m = State::map();
  for (auto& p : ps) m.set(p.name(), p);
  return m;
}

struct Result {
  std::filesystem::path dir;
  std::map<std::string, std::vector<double>> cstorch_full;                // N + M in cstorch
  std::map<std::string, std::vector<std::vector<double>>> torch_resumed;  // per file
  std::map<std::string, std::vector<double>> torch_full;                  // N + M in torch
  std::string error;
};

const Result& result() {
  static const Result r = [] {
    Result r;
    r.dir = make_temp_dir("optim_interchange");
    json jcases = json::array();
    for (const auto& c : cases()) {
      auto ps = make_params(data().init);
      auto opt = make_optimizer(c, ps);
      train(ps, *opt, 0, kN);
      State ck = State::map({{"model", model_state(ps)}, {"optimizer", opt->state_dict()}});
      const std::string mdl = (r.dir / (c.id + ".mdl")).string();
      const std::string converted = (r.dir / (c.id + "_converted.pt")).string();
      const std::string direct = (r.dir / (c.id + "_direct.pt")).string();
      save(ck, mdl);
      convert_checkpoint(mdl, converted);
      save(ck, direct);
      train(ps, *opt, kN, kM);
      r.cstorch_full[c.id] = flat(ps);
      jcases.push_back(json{{"id", c.id},
                            {"type", c.type},
                            {"args", c.args},
                            {"groups", c.groups},
                            {"files", {converted, direct}},
                            {"torch_file", (r.dir / (c.id + "_torch.pt")).string()}});
    }
    json jparams = json::array();
    for (size_t i = 0; i < kParams.size(); ++i)
      jparams.push_back(
          json{{"name", kParams[i].first}, {"shape", kParams[i].second}, {"data", data().init[i]}});
    json in{{"params", jparams}, {"grads", data().grads}, {"n", kN}, {"m", kM}, {"cases", jcases}};
    auto in_path = r.dir / "in.json", out_path = r.dir / "out.json";
    write_json(in_path, in);
    std::string log;
    int rc =
        run_reference_script("optim_interchange.py", {in_path.string(), out_path.string()}, &log);
    if (rc != 0) {
      r.error = torch_unavailable_reason();
      if (r.error.empty())
        r.error = "optim_interchange.py failed (exit " + std::to_string(rc) + ") on " +
                  in_path.string() + ":\n" + log;
      return r;
    }
    json o = read_json(out_path);
    for (const auto& c : cases()) {
      r.torch_resumed[c.id] = o[c.id]["from_cstorch"].get<std::vector<std::vector<double>>>();
      r.torch_full[c.id] = o[c.id]["torch"].get<std::vector<double>>();
    }
    return r;
  }();
  return r;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = 1e-5 * std::fabs(want[i]) + 1e-6;
    if (!(std::fabs(got[i] - want[i]) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << ": " << got[i] << " vs " << want[i];
  }
  EXPECT_EQ(bad, 0) << what;
}

class OptimInterchange : public ::testing::TestWithParam<Case> {};

TEST_P(OptimInterchange, CstorchToTorch) {
  const Result& r = result();
  ASSERT_TRUE(r.error.empty()) << r.error;
  const Case& c = GetParam();
  const auto& resumed = r.torch_resumed.at(c.id);
  ASSERT_EQ(resumed.size(), 2u);
  expect_close(resumed[0], r.cstorch_full.at(c.id), c.id + ": converted .mdl -> .pt");
  expect_close(resumed[1], r.cstorch_full.at(c.id), c.id + ": saved as .pt");
}

// Both libraries from the same start over all N + M steps: the case's hyper-parameters (each
// group's own, where it has groups) take effect the same way. (The two directions above would
// not notice a group option that is lost: load_state_dict takes the dict's hyper-parameters.)
TEST_P(OptimInterchange, SameRunAsTorch) {
  const Result& r = result();
  ASSERT_TRUE(r.error.empty()) << r.error;
  const Case& c = GetParam();
  expect_close(r.cstorch_full.at(c.id), r.torch_full.at(c.id), c.id + ": N + M steps in each");
}

TEST_P(OptimInterchange, TorchToCstorch) {
  const Result& r = result();
  ASSERT_TRUE(r.error.empty()) << r.error;
  const Case& c = GetParam();
  State ck = load((r.dir / (c.id + "_torch.pt")).string());
  std::vector<std::vector<double>> values;
  for (auto& [name, s] : kParams)
    values.push_back(ck.at("model").at(name).as_tensor().to_vector<double>());
  auto ps = make_params(values);
  auto opt = make_optimizer(c, ps);
  opt->load_state_dict(ck.at("optimizer"));
  train(ps, *opt, kN, kM);
  expect_close(flat(ps), r.torch_full.at(c.id), c.id + ": torch.save -> cstorch");
}

INSTANTIATE_TEST_SUITE_P(AllShared, OptimInterchange, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.id; });

}  // namespace
}  // namespace cstorch::reftest
