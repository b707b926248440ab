// BERT (registered as model "bert"): token + segment + learned position embeddings with
// LayerNorm, post-norm encoder layers (GELU erf), pooler (dense + tanh on the first token),
// MLM head (dense + GELU + LayerNorm + decoder tied to the word embeddings, with its own bias)
// and NSP head (2-way). Parameter names (HF-like at the top, torch.nn inside the layers):
//   embeddings.{word_embeddings,position_embeddings,token_type_embeddings}.weight,
//   embeddings.LayerNorm.{weight,bias}, encoder.layers.{i}.(TransformerEncoderLayer names),
//   pooler.dense.{weight,bias}, cls.predictions.transform.dense.{weight,bias},
//   cls.predictions.transform.LayerNorm.{weight,bias}, cls.predictions.bias,
//   cls.seq_relationship.{weight,bias}.
//
// Batch keys: "input_ids", "attention_mask" (1 = real token), "token_type_ids", "mlm_labels"
// (-100 where not predicted), all [B, T]; "next_sentence_label" [B]. Loss = mean MLM CE over
// the predicted positions + mean NSP CE. In eval mode it updates "eval/masked_lm_accuracy",
// "eval/mlm_perplexity" and "eval/nsp_accuracy".
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "cstorch/metrics.h"
#include "cstorch/nn/transformer.h"
#include "modelzoo/config_view.h"
#include "modelzoo/model.h"

namespace modelzoo::bert {

struct BertConfig {
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_heads = 12;
  int64_t filter_size = 3072;
  int64_t max_position_embeddings = 512;
  int64_t num_segments = 2;  // type_vocab_size
  double dropout_rate = 0.1;
  double attention_dropout_rate = 0.1;
  double layer_norm_epsilon = 1e-12;
  double initializer_range = 0.02;
  bool disable_nsp = false;  // no pooler / NSP head, loss = MLM only
  bool recompute = false;    // activation recomputation: each layer re-runs in the backward pass

  static BertConfig base();  // BERT base: the defaults
  static BertConfig tiny();  // 2 layers, width 64, 4 heads, vocab 512, 128 positions
  static BertConfig from(const ConfigView& a);
  // Parameters: the encoder with its pooler (BertModel: 109,482,240 for base) ...
  int64_t num_backbone_parameters() const;
  // ... and with the MLM transform, decoder bias and NSP head (110,106,428 for base).
  int64_t num_parameters() const;
};

class BertModel : public Model {
 public:
  explicit BertModel(const BertConfig& c);
  // Final hidden states [B, T, E]. token_type_ids / attention_mask may be undefined (segment
  // 0, no padding). Errors: shapes; length past max_position_embeddings; eagerly also ids
  // outside the vocabulary or segment range.
  cstorch::Tensor encode(const cstorch::Tensor& input_ids, const cstorch::Tensor& token_type_ids,
                         const cstorch::Tensor& attention_mask);
  cstorch::Tensor mlm_logits(const cstorch::Tensor& hidden);  // [B, T, V]
  cstorch::Tensor nsp_logits(const cstorch::Tensor& hidden);  // [B, 2]
  cstorch::Tensor loss(const cstorch::Batch& batch) override;
  // With disable_nsp, the loss is the mean over the masked tokens: their count (so eval/loss is
  // the mean over every masked token at any batch size). With the next-sentence loss added,
  // the batch's samples (the sum of two means has no exact weight).
  double loss_weight(const cstorch::Batch& batch) const override;
  // Ids in their vocabularies (input_ids, token_type_ids; mlm_labels or -100), attention_mask 0
  // or 1, next_sentence_label 0 or 1 (with NSP).
  void check_batch_values(const cstorch::Batch& batch) const override;
  const BertConfig& config() const { return c_; }

 private:
  BertConfig c_;
  cstorch::nn::Embedding word_{nullptr}, type_{nullptr};
  cstorch::nn::LearnedPositionEmbedding pos_{nullptr};
  cstorch::nn::LayerNorm emb_ln_{nullptr}, mlm_ln_{nullptr};
  cstorch::nn::Dropout emb_drop_{nullptr};
  std::vector<std::shared_ptr<cstorch::nn::TransformerEncoderLayerImpl>> layers_;
  cstorch::nn::Linear pooler_{nullptr}, mlm_dense_{nullptr}, nsp_{nullptr};
  cstorch::Tensor mlm_bias_;
  std::shared_ptr<cstorch::metrics::AccuracyMetric> mlm_acc_, nsp_acc_;
  std::shared_ptr<cstorch::metrics::PerplexityMetric> mlm_ppl_;
};

}  // namespace modelzoo::bert
