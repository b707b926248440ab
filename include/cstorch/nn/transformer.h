// Transformer building blocks: multi-head attention (self and cross), encoder and decoder
// layers (pre- and post-norm), learned and sinusoidal position embeddings, T5's RMS norm and
// bucketed relative position bias, tied input/output embeddings. Parameter names follow
// torch.nn (MultiheadAttention, TransformerEncoderLayer, TransformerDecoderLayer), so a
// torch.nn model's state_dict loads by name. Tensors are batch-first: [B, T, E].
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "cstorch/nn/functional.h"
#include "cstorch/nn/layers.h"

namespace cstorch::nn {

// What an attention call may mask or add, besides the inputs. All optional.
struct AttentionMasks {
  // [B, Tk]: nonzero / true = a real key that may be attended to (the HF / Model Zoo
  // "attention_mask" convention; torch.nn.MultiheadAttention's key_padding_mask is the
  // negation). Integer or bool.
  Tensor key_mask;
  // Causal self-attention: query i sees keys j <= i + causal_offset (see AttentionOptions).
  bool causal = false;
  int64_t causal_offset = 0;
  // bool (true = attend) or f32 additive, broadcastable to [B, H, Tq, Tk].
  Tensor attn_mask;
  // Additive f32 bias broadcastable to [B, H, Tq, Tk] (T5's relative position bias); gets a
  // gradient when it requires one.
  Tensor position_bias;
};

// The bool [B, 1, 1, Tk] attention mask (true = attend) of a [B, Tk] key mask (nonzero = real
// token). Error: not 2-d.
Tensor key_mask_to_attn_mask(const Tensor& key_mask);

// Multi-head attention on already projected tensors: q [B, Tq, H*D], k [B, Tk, H*D],
// v [B, Tk, H*Dv] -> [B, Tq, H*Dv], through the fused kernel without transposes (heads-last
// layout). `scale` defaults to 1/sqrt(D) (T5 passes 1). Errors: shapes, heads not dividing the
// width, masks as in scaled_dot_product_attention.
Tensor multi_head_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t num_heads,
                            const AttentionMasks& masks = {}, double dropout_p = 0,
                            std::optional<double> scale = std::nullopt);

struct MultiheadAttentionOptions {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  double dropout = 0;  // on the attention probabilities, in training mode
  bool bias = true;    // projection biases
  // Key / value input widths for cross-attention from a memory of another width (0 =
  // embed_dim). When either differs, the projections are q_proj_weight, k_proj_weight,
  // v_proj_weight (torch's naming) instead of one in_proj_weight [3E, E].
  int64_t kdim = 0, vdim = 0;
  std::optional<double> scale;  // default 1/sqrt(embed_dim / num_heads)
};

// Projected keys and values of the positions seen so far, for incremental decoding:
// [B, T_past, E] each (undefined = empty). forward_cached appends the new positions.
struct KVCacheEntry {
  Tensor k, v;
  int64_t length() const { return k.defined() ? k.size(1) : 0; }
};

// torch.nn.MultiheadAttention (batch_first): parameters in_proj_weight [3E, E] and
// in_proj_bias [3E] (or q/k/v_proj_weight), out_proj.weight [E, E], out_proj.bias [E], with
// torch's initialisation (xavier_uniform in-projection, zero biases).
class MultiheadAttentionImpl : public Module {
 public:
  MultiheadAttentionImpl(int64_t embed_dim, int64_t num_heads, double dropout = 0,
                         bool bias = true);
  explicit MultiheadAttentionImpl(const MultiheadAttentionOptions& o);
  // query [B, Tq, E]; key / value [B, Tk, kdim / vdim] (cross-attention: the memory; self:
  // the query again). Returns [B, Tq, E].
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const AttentionMasks& masks = {});
  // Self-attention without masks.
  Tensor forward(const Tensor& x) override { return forward(x, x, x); }
  // Self-attention of x [B, T, E] over the cached positions and x's own; appends x's keys and
  // values to `cache`. Causal decoding passes masks.causal with causal_offset = the cache
  // length before the call. Error: the cache's batch or width differs from x.
  Tensor forward_cached(const Tensor& x, KVCacheEntry& cache, const AttentionMasks& masks = {});

  Tensor in_proj_weight, in_proj_bias;                 // packed (kdim == vdim == E)
  Tensor q_proj_weight, k_proj_weight, v_proj_weight;  // separate (kdim or vdim differs)
  Linear out_proj{nullptr};
  const MultiheadAttentionOptions& options() const { return o_; }

 private:
  MultiheadAttentionOptions o_;
  bool packed_;
};
CSTORCH_MODULE(MultiheadAttention);

// "relu", "gelu" (erf) or "gelu_tanh"; anything else is an error naming the valid ones.
Tensor activation(const Tensor& x, const std::string& name);

struct TransformerLayerOptions {
  int64_t d_model = 512;
  int64_t nhead = 8;
  int64_t dim_feedforward = 2048;
  double dropout = 0.1;                     // residual and FFN dropout
  std::optional<double> attention_dropout;  // default: `dropout`
  std::string activation = "relu";          // "relu", "gelu", "gelu_tanh"
  double layer_norm_eps = 1e-5;
  bool norm_first = false;  // pre-norm (GPT-2) when true, post-norm (BERT, AIAYN) when false
  bool bias = true;
  // Activation recomputation: the layer's body is a cstorch::checkpoint scope (recompute.h).
  // Its intermediates are not kept for the backward pass, which re-runs the body from the
  // saved layer input (same dropout draws, bitwise the same gradients): about one extra
  // forward pass of compute for activation memory of one layer instead of all. Only when
  // grad is enabled and no KV cache is passed (decoding keeps nothing for a backward pass).
  bool recompute = false;
};

// torch.nn.TransformerEncoderLayer (batch_first): self_attn, linear1, dropout, linear2, norm1,
// norm2, dropout1, dropout2.
//   post-norm: x = norm1(x + drop1(sa(x)));  x = norm2(x + drop2(ff(x)))
//   pre-norm:  x = x + drop1(sa(norm1(x)));  x = x + drop2(ff(norm2(x)))
// with ff(x) = linear2(dropout(act(linear1(x)))).
class TransformerEncoderLayerImpl : public Module {
 public:
  explicit TransformerEncoderLayerImpl(const TransformerLayerOptions& o);
  // With a cache, self-attention also sees the cached positions and appends x's (decoding).
  Tensor forward(const Tensor& x, const AttentionMasks& masks, KVCacheEntry* cache = nullptr);
  Tensor forward(const Tensor& x) override { return forward(x, AttentionMasks{}); }

  MultiheadAttention self_attn{nullptr};
  Linear linear1{nullptr}, linear2{nullptr};
  LayerNorm norm1{nullptr}, norm2{nullptr};
  Dropout dropout{nullptr}, dropout1{nullptr}, dropout2{nullptr};

 private:
  Tensor body(const Tensor& x, const AttentionMasks& masks, KVCacheEntry* cache);
  Tensor ff(const Tensor& x);
  TransformerLayerOptions o_;
};
CSTORCH_MODULE(TransformerEncoderLayer);

// torch.nn.TransformerDecoderLayer (batch_first): self_attn, multihead_attn, linear1, dropout,
// linear2, norm1, norm2, norm3, dropout1..3. Self-attention takes `self_masks` (usually
// causal), cross-attention over `memory` [B, Ts, E] takes `memory_masks` (the source key mask).
class TransformerDecoderLayerImpl : public Module {
 public:
  // Module's single-tensor forward stays visible (it fails, naming this module): the
  // forward below has another signature and would otherwise hide it.
  using Module::forward;
  explicit TransformerDecoderLayerImpl(const TransformerLayerOptions& o);
  Tensor forward(const Tensor& x, const Tensor& memory, const AttentionMasks& self_masks,
                 const AttentionMasks& memory_masks);

  MultiheadAttention self_attn{nullptr}, multihead_attn{nullptr};
  Linear linear1{nullptr}, linear2{nullptr};
  LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  Dropout dropout{nullptr}, dropout1{nullptr}, dropout2{nullptr}, dropout3{nullptr};

 private:
  Tensor body(const Tensor& x, const Tensor& memory, const AttentionMasks& self_masks,
              const AttentionMasks& memory_masks);
  Tensor ff(const Tensor& x);
  TransformerLayerOptions o_;
};
CSTORCH_MODULE(TransformerDecoderLayer);

// Learned absolute positions: weight [max_positions, dim] ~ N(0, init_std).
class LearnedPositionEmbeddingImpl : public Module {
 public:
  // Module's single-tensor forward stays visible (it fails, naming this module): the
  // forward below has another signature and would otherwise hide it.
  using Module::forward;
  LearnedPositionEmbeddingImpl(int64_t max_positions, int64_t dim, double init_std = 0.02);
  // Embeddings of positions offset .. offset + seq_len - 1: [seq_len, dim]. Error: past
  // max_positions (names the length, offset and limit).
  Tensor forward(int64_t seq_len, int64_t offset = 0);
  Tensor weight;
  int64_t max_positions;
};
CSTORCH_MODULE(LearnedPositionEmbedding);

// "Attention Is All You Need" positions: PE[p, 2i] = sin(p / 10000^(2i/d)),
// PE[p, 2i+1] = cos(p / 10000^(2i/d)). A constant (no parameters, not in the state_dict);
// computed in double and rounded once. Errors: odd dim; past max_positions.
class SinusoidalPositionEmbeddingImpl : public Module {
 public:
  // Module's single-tensor forward stays visible (it fails, naming this module): the
  // forward below has another signature and would otherwise hide it.
  using Module::forward;
  SinusoidalPositionEmbeddingImpl(int64_t max_positions, int64_t dim);
  Tensor forward(int64_t seq_len, int64_t offset = 0);  // [seq_len, dim]
  const Tensor& table() const { return table_; }
  void to(Device d) override;  // moves the table too

 private:
  Tensor table_;
  int64_t max_positions_, dim_;
};
CSTORCH_MODULE(SinusoidalPositionEmbedding);

// T5's layer norm: y = weight * x / sqrt(mean(x^2) + eps) over the last dim, no mean
// subtraction, no bias, the variance in f32 (16-bit inputs are cast up; the result is cast to
// the input's dtype). weight: ones [dim].
class RMSNormImpl : public Module {
 public:
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  Tensor weight;

 private:
  int64_t dim_;
  double eps_;
};
CSTORCH_MODULE(RMSNorm);

// T5's bucket of a relative position (key position - query position), as HF's
// T5Attention._relative_position_bucket computes it (f32 log): exact buckets for small
// distances, logarithmic up to max_distance, the last bucket beyond; bidirectional halves the
// buckets between the two signs, causal maps all positive distances to bucket 0.
int64_t relative_position_bucket(int64_t relative_position, bool bidirectional,
                                 int64_t num_buckets = 32, int64_t max_distance = 128);

// T5 relative attention bias: relative_attention_bias.weight [num_buckets, num_heads]
// (an Embedding, HF's name). forward(Tq, Tk) -> [1, H, Tq, Tk] f32, to pass as
// AttentionMasks::position_bias; query i is at position query_offset + i (decoding with a
// cache), key j at j.
class RelativePositionBiasImpl : public Module {
 public:
  // Module's single-tensor forward stays visible (it fails, naming this module): the
  // forward below has another signature and would otherwise hide it.
  using Module::forward;
  RelativePositionBiasImpl(int64_t num_heads, bool bidirectional, int64_t num_buckets = 32,
                           int64_t max_distance = 128);
  Tensor forward(int64_t q_len, int64_t k_len, int64_t query_offset = 0);
  Embedding relative_attention_bias{nullptr};

 private:
  int64_t num_heads_, num_buckets_, max_distance_;
  bool bidirectional_;
};
CSTORCH_MODULE(RelativePositionBias);

// The tied output projection: logits = hidden @ embedding_weight^T (+ bias), the transpose
// folded into the GEMM. hidden [..., E], embedding_weight [V, E], bias [V] or undefined.
Tensor tied_logits(const Tensor& hidden, const Tensor& embedding_weight,
                   const Tensor& bias = Tensor());

}  // namespace cstorch::nn
