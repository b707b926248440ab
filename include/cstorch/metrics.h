// cstorch::metrics: evaluation metrics that accumulate inside the (traced) step.
//
//   cs::metrics::AccuracyMetric accuracy("accuracy");
//   auto eval_step = cs::trace([&](const cs::Batch& b) {
//     auto logits = model(b.at("x"));
//     accuracy.update(b.at("y"), cs::argmax(logits, -1));   // records into the step
//     return cs::nn::functional::cross_entropy(logits, b.at("y"));
//   });
//   for (...) eval_step(batch);
//   double acc = accuracy.compute();   // waits for the queued steps, then reads the state
//
// Every metric keeps its running totals in small persistent f32 state tensors, created eagerly
// when the metric is constructed (even if that happens while a step is being traced).
// update() uses tensor ops only and updates the state with in-place ops (add_), so inside
// cstorch::trace it records state writes of the compiled step and every replay accumulates —
// what `compute_on_system` asks for. Outside a trace update() runs eagerly with the same result.
// compute() reads the state on the host (synchronising first; an error inside a traced step:
// use a step closure); compute_tensor() returns the value as a 0-d f32 tensor built from the
// state with tensor ops (usable anywhere). reset() zeroes the state.
//
// Shapes and dtypes are checked in update() (both eagerly and while tracing) and a mismatch is
// a cstorch::Error that names the metric, its name, the argument and the shapes/dtypes.
// Values (class ids out of range) cannot be checked while tracing without a host branch, so
// metrics over class ids count out-of-range ids (with non-zero weight) in a state tensor and
// compute() fails naming how many there were.
//
// Counts are accumulated in f32: exact up to 2^24 (16,777,216) per accumulator.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cstorch/state.h"
#include "cstorch/tensor.h"

namespace cstorch::metrics {

// Base of every metric. Metrics are registered by name while they live (see live_metrics());
// they are neither copyable nor movable because the registry refers to them.
class Metric {
 public:
  // `kind` is the class name used in messages ("AccuracyMetric"). A name already used by a
  // live metric gets the suffix "_1", "_2", ... (the first free one); name() tells which.
  Metric(std::string kind, std::string name);
  virtual ~Metric();
  Metric(const Metric&) = delete;
  Metric& operator=(const Metric&) = delete;

  const std::string& name() const { return name_; }
  // The name the metric was created with, before any suffix made it unique.
  const std::string& base_name() const { return base_name_; }
  const std::string& kind() const { return kind_; }

  // The metric's value as a 0-d f32 tensor computed from the state with tensor ops.
  virtual Tensor compute_tensor() const = 0;
  // The metric's value on the host. Waits for queued steps; throws if the state shows invalid
  // input (out-of-range class ids) or when called inside a traced step.
  virtual double compute() const;
  explicit operator double() const { return compute(); }
  // Zeroes every state tensor (eagerly, or as state writes inside a trace).
  void reset();

  // The state tensors by name ("total_correct", "confusion_matrix", ...), for checkpoints.
  State state_dict() const;
  // Copies values into the state tensors; every key must be present with the same shape.
  void load_state_dict(const State& s);
  const std::vector<std::pair<std::string, Tensor>>& states() const { return states_; }

 protected:
  // A persistent zero f32 state tensor, created eagerly even inside a trace. The returned
  // handle shares its value with the registered one.
  Tensor add_state(const std::string& name, const Shape& shape);
  // "AccuracyMetric 'accuracy'.update" for messages.
  std::string context(const char* fn) const;
  // Checks shared by update()s: exact shape equality and dtype classes.
  void check_same_shape(const char* a_name, const Tensor& a, const char* b_name,
                        const Tensor& b) const;
  void check_integer(const char* arg, const Tensor& t) const;  // i32/i64/bool
  void check_floating(const char* arg, const Tensor& t) const;
  void check_defined(const char* arg, const Tensor& t) const;
  // Weights as f32 with `like`'s shape: ones when undefined, else shape-checked.
  // Also moves the states to `like`'s device (they are made on the CPU; an update with data on
  // another device moves them there once).
  Tensor weights_or_ones(const Tensor& weights, const Tensor& like, const char* like_name) const;
  // Moves the states to device d, eagerly even inside a trace. Every update() calls it (or
  // weights_or_ones) before its first in-place add, so the accumulators never mix devices.
  void place_states(Device d) const;
  // like.numel() as a 0-d f32 tensor on like's device: the weight of an unweighted update.
  static Tensor count_of(const Tensor& like);
  // Fails when an "invalid ids" state tensor is non-zero.
  void check_no_invalid(const Tensor& invalid, const char* what) const;

 private:
  std::string kind_, name_, base_name_;
  std::vector<std::pair<std::string, Tensor>> states_;
};

// ---------------------------------------------------------------------------------------------
// Accuracy = Σ (labels == predictions) · weight / Σ weight  (weights default to 1).
// labels and predictions: integer or bool tensors of the same shape; weights: same shape,
// any numeric dtype (bool masks allowed). An empty total gives NaN (0/0), as Cerebras.
class AccuracyMetric : public Metric {
 public:
  explicit AccuracyMetric(std::string name = "accuracy");
  void update(const Tensor& labels, const Tensor& predictions, const Tensor& weights = Tensor());
  void operator()(const Tensor& labels, const Tensor& predictions,
                  const Tensor& weights = Tensor()) {
    update(labels, predictions, weights);
  }
  Tensor compute_tensor() const override;

 private:
  Tensor total_correct_, total_weight_;
};

// Perplexity = exp(Σ loss / Σ tokens). `loss` is the batch's loss SUMMED over its tokens (a
// 0-d floating tensor, e.g. cross_entropy(..., Reduction::Sum)); the token count is
// labels.numel() without weights, else Σ weights (weights with the labels' shape).
class PerplexityMetric : public Metric {
 public:
  explicit PerplexityMetric(std::string name = "perplexity");
  void update(const Tensor& labels, const Tensor& loss, const Tensor& weights = Tensor());
  void operator()(const Tensor& labels, const Tensor& loss, const Tensor& weights = Tensor()) {
    update(labels, loss, weights);
  }
  Tensor compute_tensor() const override;

 private:
  Tensor total_loss_, total_tokens_;
};

// Weighted mean of all values seen: Σ value · weight / Σ weight. weights (optional) must have
// the values' shape. Values must be floating.
class MeanMetric : public Metric {
 public:
  explicit MeanMetric(std::string name = "mean");
  void update(const Tensor& values, const Tensor& weights = Tensor());
  void operator()(const Tensor& values, const Tensor& weights = Tensor()) {
    update(values, weights);
  }
  Tensor compute_tensor() const override;

 private:
  Tensor total_, weight_;
};
using Mean = MeanMetric;

// Base of the metrics built on a num_classes × num_classes confusion matrix
// cm[label][prediction] (weighted counts). update(labels, predictions, weights):
// - labels: integer class ids of any shape;
// - predictions: integer class ids of the labels' shape, or floating scores with one more
//   trailing dim of size num_classes (the argmax is taken);
// - weights (optional): the labels' shape; weight 0 ignores an element (e.g. padding).
// Ids outside [0, num_classes) with non-zero weight make compute() fail.
class ConfusionMatrixMetric : public Metric {
 public:
  ConfusionMatrixMetric(std::string kind, std::string name, int64_t num_classes);
  void update(const Tensor& labels, const Tensor& predictions, const Tensor& weights = Tensor());
  void operator()(const Tensor& labels, const Tensor& predictions,
                  const Tensor& weights = Tensor()) {
    update(labels, predictions, weights);
  }
  double compute() const override;
  int64_t num_classes() const { return num_classes_; }
  // The accumulated confusion matrix (f32 [num_classes, num_classes]).
  const Tensor& confusion_matrix() const { return cm_; }

 protected:
  int64_t num_classes_;
  Tensor cm_, invalid_;
};

// F-beta = (1 + β²) · P · R / (β² · P + R), over the classes not in `ignore_labels`:
// - "micro": P = Σ TP / Σ (TP + FP), R = Σ TP / Σ (TP + FN) over those classes;
// - "macro": the per-class F-beta (0 where its P + R is 0 or undefined) averaged over them.
// TP_c = cm[c][c], FP_c = Σ_l cm[l][c] − TP_c, FN_c = Σ_p cm[c][p] − TP_c. A 0/0 is 0.
class FBetaScore : public ConfusionMatrixMetric {
 public:
  FBetaScore(std::string name, int64_t num_classes, double beta = 1.0,
             std::string average_type = "micro", std::vector<int64_t> ignore_labels = {});
  Tensor compute_tensor() const override;

 private:
  double beta_;
  std::string average_;
  Tensor keep_;  // f32 [num_classes]: 1 for classes that count
};

// Mean IoU (as tf.metrics.mean_iou): IoU_c = TP_c / (TP_c + FP_c + FN_c), averaged over the
// classes whose denominator is non-zero (0 when none is).
class MeanIOU : public ConfusionMatrixMetric {
 public:
  MeanIOU(std::string name, int64_t num_classes);
  Tensor compute_tensor() const override;
};

// Dice coefficient: Dice_c = 2·TP_c / (2·TP_c + FP_c + FN_c), averaged over the classes whose
// denominator is non-zero (0 when none is).
class DiceCoefficient : public ConfusionMatrixMetric {
 public:
  DiceCoefficient(std::string name, int64_t num_classes);
  Tensor compute_tensor() const override;
};

// Mean per-class accuracy (as tf.metrics.mean_per_class_accuracy): per class c,
// TP_c / Σ_p cm[c][p] (0 for a class never seen as a label), averaged over all num_classes.
class MeanPerClassAccuracy : public ConfusionMatrixMetric {
 public:
  MeanPerClassAccuracy(std::string name, int64_t num_classes);
  Tensor compute_tensor() const override;
};

// Area under the ROC or PR curve from thresholded confusion counts (as tf.metrics.auc):
// thresholds t_0 = −1e-7, t_i = i / (num_thresholds − 1) for i = 1 … num_thresholds − 2,
// t_last = 1 + 1e-7; a prediction p counts as positive at t when p > t.
// update(labels, predictions, weights): labels bool/integer (non-zero = positive) and
// predictions floating probabilities in [0, 1], same shape; weights optional, same shape.
// With ε = 1e-7: ROC: x = FP/(FP+TN+ε), y = TP/(TP+FN+ε); PR: x = TP/(TP+FN+ε),
// y = (TP+ε)/(TP+FP+ε). summation_method "interpolation" (trapezoids, the default),
// "minoring" (left Riemann of min), "majoring" (max); TF's "careful_interpolation" is not
// supported (an error).
class AUC : public Metric {
 public:
  AUC(std::string name, int64_t num_thresholds = 200, std::string curve = "ROC",
      std::string summation_method = "interpolation");
  void update(const Tensor& labels, const Tensor& predictions, const Tensor& weights = Tensor());
  void operator()(const Tensor& labels, const Tensor& predictions,
                  const Tensor& weights = Tensor()) {
    update(labels, predictions, weights);
  }
  Tensor compute_tensor() const override;
  const std::vector<double>& thresholds() const { return thresholds_; }

 private:
  std::vector<double> thresholds_;
  std::string curve_, summation_;
  Tensor thr_;  // f32 [T, 1]
  Tensor tp_, fp_, tn_, fn_;
};

// Precision@k and recall@k over the top-k predictions (as tf.metrics.precision_at_k /
// recall_at_k with sparse labels). update(labels, predictions, weights):
// - predictions: finite floating scores [N, C] (C ≥ k); the top k classes of each row are
//   those of rank < k, the rank of class c being #{j: s_j > s_c} + #{j < c: s_j = s_c} (ties
//   go to the lower class id, so exactly k are chosen);
// - labels: integer class ids [N] or [N, L] (a set per row; duplicates count once); negative
//   ids are padding and ignored; ids ≥ C are never retrieved but count as relevant (as TF);
// - weights (optional): floating or bool [N], one per row.
// hits_n = |top-k_n ∩ labels_n|. Precision@k = Σ w·hits / Σ w·k; Recall@k = Σ w·hits /
// Σ w·|labels_n|.
class TopKMetric : public Metric {
 public:
  TopKMetric(std::string kind, std::string name, int64_t k);
  void update(const Tensor& labels, const Tensor& predictions, const Tensor& weights = Tensor());
  void operator()(const Tensor& labels, const Tensor& predictions,
                  const Tensor& weights = Tensor()) {
    update(labels, predictions, weights);
  }
  int64_t k() const { return k_; }

 protected:
  int64_t k_;
  Tensor hits_, retrieved_, relevant_;
};

class PrecisionAtK : public TopKMetric {
 public:
  PrecisionAtK(std::string name, int64_t k);
  Tensor compute_tensor() const override;
};

class RecallAtK : public TopKMetric {
 public:
  RecallAtK(std::string name, int64_t k);
  Tensor compute_tensor() const override;
};

// ---------------------------------------------------------------------------------------------
// Registry of live metrics (process-wide, thread-safe), in creation order. A Trainer logs the
// metrics its model created while it was built (under their base names), so two Trainers in
// one process each report their own.
std::vector<Metric*> live_metrics();
// The live metric called `name`, or nullptr.
Metric* find_metric(const std::string& name);
// compute() of every live metric by name (synchronises once); then resets them if `reset`.
std::map<std::string, double> compute_all(bool reset = true);
void reset_all();

}  // namespace cstorch::metrics
