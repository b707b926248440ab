// cstorch::metrics: hand-computed values, traced updates over several replays agreeing with
// eager updates, reset/state_dict, the live-metric registry, and input errors. The PyTorch
// comparison over random data is tests/reference/test_metrics_reference.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include <cstorch/cstorch.h>
#include <cstorch/metrics.h>

#include "unit/test_util.h"

namespace cs = cstorch;
namespace m = cstorch::metrics;
using cs::Tensor;
using namespace cs::testing;

namespace {

Tensor i32(std::vector<int32_t> v, cs::Shape s) {
  return cs::from_vector(v, s);
}

}  // namespace

TEST(Metrics, AccuracyHandComputed) {
  m::AccuracyMetric acc("acc_hand");
  acc.update(iv({1, 2, 3, 4}), iv({1, 0, 3, 0}));  // 2 of 4
  EXPECT_DOUBLE_EQ(acc.compute(), 0.5);
  acc.update(iv({5, 5}), iv({5, 5}), fv({2, 0}));  // +2 correct of weight 2
  EXPECT_FLOAT_EQ(acc.compute(), 4.0 / 6.0);       // an f32 division of the f32 totals
  EXPECT_FLOAT_EQ(static_cast<double>(acc), 4.0 / 6.0);
  acc.reset();
  EXPECT_TRUE(std::isnan(acc.compute()));  // 0 / 0 after a reset, as Cerebras
  // int32 predictions (`.int()` in Python) against int64 labels, bool weights as a mask.
  acc.update(iv({1, 2, 3}), i32({1, 2, 0}, {3}), bv({1, 0, 1}));
  EXPECT_DOUBLE_EQ(acc.compute(), 0.5);
}

// compute() inside a traced step names the metric and the way out (the error was item()'s,
// naming an op of the metric's arithmetic).
TEST(Metrics, ComputeInsideATracedStepNamesTheMetric) {
  m::AccuracyMetric acc("acc_in_trace");
  auto step = cs::trace([&](const Tensor& labels) {
    acc.update(labels, labels);
    (void)acc.compute();
    return labels * 1;
  });
  expect_error(
      [&] {
        step(iv({1, 2}));
      },
      {"metric 'acc_in_trace': compute() inside a traced step", "compute_tensor()"});
}

TEST(Metrics, PerplexityAndMeanHandComputed) {
  m::PerplexityMetric ppl("ppl_hand");
  ppl.update(iv({1, 2, 3, 4}), cs::scalar_tensor(4.0));
  ppl.update(iv({1, 2}, {1, 2}), cs::scalar_tensor(3.0), fv({1, 0}, {1, 2}));
  EXPECT_NEAR(ppl.compute(), std::exp(7.0 / 5.0), 1e-5 * std::exp(1.4));
  m::Mean mean("mean_hand");
  mean.update(fv({1, 2, 3}));
  mean.update(fv({10, 20}), fv({1, 3}));
  EXPECT_NEAR(mean.compute(), (6.0 + 70.0) / 7.0, 1e-5);
}

// A 3-class confusion matrix: labels / predictions chosen so every class has TP, FP and FN.
TEST(Metrics, ConfusionMatrixMetricsHandComputed) {
  Tensor labels = iv({0, 0, 0, 1, 1, 2, 2, 2, 2});
  Tensor preds = iv({0, 0, 1, 1, 2, 2, 2, 0, 1});
  // cm[l][p]: row0 = {2,1,0}, row1 = {0,1,1}, row2 = {1,1,2}
  // tp = {2,1,2}, row = {3,2,4}, col = {3,3,3}
  m::MeanIOU miou("miou_hand", 3);
  m::DiceCoefficient dice("dice_hand", 3);
  m::MeanPerClassAccuracy mpca("mpca_hand", 3);
  m::FBetaScore f1_micro("f1_micro_hand", 3);
  m::FBetaScore f2_macro("f2_macro_hand", 3, 2.0, "macro");
  m::FBetaScore f1_ignore("f1_ignore_hand", 3, 1.0, "micro", {2});
  for (m::ConfusionMatrixMetric* mt : std::initializer_list<m::ConfusionMatrixMetric*>{
           &miou, &dice, &mpca, &f1_micro, &f2_macro, &f1_ignore})
    mt->update(labels, preds);
  EXPECT_EQ(miou.confusion_matrix().to_vector<float>(), (F{2, 1, 0, 0, 1, 1, 1, 1, 2}));
  double tp[3] = {2, 1, 2}, row[3] = {3, 2, 4}, col[3] = {3, 3, 3};
  double iou = 0, dc = 0, pca = 0, f2 = 0;
  for (int c = 0; c < 3; ++c) {
    iou += tp[c] / (row[c] + col[c] - tp[c]) / 3;
    dc += 2 * tp[c] / (row[c] + col[c]) / 3;
    pca += tp[c] / row[c] / 3;
    double p = tp[c] / col[c], r = tp[c] / row[c];
    f2 += 5 * p * r / (4 * p + r) / 3;
  }
  EXPECT_NEAR(miou.compute(), iou, 1e-6);
  EXPECT_NEAR(dice.compute(), dc, 1e-6);
  EXPECT_NEAR(mpca.compute(), pca, 1e-6);
  EXPECT_NEAR(f1_micro.compute(), 5.0 / 9.0, 1e-6);  // micro P = R = 5/9
  EXPECT_NEAR(f2_macro.compute(), f2, 1e-6);
  // Without class 2: TP = 3, P = 3/6, R = 3/5.
  EXPECT_NEAR(f1_ignore.compute(), 2 * 0.5 * 0.6 / 1.1, 1e-6);
}

TEST(Metrics, ConfusionMatrixTakesScoresAndSkipsAbsentClasses) {
  m::MeanIOU miou("miou_scores", 4);
  m::MeanPerClassAccuracy mpca("mpca_scores", 4);
  // Scores [3, 4]: argmax 1, 1, 0. Class 2 and 3 never appear.
  Tensor scores = fv({0, 5, 1, 1, 0.1f, 0.9f, 0, 0, 3, 2, 1, 0}, {3, 4});
  Tensor labels = iv({1, 0, 0});
  miou.update(labels, scores);
  mpca.update(labels, scores);
  // cm row0 = {1,1,0,0}, row1 = {0,1,0,0}; IoU0 = 1/2, IoU1 = 1/2; 2 valid classes.
  EXPECT_NEAR(miou.compute(), 0.5, 1e-6);
  // Per-class accuracy {1/2, 1, 0, 0} averaged over all 4 classes (TF's definition).
  EXPECT_NEAR(mpca.compute(), 1.5 / 4, 1e-6);
}

TEST(Metrics, AUCHandComputed) {
  // Perfect ranking: ROC AUC ~ 1; reversed: ~ 0; with 3 thresholds (0, 0.5, 1) a coarse curve.
  m::AUC perfect("auc_perfect", 200);
  perfect.update(iv({0, 0, 1, 1}), fv({0.1f, 0.2f, 0.8f, 0.9f}));
  EXPECT_NEAR(perfect.compute(), 1.0, 1e-5);
  m::AUC reversed("auc_reversed", 200);
  reversed.update(bv({1, 1, 0, 0}), fv({0.1f, 0.2f, 0.8f, 0.9f}));
  EXPECT_NEAR(reversed.compute(), 0.0, 1e-5);
  m::AUC coarse("auc_coarse", 3);
  EXPECT_EQ(coarse.thresholds().size(), 3u);
  coarse.update(iv({0, 1, 0, 1}), fv({0.2f, 0.7f, 0.6f, 0.4f}));
  // Thresholds -1e-7, 0.5, 1+1e-7: (fpr, tpr) = (1, 1), (1/2, 1/2), (0, 0) -> area 0.5.
  EXPECT_NEAR(coarse.compute(), 0.5, 1e-6);
}

TEST(Metrics, PrecisionRecallAtKHandComputed) {
  m::PrecisionAtK p2("p_at_2", 2);
  m::RecallAtK r2("r_at_2", 2);
  Tensor scores = fv({0.1f, 0.5f, 0.3f, 0.2f,   // top2 = {1, 2}
                      0.9f, 0.1f, 0.9f, 0.0f},  // tie: top2 = {0, 2}
                     {2, 4});
  // Row 0 labels {2, 3, -1 (padding)}: 1 hit of 2 relevant. Row 1 labels {0, 0, 7 (>= C)}:
  // 1 hit (0 counts once), relevant = {0} plus the out-of-range 7 = 2.
  Tensor labels = iv({2, 3, -1, 0, 0, 7}, {2, 3});
  p2.update(labels, scores);
  r2.update(labels, scores);
  EXPECT_NEAR(p2.compute(), 2.0 / 4.0, 1e-6);
  EXPECT_NEAR(r2.compute(), 2.0 / 4.0, 1e-6);
  // Weights per row, 1-d labels.
  p2.reset();
  r2.reset();
  p2.update(iv({1, 3}), scores, fv({1, 3}));  // hits: row0 1, row1 0
  r2.update(iv({1, 3}), scores, fv({1, 3}));
  EXPECT_NEAR(p2.compute(), 1.0 / 8.0, 1e-6);
  EXPECT_NEAR(r2.compute(), 1.0 / 4.0, 1e-6);
}

// Updates recorded in a traced eval step accumulate over replays exactly as eager updates do.
TEST(Metrics, TracedUpdatesMatchEagerOverReplays) {
  constexpr int kSteps = 5, kN = 12, kC = 4;
  struct Set {
    m::AccuracyMetric acc;
    m::PerplexityMetric ppl;
    m::Mean mean;
    m::FBetaScore fbeta;
    m::MeanIOU miou;
    m::DiceCoefficient dice;
    m::MeanPerClassAccuracy mpca;
    m::AUC auc;
    m::PrecisionAtK pk;
    m::RecallAtK rk;
    explicit Set(const std::string& p)
        : acc(p + "acc"),
          ppl(p + "ppl"),
          mean(p + "mean"),
          fbeta(p + "fbeta", kC, 0.5, "macro"),
          miou(p + "miou", kC),
          dice(p + "dice", kC),
          mpca(p + "mpca", kC),
          auc(p + "auc", 50),
          pk(p + "pk", 2),
          rk(p + "rk", 2) {}
    std::vector<m::Metric*> all() {
      return {&acc, &ppl, &mean, &fbeta, &miou, &dice, &mpca, &auc, &pk, &rk};
    }
    void update(const cs::Batch& b) {
      Tensor logits = b.at("x"), y = b.at("y"), w = b.at("w");
      Tensor pred = cs::argmax(logits, -1);
      acc.update(y, pred, w);
      ppl.update(y, cs::cross_entropy(logits, y, -100, 0.0, cs::Reduction::Sum));
      mean.update(cs::sum(logits, {1}), w);
      fbeta.update(y, logits);
      miou.update(y, pred, w);
      dice.update(y, pred);
      mpca.update(y, pred);
      Tensor prob = cs::slice(cs::softmax(logits, 1), 1, 1, 2).reshape({kN});
      auc.update(y == 1.0, prob, w);
      pk.update(y, logits, w);
      rk.update(y, logits);
    }
  };
  Set eager("eager_"), traced("traced_");
  int body_runs = 0;
  auto step = cs::trace(
      [&](const cs::Batch& b) {
        ++body_runs;
        traced.update(b);
      },
      "eval_metrics");
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int64_t> y(kN);
    for (int i = 0; i < kN; ++i) y[i] = (i * 7 + s * 3) % kC;
    cs::Batch b{
        {"x", rt({kN, kC}, 100 + s, -2, 2)}, {"y", iv(y, {kN})}, {"w", rt({kN}, 200 + s, 0, 1)}};
    step(b);
    eager.update(b);
  }
  EXPECT_EQ(body_runs, 1);
  auto e = eager.all(), t = traced.all();
  for (size_t i = 0; i < e.size(); ++i) {
    double want = e[i]->compute();
    EXPECT_TRUE(std::isfinite(want)) << e[i]->name();
    EXPECT_NEAR(t[i]->compute(), want, 1e-5 * (1 + std::fabs(want))) << t[i]->name();
  }
  // The accumulators are the compiled step's state: a reset between replays starts afresh.
  traced.acc.reset();
  EXPECT_TRUE(std::isnan(traced.acc.compute()));
  cs::Batch b{{"x", fv({0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0,
                        0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1},
                       {kN, kC})},
              {"y", iv({1, 0, 2, 3, 0, 1, 2, 3, 0, 1, 2, 0}, {kN})},
              {"w", fv(F(kN, 1.0f), {kN})}};
  step(b);
  EXPECT_NEAR(traced.acc.compute(), 11.0 / 12.0, 1e-6);
}

TEST(Metrics, StateDictRoundTrip) {
  m::MeanIOU a("miou_sd_a", 3), b("miou_sd_b", 3);
  a.update(iv({0, 1, 2, 2}), iv({0, 2, 2, 1}));
  b.load_state_dict(a.state_dict());
  EXPECT_DOUBLE_EQ(b.compute(), a.compute());
  EXPECT_EQ(a.state_dict().keys(), (std::vector<std::string>{"confusion_matrix", "num_invalid"}));
  m::MeanIOU c("miou_sd_c", 4);
  EXPECT_ERROR(c.load_state_dict(a.state_dict()), "MeanIOU 'miou_sd_c'.load_state_dict",
               "confusion_matrix", "[3, 3]", "[4, 4]");
  m::AccuracyMetric d("acc_sd");
  EXPECT_ERROR(d.load_state_dict(a.state_dict()), "key 'total_correct' is missing");
}

TEST(Metrics, RegistryListsLiveMetricsAndComputesAll) {
  auto count = m::live_metrics().size();
  {
    m::AccuracyMetric a("reg_acc");
    m::AccuracyMetric a2("reg_acc");  // same name: suffixed
    m::Mean mean("reg_mean");
    EXPECT_EQ(a2.name(), "reg_acc_1");
    EXPECT_EQ(m::live_metrics().size(), count + 3);
    EXPECT_EQ(m::find_metric("reg_acc_1"), &a2);
    EXPECT_EQ(m::find_metric("reg_mean"), &mean);
    a.update(iv({1, 2}), iv({1, 1}));
    a2.update(iv({1}), iv({1}));
    mean.update(fv({2, 4}));
    // Only these have values: compute the live set restricted to them.
    auto all = m::compute_all(/*reset=*/true);
    EXPECT_DOUBLE_EQ(all.at("reg_acc"), 0.5);
    EXPECT_DOUBLE_EQ(all.at("reg_acc_1"), 1.0);
    EXPECT_DOUBLE_EQ(all.at("reg_mean"), 3.0);
    EXPECT_TRUE(std::isnan(a.compute()));  // reset by compute_all
  }
  EXPECT_EQ(m::live_metrics().size(), count);
  EXPECT_EQ(m::find_metric("reg_acc"), nullptr);
}

TEST(Metrics, ConstructedInsideATraceKeepsPersistentState) {
  std::unique_ptr<m::Mean> mean;
  auto step = cs::trace([&](const Tensor& x) {
    if (!mean) mean = std::make_unique<m::Mean>("mean_in_trace");
    mean->update(x);
  });
  step(fv({1, 2}));
  step(fv({3, 6}));
  EXPECT_DOUBLE_EQ(mean->compute(), 3.0);
}

TEST(Metrics, BadInputErrors) {
  m::AccuracyMetric acc("acc_err");
  EXPECT_ERROR(acc.update(iv({1, 2}), iv({1, 2, 3})), "AccuracyMetric 'acc_err'.update",
               "labels shape [2]", "predictions shape [3]");
  EXPECT_ERROR(acc.update(iv({1, 2}), fv({1, 2})), "AccuracyMetric 'acc_err'.update",
               "predictions must hold integer class ids", "f32");
  EXPECT_ERROR(acc.update(iv({1, 2}), iv({1, 2}), fv({1, 2, 3})), "weights shape [3]",
               "labels shape [2]");
  EXPECT_ERROR(acc.update(Tensor(), iv({1})), "labels is an undefined tensor");

  m::PerplexityMetric ppl("ppl_err");
  EXPECT_ERROR(ppl.update(iv({1, 2}), fv({1, 2})), "PerplexityMetric 'ppl_err'.update",
               "loss must be a 0-d tensor", "[2]");
  EXPECT_ERROR(ppl.update(iv({1, 2}), cs::scalar_tensor(1, cs::DType::i64)),
               "loss must be a floating", "i64");

  m::Mean mean("mean_err");
  EXPECT_ERROR(mean.update(iv({1, 2})), "MeanMetric 'mean_err'.update",
               "values must be a floating");

  m::MeanIOU miou("miou_err", 3);
  EXPECT_ERROR(miou.update(iv({1, 2}), fv({0, 1, 0, 0, 0, 1, 0, 0}, {2, 4})),
               "MeanIOU 'miou_err'.update", "num_classes mismatch", "4 scores", "num_classes 3");
  EXPECT_ERROR(miou.update(iv({1, 2}), fv({0, 1})), "floating predictions are scores", "[2, 3]");
  EXPECT_ERROR(miou.update(fv({1, 2}), iv({1, 2})), "labels must hold integer class ids");
  // Out-of-range ids cannot be checked while tracing: they are counted and compute() fails.
  miou.update(iv({0, 3, 1, -1}), iv({0, 1, 1, 1}), fv({1, 1, 1, 0}));  // -1 has weight 0
  EXPECT_ERROR(miou.compute(), "MeanIOU 'miou_err'.compute", "1 labels/predictions",
               "outside [0, num_classes)");
  miou.reset();
  miou.update(iv({0, 2}), iv({0, 1}));
  // Valid again after the reset: IoU = {1, 0, 0}, all three classes have a denominator.
  EXPECT_NEAR(miou.compute(), 1.0 / 3.0, 1e-6);

  EXPECT_ERROR(m::MeanIOU("miou_zero", 0), "num_classes must be at least 1");
  EXPECT_ERROR(m::FBetaScore("fb_avg", 3, 1.0, "weighted"), "average_type must be");
  EXPECT_ERROR(m::FBetaScore("fb_ign", 2, 1.0, "micro", {0, 1}), "leaves no class");
  EXPECT_ERROR(m::FBetaScore("fb_ign2", 2, 1.0, "micro", {5}), "ignore_labels entry 5");
  EXPECT_ERROR(m::AUC("auc_bad", 1), "num_thresholds must be greater than 1");
  EXPECT_ERROR(m::AUC("auc_bad", 10, "XY"), "curve must be");
  EXPECT_ERROR(m::AUC("auc_bad", 10, "PR", "careful_interpolation"), "not supported");
  m::AUC auc("auc_err");
  EXPECT_ERROR(auc.update(iv({0, 1}), iv({0, 1})), "AUC 'auc_err'.update",
               "predictions must be a floating");
  EXPECT_ERROR(auc.update(iv({0, 1}), fv({0.5f})), "labels shape [2]", "predictions shape [1]");

  m::PrecisionAtK pk("pk_err", 3);
  EXPECT_ERROR(pk.update(iv({0, 1}), fv({1, 2, 3, 4}, {2, 2})), "PrecisionAtK 'pk_err'.update",
               "k = 3 exceeds the 2 classes");
  EXPECT_ERROR(pk.update(iv({0, 1, 2}), fv({1, 2, 3, 4, 5, 6}, {2, 3})),
               "labels must have shape [N] or [N, L] with N = 2", "[3]");
  EXPECT_ERROR(pk.update(iv({0, 1}), fv({1, 2, 3, 4, 5, 6})),
               "predictions must be scores of shape [N, C]");
  EXPECT_ERROR(pk.update(iv({0, 1}), fv({1, 2, 3, 4, 5, 6}, {2, 3}), fv({1, 1, 1})),
               "weights must have shape [2]");
  EXPECT_ERROR(m::RecallAtK("rk_zero", 0), "k must be at least 1");
  EXPECT_ERROR(m::AccuracyMetric(""), "needs a non-empty name");
}

TEST(Metrics, ShapeErrorsAreRaisedWhileTracing) {
  m::AccuracyMetric acc("acc_trace_err");
  auto step = cs::trace([&](const Tensor& y, const Tensor& p) { acc.update(y, p); });
  EXPECT_ERROR(step(iv({1, 2}), iv({1, 2, 3})), "AccuracyMetric 'acc_trace_err'.update",
               "labels shape [2]");
}
