// Ratio metrics with two 0-d accumulators: accuracy, perplexity and the weighted mean.
#include "cstorch/metrics.h"

namespace cstorch::metrics {

AccuracyMetric::AccuracyMetric(std::string name) : Metric("AccuracyMetric", std::move(name)) {
  total_correct_ = add_state("total_correct", {});
  total_weight_ = add_state("total_weight", {});
}

void AccuracyMetric::update(const Tensor& labels, const Tensor& predictions,
                            const Tensor& weights) {
  check_defined("labels", labels);
  check_defined("predictions", predictions);
  check_integer("labels", labels);
  check_integer("predictions", predictions);
  check_same_shape("labels", labels, "predictions", predictions);
  place_states(labels.device());
  Tensor correct = cast(eq(labels, predictions), DType::f32);
  if (weights.defined()) {
    Tensor w = weights_or_ones(weights, labels, "labels");
    total_correct_.add_(sum(correct * w));
    total_weight_.add_(sum(w));
  } else {
    total_correct_.add_(sum(correct));
    total_weight_.add_(count_of(labels));
  }
}

Tensor AccuracyMetric::compute_tensor() const {
  return total_correct_ / total_weight_;
}

// ---------------------------------------------------------------------------------------------

PerplexityMetric::PerplexityMetric(std::string name) : Metric("PerplexityMetric", std::move(name)) {
  total_loss_ = add_state("total_loss", {});
  total_tokens_ = add_state("total_num_tokens", {});
}

void PerplexityMetric::update(const Tensor& labels, const Tensor& loss, const Tensor& weights) {
  check_defined("labels", labels);
  check_defined("loss", loss);
  check_floating("loss", loss);
  CS_CHECK(loss.dim() == 0,
           "{}: loss must be a 0-d tensor (the loss summed over the batch's tokens), got shape {}",
           context("update"), shape_str(loss.shape()));
  place_states(loss.device());
  total_loss_.add_(loss.to(DType::f32));
  if (weights.defined())
    total_tokens_.add_(sum(weights_or_ones(weights, labels, "labels")));
  else
    total_tokens_.add_(count_of(labels));
}

Tensor PerplexityMetric::compute_tensor() const {
  return exp(total_loss_ / total_tokens_);
}

// ---------------------------------------------------------------------------------------------

MeanMetric::MeanMetric(std::string name) : Metric("MeanMetric", std::move(name)) {
  total_ = add_state("total", {});
  weight_ = add_state("total_weight", {});
}

void MeanMetric::update(const Tensor& values, const Tensor& weights) {
  check_defined("values", values);
  check_floating("values", values);
  place_states(values.device());
  Tensor v = values.to(DType::f32);
  if (weights.defined()) {
    Tensor w = weights_or_ones(weights, values, "values");
    total_.add_(sum(v * w));
    weight_.add_(sum(w));
  } else {
    total_.add_(sum(v));
    weight_.add_(count_of(values));
  }
}

Tensor MeanMetric::compute_tensor() const {
  return total_ / weight_;
}

}  // namespace cstorch::metrics
