// T5 v1.0 (registered as model "t5"): an encoder-decoder with pre-norm RMS layer norms, no
// biases anywhere, attention WITHOUT the 1/sqrt(d) scaling (T5 folds it into the query's
// initialisation), a bucketed relative position bias computed by the first layer of each
// stack and shared by the others (bidirectional in the encoder, causal in the decoder, none in
// cross-attention), ReLU FFNs, final RMS norms, dropout after the embeddings, on each branch,
// inside the FFN, on the attention probabilities and after the final norms, and the output
// projection tied to the shared embedding with the decoder output rescaled by d_model^-0.5.
// The span-corruption objective comes from the data (sentinel ids in input_ids and labels).
//
// Parameter names follow Hugging Face's T5ForConditionalGeneration, so its weights load by
// name (its aliases encoder.embed_tokens / decoder.embed_tokens / lm_head of the tied
// embedding are not separate keys here):
//   shared.weight;
//   {encoder,decoder}.block.{i}.layer.0.SelfAttention.{q,k,v,o}.weight,
//   {encoder,decoder}.block.0.layer.0.SelfAttention.relative_attention_bias.weight,
//   {encoder,decoder}.block.{i}.layer.0.layer_norm.weight,
//   decoder.block.{i}.layer.1.EncDecAttention.{q,k,v,o}.weight, decoder.block.{i}.layer.1.
//   layer_norm.weight, encoder.block.{i}.layer.1 / decoder.block.{i}.layer.2 .DenseReluDense.
//   {wi,wo}.weight and .layer_norm.weight, {encoder,decoder}.final_layer_norm.weight;
//   lm_head.weight when share_embedding_weights is false; encoder_embed_tokens.weight and
//   decoder_embed_tokens.weight instead of shared.weight when
//   share_encoder_decoder_embedding is false.
//
// Batch and loss: see models/seq2seq/seq2seq.h. In eval mode the loss also updates
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

namespace modelzoo::t5 {

struct T5Config {
  int64_t src_vocab_size = 32128;
  int64_t tgt_vocab_size = 32128;
  int64_t d_model = 512;
  int64_t d_kv = 64;  // width of one head's queries, keys and values
  int64_t d_ff = 2048;
  int64_t num_heads = 8;
  int64_t encoder_num_hidden_layers = 6;
  int64_t decoder_num_hidden_layers = 6;
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  // T5 has no absolute positions; these bound the lengths the model accepts.
  int64_t src_max_position_embeddings = 512;
  int64_t tgt_max_position_embeddings = 512;
  double dropout_rate = 0.1;
  double layer_norm_epsilon = 1e-6;
  double initializer_factor = 1.0;  // scales every initial standard deviation (HF's factor)
  double label_smoothing = 0.0;
  bool share_encoder_decoder_embedding = true;  // one embedding for both stacks
  bool share_embedding_weights = true;          // tied head (with the d_model^-0.5 rescale)

  // t5-small: the defaults (60,506,624 parameters).
  static T5Config small();
  // 2 + 2 layers, d_model 32, 4 heads of d_kv 16 (inner width 64 != d_model), d_ff 64,
  // vocab 128, 32 buckets up to distance 128, 64 positions, no dropout.
  static T5Config tiny();
  // From the model's YAML arguments (the fields above; vocab_size sets both vocabularies,
  // max_position_embeddings both lengths; encoder_nonlinearity / decoder_nonlinearity must be
  // "relu" and position_embedding_type "relative" when given, as T5 v1.0 has). Unknown keys,
  // sizes < 1, too few buckets, rates outside [0, 1) and a shared embedding over different
  // vocabularies are errors naming the key path.
  static T5Config from(const ConfigView& a);
  int64_t num_parameters() const;  // tied tensors counted once, without building the model
};

// T5's attention: q, k, v [H*d_kv, d_model] and o [d_model, H*d_kv] without biases; scores
// q.k without scaling plus the position bias; the first self-attention layer of a stack owns
// relative_attention_bias.
class T5AttentionImpl : public cstorch::nn::Module {
 public:
  // Module's single-tensor forward stays visible (it fails, naming this module): the
  // forward below has another signature and would otherwise hide it.
  using cstorch::nn::Module::forward;
  T5AttentionImpl(const T5Config& c, bool has_relative_bias, bool bidirectional);
  // x [B, Tq, d_model] attends to kv [B, Tk, d_model] (x itself for self-attention).
  cstorch::Tensor forward(const cstorch::Tensor& x, const cstorch::Tensor& kv,
                          const cstorch::nn::AttentionMasks& masks);
  // The [1, H, Tq, Tk] bias of this layer's relative_attention_bias (error when it has none).
  cstorch::Tensor position_bias(int64_t q_len, int64_t k_len);

  cstorch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr};

 private:
  int64_t heads_;
  double dropout_;
  cstorch::nn::RelativePositionBias rel_{nullptr};
};
CSTORCH_MODULE(T5Attention);

class T5Model : public seq2seq::Seq2SeqModel {
 public:
  explicit T5Model(const T5Config& c);
  // Encoder output [B, S, d_model] (after the final norm and dropout); attention_mask may be
  // undefined (no padding).
  cstorch::Tensor encode(const cstorch::Tensor& input_ids, const cstorch::Tensor& attention_mask);
  // Decoder output [B, T, d_model] (after the final norm and dropout, before the rescale).
  cstorch::Tensor decode(const cstorch::Tensor& decoder_input_ids,
                         const cstorch::Tensor& decoder_attention_mask,
                         const cstorch::Tensor& memory, const cstorch::Tensor& attention_mask);
  const T5Config& config() const { return c_; }

 private:
  struct Block {
    T5Attention self_attn{nullptr}, cross_attn{nullptr};
    cstorch::nn::RMSNorm self_norm{nullptr}, cross_norm{nullptr}, ff_norm{nullptr};
    cstorch::nn::Linear wi{nullptr}, wo{nullptr};
  };
  struct Stack {
    std::vector<Block> blocks;
    cstorch::nn::RMSNorm final_norm{nullptr};
  };
  Stack build_stack(const char* name, bool decoder);
  cstorch::Tensor run_stack(Stack& s, cstorch::Tensor x, const cstorch::Tensor& self_key_mask,
                            bool causal, const cstorch::Tensor& memory,
                            const cstorch::Tensor& memory_key_mask);
  cstorch::Tensor logits_of(const seq2seq::Seq2SeqBatch& b) override;

  T5Config c_;
  cstorch::nn::Embedding src_emb_{nullptr}, tgt_emb_{nullptr};
  cstorch::nn::Dropout drop_{nullptr};
  Stack encoder_, decoder_;
  cstorch::nn::Linear lm_head_{nullptr};
};

}  // namespace modelzoo::t5
