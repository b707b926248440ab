// Backend rules and compile(); the optimizer preinitialize contract.
#include <gtest/gtest.h>

#include <cstorch/cstorch.h>

namespace cs = cstorch;

TEST(Backend, OneTypePerProcessWithTheExactMessage) {
  auto b = cs::backend("cpu");
  EXPECT_EQ(b->type(), cs::DeviceType::CPU);
  EXPECT_EQ(cs::backend("CPU"), b);  // reused
  EXPECT_EQ(cs::backend(), b);
  try {
    cs::backend("CSX");
    FAIL();
  } catch (const cs::Error& e) {
    EXPECT_STREQ(e.what(),
                 "Cannot instantiate multiple backends. A backend with type CPU has already been "
                 "instantiated.");
  }
  EXPECT_THROW(cs::backend("TPU"), cs::Error);
}

TEST(Backend, CompileChecksTheBackendAndKeepsTheModelCallable) {
  auto b = cs::backend("CPU");
  cs::nn::Linear lin(3, 2);
  auto compiled = cs::compile(lin, b);
  auto y = compiled(cs::ones({4, 3}));
  EXPECT_EQ(y.shape(), (cs::Shape{4, 2}));
  auto other = std::make_shared<cs::Backend>(cs::DeviceType::CSX, cs::BackendOptions{});
  EXPECT_THROW(cs::compile(lin, other), cs::Error);
}

TEST(Backend, ClusterConfigIsValidated) {
  cs::BackendOptions o;
  o.cluster_config.num_csx = 0;
  EXPECT_THROW(cs::Backend(cs::DeviceType::CSX, o), cs::Error);
  o.cluster_config.num_csx = 1;
  o.cluster_config.job_labels = {"novalue"};
  EXPECT_THROW(cs::Backend(cs::DeviceType::CSX, o), cs::Error);
}

namespace {
class BadOptimizer : public cs::optim::Optimizer {
 public:
  explicit BadOptimizer(std::vector<cs::Tensor> p) : Optimizer(std::move(p), {{"lr", 0.1}}) {}
  void preinitialize() override {}
  void step() override {
    for (auto& p : param_groups()[0].params) create_state(p, "late", cs::zeros_like(p));
  }
  std::vector<std::string> state_names_to_sparsify() const override { return {}; }
  std::string name() const override { return "Bad"; }
};
}  // namespace

TEST(Optimizer, StateOutsidePreinitializeIsAnError) {
  cs::nn::Linear lin(2, 2);
  BadOptimizer opt(lin->parameters());
  try {
    opt.step();
    FAIL();
  } catch (const cs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside preinitialize"), std::string::npos) << e.what();
  }
}

TEST(Optimizer, ConfigureByNameWithAliasesAndErrors) {
  cs::nn::Linear lin(2, 2);
  auto o = cs::optim::configure_optimizer("sgd", lin->parameters(),
                                          {{"learning_rate", 0.5}, {"momentum", 0.9}});
  EXPECT_EQ(o->name(), "SGD");
  EXPECT_DOUBLE_EQ(o->param_groups()[0].options.at("lr"), 0.5);
  try {
    cs::optim::configure_optimizer("Adamm", lin->parameters(), {});
    FAIL();
  } catch (const cs::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("Adamm"), std::string::npos);
    EXPECT_NE(m.find("AdamW"), std::string::npos);
    EXPECT_NE(m.find("SGD"), std::string::npos);
  }
}

TEST(Module, StateDictAndStrictLoading) {
  cs::nn::Sequential a(cs::nn::Linear(3, 4), cs::nn::ReLU(), cs::nn::Linear(4, 2));
  auto sd = a->state_dict();
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  cs::nn::Sequential b(cs::nn::Linear(3, 4), cs::nn::ReLU(), cs::nn::Linear(4, 2));
  b->load_state_dict(sd);
  EXPECT_EQ(b->state_dict().at("2.bias").to_vector<float>(), sd.at("2.bias").to_vector<float>());
  cs::nn::StateDict missing;
  missing.insert("0.weight", sd.at("0.weight"));
  try {
    b->load_state_dict(missing);
    FAIL();
  } catch (const cs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("2.bias"), std::string::npos) << e.what();
  }
  cs::nn::StateDict wrong;
  for (auto& [k, v] : sd) wrong.insert(k, v);
  wrong.insert("0.bias", cs::zeros({5}));
  try {
    b->load_state_dict(wrong);
    FAIL();
  } catch (const cs::Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("0.bias"), std::string::npos) << m;
    EXPECT_NE(m.find("[5]"), std::string::npos) << m;
  }
}
