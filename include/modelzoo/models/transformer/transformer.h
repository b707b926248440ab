// The Transformer of "Attention Is All You Need" (registered as model "transformer"): an
// encoder-decoder with token embeddings scaled by sqrt(d_model), fixed sinusoidal positions,
// dropout on the embedding sums, post-norm layers (torch.nn.TransformerEncoderLayer /
// TransformerDecoderLayer with ReLU FFNs), no final norm, and a pre-softmax projection that
// is tied to the target embedding (optional). Source and target may share one embedding.
//
// Parameter names: shared embeddings: embedding.weight; separate: encoder_embedding.weight and
// decoder_embedding.weight; encoder.layers.{i}.* and decoder.layers.{i}.* (torch.nn's
// TransformerEncoderLayer / TransformerDecoderLayer names); untied head: lm_head.weight (no
// bias). The positions are a constant (not in the state_dict).
//
// Batch and loss: see models/seq2seq/seq2seq.h. Decoder self-attention is causal and masks
// padded target keys (decoder_attention_mask); encoder self-attention and cross-attention mask
// padded source keys (attention_mask). In eval mode the loss also updates
// "eval/lm_perplexity" and "eval/accuracy".
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "cstorch/metrics.h"
#include "cstorch/nn/transformer.h"
#include "modelzoo/config_view.h"
#include "modelzoo/model.h"
#include "modelzoo/models/seq2seq/seq2seq.h"

namespace modelzoo::transformer {

struct TransformerConfig {
  int64_t src_vocab_size = 37000;
  int64_t tgt_vocab_size = 37000;
  int64_t d_model = 512;  // also read as hidden_size
  int64_t num_heads = 8;
  int64_t encoder_num_hidden_layers = 6;
  int64_t decoder_num_hidden_layers = 6;
  int64_t d_ff = 2048;  // also read as filter_size
  int64_t src_max_position_embeddings = 256;
  int64_t tgt_max_position_embeddings = 256;
  double dropout_rate = 0.1;            // embeddings, residual branches and the FFN inner
  double attention_dropout_rate = 0.0;  // attention probabilities (the paper uses none)
  double layer_norm_epsilon = 1e-6;
  double label_smoothing = 0.1;  // epsilon_ls of the paper
  // One embedding for source and target tokens (needs src_vocab_size == tgt_vocab_size).
  bool share_encoder_decoder_embedding = true;
  // The pre-softmax projection is the target embedding's transpose.
  bool share_embedding_weights = true;
  bool recompute = false;  // activation recomputation: each layer re-runs in the backward pass

  // Transformer base (Table 3): 6 + 6 layers, d_model 512, 8 heads, d_ff 2048, dropout 0.1,
  // label smoothing 0.1, a shared 37000-token BPE vocabulary, all three embeddings tied.
  static TransformerConfig base();
  // 2 + 2 layers, d_model 32, 4 heads, d_ff 64, shared vocab 128, 64 positions, no dropout or
  // smoothing.
  static TransformerConfig tiny();
  // From the model's YAML arguments. Keys: the fields above; vocab_size sets both vocabularies
  // and max_position_embeddings both lengths (the specific keys win). Unknown keys, sizes < 1,
  // heads not dividing d_model, odd d_model, rates outside [0, 1), label_smoothing outside
  // [0, 1], and shared embeddings over different vocabularies are errors naming the key path.
  static TransformerConfig from(const ConfigView& a);
  // Trainable parameters (tied tensors counted once), without building the model.
  int64_t num_parameters() const;
};

class TransformerModel : public seq2seq::Seq2SeqModel {
 public:
  explicit TransformerModel(const TransformerConfig& c);
  // Encoder output [B, S, E] of input_ids [B, S] (attention_mask [B, S], 1 = real, may be
  // undefined = no padding).
  cstorch::Tensor encode(const cstorch::Tensor& input_ids, const cstorch::Tensor& attention_mask);
  // Decoder output [B, T, E] (before the projection).
  cstorch::Tensor decode(const cstorch::Tensor& decoder_input_ids,
                         const cstorch::Tensor& decoder_attention_mask,
                         const cstorch::Tensor& memory, const cstorch::Tensor& attention_mask);
  const TransformerConfig& config() const { return c_; }

 private:
  cstorch::Tensor logits_of(const seq2seq::Seq2SeqBatch& b) override;
  cstorch::Tensor embed(cstorch::nn::Embedding& emb, const cstorch::Tensor& ids);

  TransformerConfig c_;
  cstorch::nn::Embedding src_emb_{nullptr}, tgt_emb_{nullptr};
  cstorch::nn::SinusoidalPositionEmbedding pe_{nullptr};
  cstorch::nn::Dropout drop_{nullptr};
  std::vector<std::shared_ptr<cstorch::nn::TransformerEncoderLayerImpl>> enc_;
  std::vector<std::shared_ptr<cstorch::nn::TransformerDecoderLayerImpl>> dec_;
  cstorch::nn::Linear lm_head_{nullptr};
};

}  // namespace modelzoo::transformer
