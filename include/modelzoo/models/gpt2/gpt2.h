// GPT-2 (registered as model "gpt2"): token + learned position embeddings, pre-norm decoder
// blocks (causal self-attention, GELU tanh FFN), final LayerNorm, LM head tied to the token
// embedding. Parameter names: wte.weight, wpe.weight, h.{i}.self_attn.in_proj_weight /
// in_proj_bias / out_proj.{weight,bias}, h.{i}.linear1/linear2.{weight,bias},
// h.{i}.norm1/norm2.{weight,bias}, ln_f.{weight,bias}.
//
// Batch keys: "input_ids" i32/i64 [B, T], "attention_mask" [B, T] (1 = token counted in the
// loss), "labels" [B, T]. Loss = sum_t CE_t * mask_t / sum_t mask_t. In eval mode it also
// updates the metrics "eval/lm_perplexity" and "eval/accuracy" (masked tokens).
#pragma once
#include <cstdint>
#include <vector>

#include "cstorch/metrics.h"
#include "cstorch/nn/transformer.h"
#include "modelzoo/config_view.h"
#include "modelzoo/model.h"

namespace modelzoo::gpt2 {

struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_heads = 12;
  int64_t max_position_embeddings = 1024;
  int64_t filter_size = 3072;  // FFN width
  double dropout_rate = 0.1;   // residual and FFN dropout
  double attention_dropout_rate = 0.1;
  double embedding_dropout_rate = 0.1;
  double layer_norm_epsilon = 1e-5;
  double initializer_range = 0.02;  // N(0, r) weights; residual projections r / sqrt(2 L)
  bool recompute = false;  // activation recomputation: each layer re-runs in the backward pass

  static GPT2Config small();  // GPT-2 small (124M): the defaults
  static GPT2Config tiny();   // 2 layers, width 64, 4 heads, vocab 256, 128 positions
  // From the model's YAML arguments (Model Zoo key names); unknown keys, non-positive sizes,
  // heads not dividing the width and rates outside [0, 1) are errors naming the key path.
  static GPT2Config from(const ConfigView& a);
  // Parameters of this configuration (tied head), computed without building the model.
  int64_t num_parameters() const;
};

// Cached keys and values per layer, for generation: logits(ids, &cache) appends the new
// positions; cache.length() positions are already seen.
struct KVCache {
  std::vector<cstorch::nn::KVCacheEntry> layers;
  int64_t length() const { return layers.empty() ? 0 : layers[0].length(); }
};

class GPT2Model : public Model {
 public:
  explicit GPT2Model(const GPT2Config& c);
  // input_ids [B, T] -> final hidden states [B, T, E] (after ln_f). With a cache, positions
  // start at cache->length(), attention also sees the cached positions, and the new keys and
  // values are appended. Errors: not [B, T] integers; positions past max_position_embeddings;
  // eagerly also a token id outside [0, vocab_size) (named with its position).
  cstorch::Tensor hidden(const cstorch::Tensor& input_ids, KVCache* cache = nullptr);
  // Next-token logits [B, T, vocab_size] (the tied head).
  cstorch::Tensor logits(const cstorch::Tensor& input_ids, KVCache* cache = nullptr);
  cstorch::Tensor loss(const cstorch::Batch& batch) override;
  double loss_weight(const cstorch::Batch& batch) const override;  // unmasked tokens
  // input_ids and labels (or -100) in the vocabulary, attention_mask 0 or 1.
  void check_batch_values(const cstorch::Batch& batch) const override;
  const GPT2Config& config() const { return c_; }

  cstorch::nn::Embedding wte{nullptr};
  cstorch::nn::LearnedPositionEmbedding wpe{nullptr};
  cstorch::nn::Dropout drop{nullptr};
  cstorch::nn::ModuleList h{nullptr};
  cstorch::nn::LayerNorm ln_f{nullptr};

 private:
  GPT2Config c_;
  std::vector<std::shared_ptr<cstorch::nn::TransformerEncoderLayerImpl>> layers_;
  std::shared_ptr<cstorch::metrics::PerplexityMetric> perplexity_;
  std::shared_ptr<cstorch::metrics::AccuracyMetric> accuracy_;
};

}  // namespace modelzoo::gpt2
