// Ranking metrics: AUC from thresholded confusion counts, and precision/recall at k.
#include <cmath>

#include "cstorch/metrics.h"
#include "metrics/util.h"

namespace cstorch::metrics {

using detail::safe_div;

AUC::AUC(std::string name, int64_t num_thresholds, std::string curve, std::string summation_method)
    : Metric("AUC", std::move(name)),
      curve_(std::move(curve)),
      summation_(std::move(summation_method)) {
  CS_CHECK(num_thresholds > 1, "{}: num_thresholds must be greater than 1, got {}",
           context("constructor"), num_thresholds);
  CS_CHECK(curve_ == "ROC" || curve_ == "PR", "{}: curve must be \"ROC\" or \"PR\", got \"{}\"",
           context("constructor"), curve_);
  CS_CHECK(summation_ != "careful_interpolation",
           "{}: summation_method \"careful_interpolation\" is not supported (use "
           "\"interpolation\", \"minoring\" or \"majoring\")",
           context("constructor"));
  CS_CHECK(summation_ == "interpolation" || summation_ == "minoring" || summation_ == "majoring",
           "{}: summation_method must be \"interpolation\", \"minoring\" or \"majoring\", got "
           "\"{}\"",
           context("constructor"), summation_);
  // As TF: the end thresholds sit just outside [0, 1] so p = 0 and p = 1 land on the right side.
  constexpr double kEps = 1e-7;
  thresholds_.push_back(-kEps);
  for (int64_t i = 1; i < num_thresholds - 1; ++i)
    thresholds_.push_back(static_cast<double>(i) / static_cast<double>(num_thresholds - 1));
  thresholds_.push_back(1.0 + kEps);
  std::vector<float> t(thresholds_.begin(), thresholds_.end());
  thr_ = from_vector(t, {num_thresholds, 1});
  tp_ = add_state("true_positives", {num_thresholds});
  fp_ = add_state("false_positives", {num_thresholds});
  tn_ = add_state("true_negatives", {num_thresholds});
  fn_ = add_state("false_negatives", {num_thresholds});
}

void AUC::update(const Tensor& labels, const Tensor& predictions, const Tensor& weights) {
  check_defined("labels", labels);
  check_defined("predictions", predictions);
  check_integer("labels", labels);
  check_floating("predictions", predictions);
  check_same_shape("labels", labels, "predictions", predictions);
  Tensor w = weights_or_ones(weights, labels, "labels").reshape({1, -1});
  Tensor pos = cast(abs(labels.to(DType::f32)) > 0.0, DType::f32).reshape({1, -1});
  Tensor pos_w = pos * w;
  Tensor neg_w = w - pos_w;
  Tensor above =
      cast(gt(predictions.to(DType::f32).reshape({1, -1}), thr_.to(predictions.device())),
           DType::f32);  // [T, M]
  Tensor tp = sum(above * pos_w, {1});
  Tensor fp = sum(above * neg_w, {1});
  tp_.add_(tp);
  fp_.add_(fp);
  fn_.add_(sum(pos_w) - tp);
  tn_.add_(sum(neg_w) - fp);
}

Tensor AUC::compute_tensor() const {
  constexpr double kEps = 1e-7;
  Tensor x, y;
  if (curve_ == "ROC") {
    x = fp_ / (fp_ + tn_ + kEps);
    y = tp_ / (tp_ + fn_ + kEps);
  } else {
    x = tp_ / (tp_ + fn_ + kEps);
    y = (tp_ + kEps) / (tp_ + fp_ + kEps);
  }
  int64_t T = x.size(0);
  Tensor dx = slice(x, 0, 0, T - 1) - slice(x, 0, 1, T);  // thresholds rise, so x falls
  Tensor y0 = slice(y, 0, 0, T - 1), y1 = slice(y, 0, 1, T);
  if (summation_ == "minoring") return sum(dx * minimum(y0, y1));
  if (summation_ == "majoring") return sum(dx * maximum(y0, y1));
  return sum(dx * (y0 + y1) * 0.5);
}

// ---------------------------------------------------------------------------------------------

TopKMetric::TopKMetric(std::string kind, std::string name, int64_t k)
    : Metric(std::move(kind), std::move(name)), k_(k) {
  CS_CHECK(k >= 1, "{}: k must be at least 1, got {}", context("constructor"), k);
  hits_ = add_state("true_positives", {});
  retrieved_ = add_state("num_retrieved", {});
  relevant_ = add_state("num_relevant", {});
}

void TopKMetric::update(const Tensor& labels, const Tensor& predictions, const Tensor& weights) {
  check_defined("labels", labels);
  check_defined("predictions", predictions);
  check_integer("labels", labels);
  check_floating("predictions", predictions);
  CS_CHECK(predictions.dim() == 2, "{}: predictions must be scores of shape [N, C], got {}",
           context("update"), shape_str(predictions.shape()));
  const int64_t N = predictions.size(0), C = predictions.size(1);
  CS_CHECK(k_ <= C, "{}: k = {} exceeds the {} classes in predictions {}", context("update"), k_, C,
           shape_str(predictions.shape()));
  CS_CHECK((labels.dim() == 1 || labels.dim() == 2) && labels.size(0) == N,
           "{}: labels must have shape [N] or [N, L] with N = {} (the rows of predictions {}), "
           "got {}",
           context("update"), N, shape_str(predictions.shape()), shape_str(labels.shape()));
  Tensor w;
  if (weights.defined()) {
    CS_CHECK(weights.shape() == Shape{N}, "{}: weights must have shape [{}] (one per row), got {}",
             context("update"), N, shape_str(weights.shape()));
    w = weights.to(DType::f32);
  } else {
    w = ones({N}, DType::f32, predictions.device());
  }
  place_states(predictions.device());
  // Top k by repeated argmax: argmax returns the first maximum, so ties go to the lower id.
  Tensor cls = arange(static_cast<double>(C), DType::i64, predictions.device()).reshape({1, C});
  Tensor s = predictions.to(DType::f32);
  Tensor chosen = zeros({N, C}, DType::f32, predictions.device());
  for (int64_t i = 0; i < k_; ++i) {
    Tensor pick = cast(eq(argmax(s, 1, true), cls), DType::f32);  // [N, C] one-hot
    chosen = chosen + pick;
    s = where(pick > 0.0, -INFINITY, s);
  }
  Tensor lab = labels.to(DType::i64).reshape({N, -1});                               // [N, L]
  Tensor rel = amax(cast(eq(lab.unsqueeze(2), cls.unsqueeze(0)), DType::f32), {1});  // [N, C]
  Tensor beyond = sum(cast(lab >= static_cast<double>(C), DType::f32), {1});         // [N]
  Tensor hits = sum(chosen * rel, {1});
  hits_.add_(sum(hits * w));
  retrieved_.add_(sum(w) * static_cast<double>(k_));
  relevant_.add_(sum((sum(rel, {1}) + beyond) * w));
}

PrecisionAtK::PrecisionAtK(std::string name, int64_t k)
    : TopKMetric("PrecisionAtK", std::move(name), k) {}

Tensor PrecisionAtK::compute_tensor() const {
  return safe_div(hits_, retrieved_);
}

RecallAtK::RecallAtK(std::string name, int64_t k) : TopKMetric("RecallAtK", std::move(name), k) {}

Tensor RecallAtK::compute_tensor() const {
  return safe_div(hits_, relevant_);
}

}  // namespace cstorch::metrics
