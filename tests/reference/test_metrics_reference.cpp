// Metrics against an independent PyTorch computation (metrics_reference.py, float64 from the
// same float32 data): every metric is updated inside a traced eval step over several batches
// (replays), then compute() must match torch within 1e-5 relative (f32 accumulation of a few
// hundred terms).
#include <gtest/gtest.h>

#include <map>

#include "cstorch/cstorch.h"
#include "cstorch/metrics.h"
#include "ref_util.h"

namespace cstorch::reftest {
namespace {

constexpr int kBatches = 4, kN = 64, kC = 5, kK = 2, kThresholds = 37;
constexpr double kBeta = 0.7, kRelTol = 1e-5;

struct Data {
  std::vector<std::vector<double>> logits, labels, weights, probs, binary;
};

const Data& data() {
  static const Data d = [] {
    Data d;
    Rng rng(771);
    for (int s = 0; s < kBatches; ++s) {
      std::vector<double> x(kN * kC), y(kN), w(kN), p(kN), bin(kN);
      for (auto& v : x) v = round_to(2 * rng.normal(), DType::f32);
      for (int i = 0; i < kN; ++i) {
        y[i] = static_cast<double>(rng.integer(0, kC));
        w[i] = round_to(rng.uniform(), DType::f32);
        bin[i] = static_cast<double>(rng.integer(0, 2));
        // Positives score higher on average, so the curves are informative.
        p[i] = round_to(std::min(1.0, std::max(0.0, 0.35 * bin[i] + 0.65 * rng.uniform())),
                        DType::f32);
      }
      d.logits.push_back(x);
      d.labels.push_back(y);
      d.weights.push_back(w);
      d.probs.push_back(p);
      d.binary.push_back(bin);
    }
    return d;
  }();
  return d;
}

TEST(MetricsReference, TracedMetricsMatchTorch) {
  if (auto why = torch_unavailable_reason(); !why.empty()) FAIL() << why;
  namespace m = metrics;
  m::AccuracyMetric acc("ref_accuracy");
  m::Mean mean("ref_mean");
  m::PerplexityMetric ppl("ref_perplexity");
  m::FBetaScore fb_micro("ref_fbeta_micro", kC, kBeta, "micro", {1});
  m::FBetaScore fb_macro("ref_fbeta_macro", kC, kBeta, "macro", {1});
  m::MeanIOU miou("ref_miou", kC);
  m::DiceCoefficient dice("ref_dice", kC);
  m::MeanPerClassAccuracy mpca("ref_mpca", kC);
  std::map<std::string, std::unique_ptr<m::AUC>> aucs;
  for (std::string curve : {"ROC", "PR"})
    for (std::string sum : {"interpolation", "minoring", "majoring"})
      aucs["auc_" + curve + "_" + sum] =
          std::make_unique<m::AUC>("ref_auc_" + curve + sum, kThresholds, curve, sum);
  m::PrecisionAtK pk("ref_pk", kK);
  m::RecallAtK rk("ref_rk", kK);

  auto step = trace(
      [&](const Batch& b) {
        Tensor x = b.at("logits"), y = b.at("labels"), w = b.at("weights");
        Tensor pred = argmax(x, -1);
        acc.update(y, pred, w);
        mean.update(sum(x, {1}), w);
        ppl.update(y, cross_entropy(x, y, -100, 0.0, Reduction::Sum));
        fb_micro.update(y, x, w);  // scores: argmax inside
        fb_macro.update(y, pred, w);
        miou.update(y, pred, w);
        dice.update(y, pred, w);
        mpca.update(y, x, w);
        for (auto& [n, a] : aucs) a->update(b.at("binary"), b.at("probs"), w);
        pk.update(y, x, w);
        rk.update(y.reshape({kN, 1}), x, w);
        return acc.compute_tensor();
      },
      "eval_metrics_ref");
  json batches = json::array();
  for (int s = 0; s < kBatches; ++s) {
    const Data& d = data();
    step(Batch{{"logits", make_tensor(d.logits[s], {kN, kC}, DType::f32)},
               {"labels", make_tensor(d.labels[s], {kN}, DType::i64)},
               {"weights", make_tensor(d.weights[s], {kN}, DType::f32)},
               {"probs", make_tensor(d.probs[s], {kN}, DType::f32)},
               {"binary", make_tensor(d.binary[s], {kN}, DType::i32)}});
    batches.push_back(json{{"logits", d.logits[s]},
                           {"labels", d.labels[s]},
                           {"weights", d.weights[s]},
                           {"probs", d.probs[s]},
                           {"binary", d.binary[s]}});
  }
  std::map<std::string, double> got{{"accuracy", acc.compute()},
                                    {"mean", mean.compute()},
                                    {"perplexity", ppl.compute()},
                                    {"fbeta_micro", fb_micro.compute()},
                                    {"fbeta_macro", fb_macro.compute()},
                                    {"miou", miou.compute()},
                                    {"dice", dice.compute()},
                                    {"mpca", mpca.compute()},
                                    {"precision_at_k", pk.compute()},
                                    {"recall_at_k", rk.compute()}};
  for (auto& [n, a] : aucs) got[n] = a->compute();

  auto dir = make_temp_dir("ref_metrics");
  auto in = dir / "metrics_in.json", out = dir / "metrics_out.json";
  write_json(in, json{{"batches", batches},
                      {"num_classes", kC},
                      {"k", kK},
                      {"num_thresholds", kThresholds},
                      {"beta", kBeta},
                      {"ignore_labels", {1}}});
  std::string log;
  int rc = run_reference_script("metrics_reference.py", {in.string(), out.string()}, &log);
  ASSERT_EQ(rc, 0) << log;
  json want = read_json(out);
  ASSERT_EQ(want.size(), got.size()) << want.dump();
  for (auto& [n, v] : got) {
    ASSERT_TRUE(want.contains(n)) << n;
    double w = want[n].get<double>();
    EXPECT_NEAR(v, w, kRelTol * (1 + std::fabs(w))) << n;
    // The data are not degenerate: every metric is strictly inside (0, its maximum).
    EXPECT_GT(w, 0.0) << n;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cstorch::reftest
