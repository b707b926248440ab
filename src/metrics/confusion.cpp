// Metrics over a weighted confusion matrix: FBetaScore, MeanIOU, DiceCoefficient and
// MeanPerClassAccuracy. update() builds one-hot rows for labels and predictions and adds
// labelsᵀ · predictions (one GEMM) to the matrix, so it is all tensor ops.
#include <algorithm>

#include "cstorch/metrics.h"
#include "metrics/util.h"

namespace cstorch::metrics {

using detail::safe_div;

ConfusionMatrixMetric::ConfusionMatrixMetric(std::string kind, std::string name,
                                             int64_t num_classes)
    : Metric(std::move(kind), std::move(name)), num_classes_(num_classes) {
  CS_CHECK(num_classes >= 1, "{}: num_classes must be at least 1, got {}", context("constructor"),
           num_classes);
  cm_ = add_state("confusion_matrix", {num_classes, num_classes});
  invalid_ = add_state("num_invalid", {});
}

void ConfusionMatrixMetric::update(const Tensor& labels, const Tensor& predictions,
                                   const Tensor& weights) {
  check_defined("labels", labels);
  check_defined("predictions", predictions);
  check_integer("labels", labels);
  const int64_t C = num_classes_;
  Tensor pred_ids;
  if (is_floating(predictions.dtype())) {
    // Scores: one more trailing dim of size num_classes.
    Shape lead(predictions.shape().begin(),
               predictions.shape().end() - std::min<int64_t>(1, predictions.dim()));
    CS_CHECK(predictions.dim() == labels.dim() + 1 && lead == labels.shape(),
             "{}: floating predictions are scores and need shape labels.shape + [num_classes] = "
             "{}, got {} (or pass integer class ids of the labels' shape)",
             context("update"), shape_str([&] {
               Shape s = labels.shape();
               s.push_back(C);
               return s;
             }()),
             shape_str(predictions.shape()));
    CS_CHECK(predictions.shape().back() == C,
             "{}: num_classes mismatch: predictions have {} scores in the last dim, the metric "
             "has num_classes {}",
             context("update"), predictions.shape().back(), C);
    pred_ids = argmax(predictions, -1);
  } else {
    check_integer("predictions", predictions);
    check_same_shape("labels", labels, "predictions", predictions);
    pred_ids = predictions;
  }
  Tensor w = weights_or_ones(weights, labels, "labels").reshape({-1, 1});
  Tensor l = labels.to(DType::i64).reshape({-1, 1});
  Tensor p = pred_ids.to(DType::i64).reshape({-1, 1});
  Tensor cls = arange(static_cast<double>(C), DType::i64, labels.device()).reshape({1, C});
  Tensor l_hot = cast(eq(l, cls), DType::f32) * w;  // [M, C], weighted
  Tensor p_hot = cast(eq(p, cls), DType::f32);      // [M, C]
  cm_.add_(matmul(l_hot.t(), p_hot));
  // Ids outside [0, C) match no column; count those that carry weight so compute() can say so.
  Tensor bad = logical_or(logical_or(l < 0.0, l >= static_cast<double>(C)),
                          logical_or(p < 0.0, p >= static_cast<double>(C)));
  invalid_.add_(sum(cast(logical_and(bad, abs(w) > 0.0), DType::f32)));
}

double ConfusionMatrixMetric::compute() const {
  check_no_invalid(invalid_, "labels/predictions (class ids outside [0, num_classes))");
  return Metric::compute();
}

namespace {
struct Counts {
  Tensor tp, row, col;  // [C]: diagonal, label totals (TP+FN), prediction totals (TP+FP)
};
Counts counts(const Tensor& cm) {
  int64_t C = cm.size(0);
  return {sum(cm * detail::eye(C), {1}), sum(cm, {1}), sum(cm, {0})};
}
}  // namespace

// ---------------------------------------------------------------------------------------------

FBetaScore::FBetaScore(std::string name, int64_t num_classes, double beta, std::string average_type,
                       std::vector<int64_t> ignore_labels)
    : ConfusionMatrixMetric("FBetaScore", std::move(name), num_classes),
      beta_(beta),
      average_(std::move(average_type)) {
  CS_CHECK(beta > 0, "{}: beta must be positive, got {}", context("constructor"), beta);
  CS_CHECK(average_ == "micro" || average_ == "macro",
           "{}: average_type must be \"micro\" or \"macro\", got \"{}\"", context("constructor"),
           average_);
  std::vector<float> keep(static_cast<size_t>(num_classes), 1.0f);
  for (int64_t c : ignore_labels) {
    CS_CHECK(c >= 0 && c < num_classes, "{}: ignore_labels entry {} is outside [0, {})",
             context("constructor"), c, num_classes);
    keep[static_cast<size_t>(c)] = 0.0f;
  }
  CS_CHECK(std::count(keep.begin(), keep.end(), 1.0f) > 0,
           "{}: ignore_labels leaves no class to score", context("constructor"));
  keep_ = from_vector(keep, {num_classes});
}

Tensor FBetaScore::compute_tensor() const {
  auto [tp, row, col] = counts(cm_);
  double b2 = beta_ * beta_;
  auto fbeta = [&](const Tensor& p, const Tensor& r) {
    return safe_div((1 + b2) * p * r, b2 * p + r);
  };
  if (average_ == "micro") {
    const Tensor keep = keep_.to(tp.device());
    Tensor t = sum(tp * keep);
    return fbeta(safe_div(t, sum(col * keep)), safe_div(t, sum(row * keep)));
  }
  Tensor f = fbeta(safe_div(tp, col), safe_div(tp, row));
  const Tensor keep = keep_.to(f.device());
  return sum(f * keep) / sum(keep);
}

MeanIOU::MeanIOU(std::string name, int64_t num_classes)
    : ConfusionMatrixMetric("MeanIOU", std::move(name), num_classes) {}

Tensor MeanIOU::compute_tensor() const {
  auto [tp, row, col] = counts(cm_);
  Tensor denom = row + col - tp;
  Tensor valid = cast(denom > 0.0, DType::f32);
  return safe_div(sum(safe_div(tp, denom)), sum(valid));
}

DiceCoefficient::DiceCoefficient(std::string name, int64_t num_classes)
    : ConfusionMatrixMetric("DiceCoefficient", std::move(name), num_classes) {}

Tensor DiceCoefficient::compute_tensor() const {
  auto [tp, row, col] = counts(cm_);
  Tensor denom = row + col;  // 2·TP + FP + FN
  Tensor valid = cast(denom > 0.0, DType::f32);
  return safe_div(sum(safe_div(2.0 * tp, denom)), sum(valid));
}

MeanPerClassAccuracy::MeanPerClassAccuracy(std::string name, int64_t num_classes)
    : ConfusionMatrixMetric("MeanPerClassAccuracy", std::move(name), num_classes) {}

Tensor MeanPerClassAccuracy::compute_tensor() const {
  auto [tp, row, col] = counts(cm_);
  return mean(safe_div(tp, row));
}

}  // namespace cstorch::metrics
