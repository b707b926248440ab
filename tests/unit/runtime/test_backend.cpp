// Backend rules and compile(); the optimizer preinitialize contract.
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <cstorch/cstorch.h>

namespace cs = cstorch;
using cs::Tensor;

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

// PyTorch's defaults: Linear weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)); Embedding ~ N(0,1);
// LayerNorm ones and zeros.
TEST(Module, DefaultInitialisationsFollowPyTorch) {
  cs::manual_seed(5);
  cs::nn::Linear lin(400, 300);
  float bound = 1.0f / std::sqrt(400.0f);
  for (auto* t : {&lin->weight, &lin->bias}) {
    auto v = t->to_vector<float>();
    double sum = 0, sq = 0;
    float lo = 1e9f, hi = -1e9f;
    for (float x : v) {
      sum += x;
      sq += double(x) * x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    double mean = sum / v.size(), var = sq / v.size() - mean * mean;
    EXPECT_GE(lo, -bound);
    EXPECT_LT(hi, bound);
    if (v.size() > 1000) {
      EXPECT_NEAR(mean, 0, 0.01 * bound);
      EXPECT_NEAR(var, bound * bound / 3, 0.02 * bound * bound / 3);  // uniform variance
      EXPECT_GT(hi, 0.99f * bound);
    }
  }
  cs::nn::Embedding emb(1000, 64);
  auto e = emb->weight.to_vector<float>();
  double m = 0, s = 0;
  for (float x : e) m += x / e.size();
  for (float x : e) s += (x - m) * (x - m) / e.size();
  EXPECT_NEAR(m, 0, 0.02);
  EXPECT_NEAR(s, 1, 0.03);
  cs::nn::LayerNorm ln(cs::Shape{8});
  EXPECT_EQ(ln->weight.to_vector<float>(), std::vector<float>(8, 1.f));
  EXPECT_EQ(ln->bias.to_vector<float>(), std::vector<float>(8, 0.f));
  EXPECT_TRUE(lin->weight.requires_grad());
  EXPECT_EQ(lin->named_parameters()[0].first, "weight");
}

TEST(Module, TrainEvalReachesChildrenAndDropout) {
  cs::nn::Sequential m(cs::nn::Linear(4, 4), cs::nn::Dropout(0.5));
  EXPECT_TRUE(m->is_training());
  m->eval();
  EXPECT_FALSE((*m)[1]->is_training());
  auto x = cs::ones({2, 4});
  EXPECT_EQ((*m)[1]->forward(x).to_vector<float>(), x.to_vector<float>());  // identity in eval
  m->train();
  EXPECT_TRUE((*m)[1]->is_training());
}

namespace {
std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
}  // namespace

TEST(Backend, ConfigureMapsOntoTheCsxBackendOnce) {
  cs::ConfigureOptions o;
  o.checkpoint_steps = 5;
  o.num_csx = 2;
  o.job_labels = {"team=ml"};
  auto be = cs::configure(o);
  EXPECT_EQ(be->type_name(), "CSX");
  EXPECT_EQ(be->options().cluster_config.num_csx, 2);
  ASSERT_NE(cs::configured(), nullptr);
  EXPECT_EQ(cs::configured()->checkpoint_steps, 5);
  try {
    cs::configure(o);
    FAIL();
  } catch (const cs::Error& e) {
    EXPECT_STREQ(e.what(),
                 "configure: already called in this process; call it once, before the run");
  }
}

TEST(Backend, ConfigureValidatesClusterFields) {
  cs::ConfigureOptions o;
  o.job_labels = {"no-equals-sign"};
  try {
    cs::configure(o);
    FAIL();
  } catch (const cs::Error& e) {
    EXPECT_STREQ(e.what(),
                 "cluster_config.job_labels: 'no-equals-sign' is not of the form key=value");
  }
  EXPECT_EQ(cs::configured(), nullptr);  // a failed call configures nothing
}

// The default compile_dir (/opt/cerebras/cached_compile) where a non-root user cannot
// write: configure() falls back to <model_dir>/cached_compile with one warning naming both, and
// the first traced step writes its compile report there. The default is pointed at a path that
// cannot be created even by root (under a regular file) through $CSTORCH_DEFAULT_COMPILE_DIR.
TEST(Backend, ConfigureFallsBackWhenTheDefaultCompileDirIsNotWritable) {
  auto dir = std::filesystem::temp_directory_path() /
             ("cstorch_compile_dir_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ::setenv("CSTORCH_DEFAULT_COMPILE_DIR", "/etc/passwd/cached_compile", 1);
  cs::ConfigureOptions o;
  o.model_dir = dir.string();
  testing::internal::CaptureStderr();
  auto be = cs::configure(o);
  const std::string err = testing::internal::GetCapturedStderr();
  ::unsetenv("CSTORCH_DEFAULT_COMPILE_DIR");
  const std::string fallback = (dir / "cached_compile").string();
  EXPECT_EQ(be->options().compile_dir, fallback);
  EXPECT_EQ(err,
            "warning: the default compile_dir '/etc/passwd/cached_compile' is not writable; "
            "compile artefacts go to '" +
                fallback + "' instead (set compile_dir to choose)\n");
  auto step = cs::trace([&](const Tensor& x) { return cs::relu(x) * 2.0; }, "first");
  EXPECT_EQ(step(cs::ones({3})).to_vector<float>(), (std::vector<float>{2, 2, 2}));
  const std::string report = read_text(fallback + "/first-compile-0.txt");
  EXPECT_NE(report.find("compile report for traced step 'first'"), std::string::npos) << report;
  std::filesystem::remove_all(dir);
}

// A writable default is kept, silently; a compile_dir given explicitly is never replaced.
TEST(Backend, ConfigureKeepsAWritableDefaultCompileDir) {
  auto dir = std::filesystem::temp_directory_path() /
             ("cstorch_compile_dir_ok_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  ::setenv("CSTORCH_DEFAULT_COMPILE_DIR", (dir / "site" / "cache").c_str(), 1);
  cs::ConfigureOptions o;
  o.model_dir = (dir / "model").string();
  testing::internal::CaptureStderr();
  auto be = cs::configure(o);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  ::unsetenv("CSTORCH_DEFAULT_COMPILE_DIR");
  EXPECT_EQ(be->options().compile_dir, (dir / "site" / "cache").string());
  std::filesystem::remove_all(dir);
}

// compile_only: each new signature is traced and compiled once, the report is written to the
// artifact directory and nothing runs (parameters keep their values).
TEST(Backend, CompileOnlyWritesAReportAndRunsNothing) {
  auto dir = std::filesystem::temp_directory_path() /
             ("cstorch_compile_only_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  cs::BackendOptions o;
  o.artifact_dir = dir.string();
  o.compile_only = true;
  cs::backend("CPU", o);
  cs::nn::Linear fc(4, 3);
  auto w0 = fc->weight.to_vector<float>();
  auto opt = cs::optim::configure_optimizer("SGD", fc->parameters(), {{"lr", 0.5}});
  auto step = cs::trace(
      [&](const Tensor& x) {
        auto loss = cs::sum(fc(x));
        loss.backward();
        opt->step();
        return loss;
      },
      "train");
  auto loss = step(cs::ones({2, 4}));
  step(cs::ones({2, 4}));
  EXPECT_EQ(loss.item<float>(), 0.0f);
  EXPECT_EQ(fc->weight.to_vector<float>(), w0);
  std::string report = read_text((dir / "train-compile-0.txt").string());
  EXPECT_NE(report.find("compile report for traced step 'train'"), std::string::npos) << report;
  EXPECT_NE(report.find("FLOPs per step:"), std::string::npos) << report;
  EXPECT_NE(report.find("arena bytes:"), std::string::npos) << report;
  EXPECT_FALSE(std::filesystem::exists(dir / "train-compile-1.txt"));  // same signature
  step(cs::ones({3, 4}));
  EXPECT_TRUE(std::filesystem::exists(dir / "train-compile-1.txt"));
}

TEST(Backend, ValidateOnlyTracesAndChecks) {
  auto dir = std::filesystem::temp_directory_path() /
             ("cstorch_validate_only_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  cs::BackendOptions o;
  o.artifact_dir = dir.string();
  o.validate_only = true;
  cs::backend("CPU", o);
  auto step = cs::trace([&](const Tensor& x) { return cs::relu(x) * 2.0; }, "f");
  auto y = step(cs::ones({5}));
  EXPECT_EQ(y.shape(), (cs::Shape{5}));
  std::string report = read_text((dir / "f-validate-0.txt").string());
  EXPECT_NE(report.find("batch inputs: 1\noutputs: 1"), std::string::npos) << report;
  EXPECT_NE(report.find("mul: 1"), std::string::npos) << report;
  EXPECT_NE(report.find("relu: 1"), std::string::npos) << report;
  // A step that fails to trace still fails in validate_only mode.
  auto bad = cs::trace([&](const Tensor& x) { return cs::matmul(x, x); }, "bad");
  EXPECT_THROW(bad(cs::ones({2, 3})), cs::Error);
}
