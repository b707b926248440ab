// Training curves against PyTorch: the same FC network (784 -> 64 -> 32 -> 10, ReLU), the same
// initial weights (generated here and written to JSON), the same 50 synthetic batches of 16
// (random labels, inputs a class prototype plus noise),
// SGD (lr 0.05, momentum 0.9) and AdamW (lr 1e-3, weight decay 0.01), 50 steps: the loss at
// every step must agree with torch (float32) within 1e-4 relative, in eager mode and in a
// traced step (forward, cross_entropy, backward, optimizer step, zero_grad).
#include <gtest/gtest.h>

#include <map>

#include "cstorch/cstorch.h"
#include "ref_util.h"

namespace cstorch::reftest {
namespace {

constexpr int kSteps = 50, kBatch = 16, kIn = 784, kClasses = 10;
const std::vector<std::pair<int64_t, int64_t>> kLayers = {{784, 64}, {64, 32}, {32, 10}};
constexpr double kRelTol = 1e-4;

struct Data {
  std::vector<std::pair<std::string, std::vector<double>>> weights;  // state-dict order
  std::map<std::string, Shape> shapes;
  std::vector<std::vector<double>> xs, ys;  // per batch
};

const Data& data() {
  static const Data d = [] {
    Data d;
    Rng rng(20240601);
    for (size_t l = 0; l < kLayers.size(); ++l) {
      auto [in, out] = kLayers[l];
      double b = 1.0 / std::sqrt(static_cast<double>(in));
      std::string p = std::to_string(2 * l);  // Sequential indices 0, 2, 4 (ReLUs between)
      std::vector<double> w(static_cast<size_t>(in * out)), bias(static_cast<size_t>(out));
      for (auto& v : w) v = round_to(rng.uniform(-b, b), DType::f32);
      for (auto& v : bias) v = round_to(rng.uniform(-b, b), DType::f32);
      d.weights.push_back({p + ".weight", w});
      d.shapes[p + ".weight"] = {out, in};
      d.weights.push_back({p + ".bias", bias});
      d.shapes[p + ".bias"] = {out};
    }
    // Learnable data: a random label and the input a class prototype (scaled by 0.2) plus
    // N(0, 1) noise, so the loss falls (SGD ~2.3 -> ~0.2) and the curve depends on every
    // gradient being right.
    std::vector<double> proto(kClasses * kIn);
    for (auto& v : proto) v = rng.normal();
    for (int s = 0; s < kSteps; ++s) {
      std::vector<double> x(kBatch * kIn), y(kBatch);
      for (int i = 0; i < kBatch; ++i) {
        int64_t c = rng.integer(0, kClasses);
        y[i] = static_cast<double>(c);
        for (int k = 0; k < kIn; ++k)
          x[i * kIn + k] = round_to(0.2 * proto[c * kIn + k] + rng.normal(), DType::f32);
      }
      d.xs.push_back(std::move(x));
      d.ys.push_back(std::move(y));
    }
    return d;
  }();
  return d;
}

nn::Sequential make_model() {
  nn::Sequential model(nn::Linear(784, 64), nn::ReLU(), nn::Linear(64, 32), nn::ReLU(),
                       nn::Linear(32, 10));
  nn::StateDict sd;
  for (auto& [k, v] : data().weights) sd.insert(k, make_tensor(v, data().shapes.at(k), DType::f32));
  model->load_state_dict(sd);
  return model;
}

std::unique_ptr<optim::Optimizer> make_opt(const std::string& kind, const nn::Sequential& m) {
  if (kind == "sgd") return std::make_unique<optim::SGD>(m->parameters(), 0.05, 0.9);
  return std::make_unique<optim::AdamW>(m->parameters(), 1e-3, 0.9, 0.999, 1e-8, 0.01);
}

Batch batch(int s) {
  return {{"x", make_tensor(data().xs[s], {kBatch, kIn}, DType::f32)},
          {"y", make_tensor(data().ys[s], {kBatch}, DType::i64)}};
}

std::vector<double> curve(const std::string& kind, bool traced) {
  auto model = make_model();
  auto opt = make_opt(kind, model);
  std::vector<double> losses;
  if (!traced) {
    for (int s = 0; s < kSteps; ++s) {
      auto b = batch(s);
      Tensor loss = cross_entropy(model(b.at("x")), b.at("y"));
      loss.backward();
      opt->step();
      opt->zero_grad();
      losses.push_back(loss.item<double>());
    }
    return losses;
  }
  auto step = trace(
      [&](const Batch& b) {
        Tensor loss = cross_entropy(model(b.at("x")), b.at("y"));
        loss.backward();
        opt->step();
        opt->zero_grad();
        return loss;
      },
      "train_" + kind);
  std::vector<Tensor> pending;
  for (int s = 0; s < kSteps; ++s) pending.push_back(step(batch(s)));
  for (auto& l : pending) losses.push_back(l.item<double>());
  return losses;
}

// torch's curves, computed once by training_curve.py.
struct Reference {
  std::map<std::string, std::vector<double>> losses;
  std::string error;
};

const Reference& reference() {
  static const Reference r = [] {
    Reference r;
    json w = json::object();
    for (auto& [k, v] : data().weights) w[k] = json{{"shape", data().shapes.at(k)}, {"data", v}};
    json batches = json::array();
    for (int s = 0; s < kSteps; ++s)
      batches.push_back(json{{"x", data().xs[s]}, {"y", data().ys[s]}});
    json j{{"weights", w},
           {"batches", batches},
           {"batch", kBatch},
           {"in", kIn},
           {"optimizers",
            {{"sgd", {{"lr", 0.05}, {"momentum", 0.9}}},
             {"adamw", {{"lr", 1e-3}, {"weight_decay", 0.01}}}}}};
    auto dir = make_temp_dir("ref_curve");
    auto in = dir / "curve_in.json", out = dir / "curve_out.json";
    write_json(in, j);
    std::string log;
    int rc = run_reference_script("training_curve.py", {in.string(), out.string()}, &log);
    if (rc != 0) {
      r.error = torch_unavailable_reason();
      if (!r.error.empty()) return r;
      r.error = "training_curve.py failed (exit " + std::to_string(rc) + ") on " + in.string() +
                ":\n" + log;
      return r;
    }
    json o = read_json(out);
    for (auto& [k, v] : o.items()) r.losses[k] = v.get<std::vector<double>>();
    if (!std::getenv("CSTORCH_REF_KEEP")) std::filesystem::remove_all(dir);
    return r;
  }();
  return r;
}

void expect_curve(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  double worst = 0;
  for (size_t s = 0; s < got.size(); ++s) {
    double rel = std::abs(got[s] - want[s]) / std::abs(want[s]);
    worst = std::max(worst, rel);
    if (!(rel <= kRelTol) && bad++ < 5)
      ADD_FAILURE() << what << ": step " << s << ": loss " << got[s] << ", torch " << want[s]
                    << " (relative error " << rel << " > " << kRelTol << ")";
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " steps out of tolerance";
  std::printf("[curve] %s: max relative error %.3g; loss %.5f -> %.5f (torch %.5f -> %.5f)\n",
              what.c_str(), worst, got.front(), got.back(), want.front(), want.back());
}

class TrainingCurve : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(TrainingCurve, MatchesTorch) {
  auto [kind, traced] = GetParam();
  const Reference& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  ASSERT_TRUE(ref.losses.count(kind)) << "training_curve.py returned no curve for " << kind;
  auto got = curve(kind, traced);
  expect_curve(got, ref.losses.at(kind), kind + (traced ? " traced" : " eager"));
  if (traced) {
    // The traced program and eager mode must agree closely too.
    auto eager = curve(kind, false);
    for (size_t s = 0; s < got.size(); ++s)
      EXPECT_NEAR(got[s], eager[s], 1e-5 * std::abs(eager[s]))
          << kind << ": eager vs traced at step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(Curves, TrainingCurve,
                         ::testing::Combine(::testing::Values(std::string("sgd"),
                                                              std::string("adamw")),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) ? "_traced" : "_eager");
                         });

}  // namespace
}  // namespace cstorch::reftest
