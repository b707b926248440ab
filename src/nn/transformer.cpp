// Transformer building blocks (include/cstorch/nn/transformer.h).
#include "cstorch/nn/transformer.h"

#include <cmath>

#include "amp/autocast_state.h"
#include "core/internal.h"
#include "cstorch/recompute.h"

namespace cstorch::nn {

namespace F = functional;

Tensor key_mask_to_attn_mask(const Tensor& key_mask) {
  CS_CHECK(key_mask.defined() && key_mask.dim() == 2,
           "attention: key_mask must be [B, Tk] (nonzero = real token), got shape {}",
           key_mask.defined() ? shape_str(key_mask.shape()) : std::string("undefined"));
  Tensor m =
      key_mask.dtype() == DType::boolean ? key_mask : ne(key_mask, zeros({}, key_mask.dtype()));
  return reshape(m, {key_mask.size(0), 1, 1, key_mask.size(1)});
}

Tensor multi_head_attention(const Tensor& q, const Tensor& k, const Tensor& v, int64_t num_heads,
                            const AttentionMasks& masks, double dropout_p,
                            std::optional<double> scale) {
  const char* op = "multi_head_attention";
  CS_CHECK(q.defined() && k.defined() && v.defined(), "{}: q, k or v is undefined", op);
  CS_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
           "{}: q, k, v must be [B, T, H*D], got {}, {}, {}", op, shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()));
  CS_CHECK(num_heads > 0 && q.size(2) % num_heads == 0 && k.size(2) == q.size(2) &&
               v.size(2) % num_heads == 0,
           "{}: {} heads do not divide the widths of q {}, k {}, v {} (q and k must be equally "
           "wide)",
           op, num_heads, shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape()));
  CS_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0) && k.size(1) == v.size(1),
           "{}: batch or key lengths differ: q {}, k {}, v {}", op, shape_str(q.shape()),
           shape_str(k.shape()), shape_str(v.shape()));
  const int64_t B = q.size(0), Tq = q.size(1), Tk = k.size(1), H = num_heads;
  const int64_t D = q.size(2) / H, Dv = v.size(2) / H;
  F::AttentionOptions o;
  o.heads_last = true;
  o.dropout_p = dropout_p;
  o.is_causal = masks.causal;
  o.causal_offset = masks.causal_offset;
  o.scale = scale;
  o.bias = masks.position_bias;
  Tensor mask;
  if (masks.key_mask.defined()) {
    CS_CHECK(
        masks.key_mask.dim() == 2 && masks.key_mask.size(0) == B && masks.key_mask.size(1) == Tk,
        "{}: key_mask has shape {} but keys are [B, Tk] = [{}, {}]", op,
        shape_str(masks.key_mask.shape()), B, Tk);
    mask = key_mask_to_attn_mask(masks.key_mask);
  }
  if (masks.attn_mask.defined()) {
    if (masks.attn_mask.dtype() == DType::boolean && mask.defined()) {
      mask = logical_and(mask, masks.attn_mask);
    } else if (masks.attn_mask.dtype() == DType::boolean) {
      mask = masks.attn_mask;
    } else {
      o.bias = o.bias.defined() ? add(o.bias, masks.attn_mask) : masks.attn_mask;
    }
  }
  o.attn_mask = mask;
  Tensor out = F::scaled_dot_product_attention(reshape(q, {B, Tq, H, D}), reshape(k, {B, Tk, H, D}),
                                               reshape(v, {B, Tk, H, Dv}), o);
  return reshape(out, {B, Tq, H * Dv});
}

// ---------------------------------------------------------------------------------------------
MultiheadAttentionImpl::MultiheadAttentionImpl(int64_t embed_dim, int64_t num_heads, double dropout,
                                               bool bias)
    : MultiheadAttentionImpl(MultiheadAttentionOptions{embed_dim, num_heads, dropout, bias}) {}

MultiheadAttentionImpl::MultiheadAttentionImpl(const MultiheadAttentionOptions& o)
    : Module("MultiheadAttention"), o_(o) {
  const int64_t E = o.embed_dim;
  CS_CHECK(E > 0 && o.num_heads > 0 && E % o.num_heads == 0,
           "MultiheadAttention: embed_dim {} must be a positive multiple of num_heads {}", E,
           o.num_heads);
  CS_CHECK(o.dropout >= 0 && o.dropout < 1, "MultiheadAttention: dropout must be in [0, 1), got {}",
           o.dropout);
  if (o_.kdim == 0) o_.kdim = E;
  if (o_.vdim == 0) o_.vdim = E;
  packed_ = o_.kdim == E && o_.vdim == E;
  if (packed_) {
    Tensor w = zeros({3 * E, E});
    init::xavier_uniform_(w);
    in_proj_weight = register_parameter("in_proj_weight", w);
  } else {
    Tensor wq = zeros({E, E}), wk = zeros({E, o_.kdim}), wv = zeros({E, o_.vdim});
    init::xavier_uniform_(wq);
    init::xavier_uniform_(wk);
    init::xavier_uniform_(wv);
    q_proj_weight = register_parameter("q_proj_weight", wq);
    k_proj_weight = register_parameter("k_proj_weight", wk);
    v_proj_weight = register_parameter("v_proj_weight", wv);
  }
  if (o.bias) in_proj_bias = register_parameter("in_proj_bias", zeros({3 * E}));
  out_proj = Linear(E, E, o.bias);
  if (o.bias) init::zeros_(out_proj->bias);
  register_module("out_proj", out_proj.ptr());
}

Tensor MultiheadAttentionImpl::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                       const AttentionMasks& masks) {
  const int64_t E = o_.embed_dim;
  CS_CHECK(query.defined() && key.defined() && value.defined(),
           "MultiheadAttention: query, key or value is undefined");
  CS_CHECK(query.dim() == 3 && query.size(2) == E && key.dim() == 3 && key.size(2) == o_.kdim &&
               value.dim() == 3 && value.size(2) == o_.vdim,
           "MultiheadAttention(embed_dim={}, kdim={}, vdim={}): expected query [B, Tq, {}], key "
           "[B, Tk, {}], value [B, Tk, {}], got {}, {}, {}",
           E, o_.kdim, o_.vdim, E, o_.kdim, o_.vdim, shape_str(query.shape()),
           shape_str(key.shape()), shape_str(value.shape()));
  auto part = [&](const Tensor& t, int64_t i) {
    return t.defined() ? slice(t, 0, i * E, (i + 1) * E) : Tensor();
  };
  Tensor q, k, v;
  const bool self = query.impl() == key.impl() && key.impl() == value.impl();
  if (packed_ && self) {
    // One GEMM for the three projections, then the three column blocks.
    Tensor qkv = linear(query, in_proj_weight, in_proj_bias);
    q = slice(qkv, 2, 0, E);
    k = slice(qkv, 2, E, 2 * E);
    v = slice(qkv, 2, 2 * E, 3 * E);
  } else if (packed_) {
    q = linear(query, part(in_proj_weight, 0), part(in_proj_bias, 0));
    if (key.impl() == value.impl()) {
      Tensor kv = linear(key, slice(in_proj_weight, 0, E, 3 * E),
                         in_proj_bias.defined() ? slice(in_proj_bias, 0, E, 3 * E) : Tensor());
      k = slice(kv, 2, 0, E);
      v = slice(kv, 2, E, 2 * E);
    } else {
      k = linear(key, part(in_proj_weight, 1), part(in_proj_bias, 1));
      v = linear(value, part(in_proj_weight, 2), part(in_proj_bias, 2));
    }
  } else {
    q = linear(query, q_proj_weight, part(in_proj_bias, 0));
    k = linear(key, k_proj_weight, part(in_proj_bias, 1));
    v = linear(value, v_proj_weight, part(in_proj_bias, 2));
  }
  Tensor a = multi_head_attention(q, k, v, o_.num_heads, masks, is_training() ? o_.dropout : 0.0,
                                  o_.scale);
  return out_proj(a);
}

Tensor MultiheadAttentionImpl::forward_cached(const Tensor& x, KVCacheEntry& cache,
                                              const AttentionMasks& masks) {
  const int64_t E = o_.embed_dim;
  CS_CHECK(packed_,
           "MultiheadAttention::forward_cached: self-attention only (kdim == vdim == "
           "embed_dim)");
  CS_CHECK(x.defined() && x.dim() == 3 && x.size(2) == E,
           "MultiheadAttention::forward_cached: x must be [B, T, {}], got {}", E,
           x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  if (cache.k.defined())
    CS_CHECK(cache.k.dim() == 3 && cache.k.size(0) == x.size(0) && cache.k.size(2) == E &&
                 cache.v.defined() && cache.v.shape() == cache.k.shape(),
             "MultiheadAttention::forward_cached: cache keys {} / values {} do not match x {}",
             shape_str(cache.k.shape()),
             cache.v.defined() ? shape_str(cache.v.shape()) : std::string("undefined"),
             shape_str(x.shape()));
  Tensor qkv = linear(x, in_proj_weight, in_proj_bias);
  Tensor q = slice(qkv, 2, 0, E);
  Tensor k = slice(qkv, 2, E, 2 * E);
  Tensor v = slice(qkv, 2, 2 * E, 3 * E);
  if (cache.k.defined()) {
    k = cat({cache.k, k}, 1);
    v = cat({cache.v, v}, 1);
  }
  cache.k = k;
  cache.v = v;
  Tensor a = multi_head_attention(q, k, v, o_.num_heads, masks, is_training() ? o_.dropout : 0.0,
                                  o_.scale);
  return out_proj(a);
}

// ---------------------------------------------------------------------------------------------
Tensor activation(const Tensor& x, const std::string& name) {
  if (name == "relu") return relu(x);
  if (name == "gelu") return gelu(x, false);
  if (name == "gelu_tanh" || name == "gelu_new") return gelu(x, true);
  fail("activation: unknown activation '{}' (valid: relu, gelu, gelu_tanh)", name);
}

namespace {
void check_layer_options(const TransformerLayerOptions& o, const char* who) {
  CS_CHECK(o.d_model > 0 && o.nhead > 0 && o.d_model % o.nhead == 0,
           "{}: d_model {} must be a positive multiple of nhead {}", who, o.d_model, o.nhead);
  CS_CHECK(o.dim_feedforward > 0, "{}: dim_feedforward must be positive, got {}", who,
           o.dim_feedforward);
  CS_CHECK(o.dropout >= 0 && o.dropout < 1, "{}: dropout must be in [0, 1), got {}", who,
           o.dropout);
  (void)activation(zeros({1}), o.activation);  // validates the name
}

MultiheadAttention make_attention(const TransformerLayerOptions& o) {
  MultiheadAttentionOptions m;
  m.embed_dim = o.d_model;
  m.num_heads = o.nhead;
  m.dropout = o.attention_dropout ? *o.attention_dropout : o.dropout;
  m.bias = o.bias;
  return MultiheadAttention(m);
}
}  // namespace

TransformerEncoderLayerImpl::TransformerEncoderLayerImpl(const TransformerLayerOptions& o)
    : Module("TransformerEncoderLayer"), o_(o) {
  check_layer_options(o, "TransformerEncoderLayer");
  self_attn = make_attention(o);
  register_module("self_attn", self_attn.ptr());
  linear1 = Linear(o.d_model, o.dim_feedforward, o.bias);
  register_module("linear1", linear1.ptr());
  dropout = Dropout(o.dropout);
  register_module("dropout", dropout.ptr());
  linear2 = Linear(o.dim_feedforward, o.d_model, o.bias);
  register_module("linear2", linear2.ptr());
  norm1 = LayerNorm(Shape{o.d_model}, o.layer_norm_eps);
  register_module("norm1", norm1.ptr());
  norm2 = LayerNorm(Shape{o.d_model}, o.layer_norm_eps);
  register_module("norm2", norm2.ptr());
  dropout1 = Dropout(o.dropout);
  register_module("dropout1", dropout1.ptr());
  dropout2 = Dropout(o.dropout);
  register_module("dropout2", dropout2.ptr());
}

Tensor TransformerEncoderLayerImpl::ff(const Tensor& x) {
  return linear2(dropout(activation(linear1(x), o_.activation)));
}

Tensor TransformerEncoderLayerImpl::forward(const Tensor& x, const AttentionMasks& masks,
                                            KVCacheEntry* cache) {
  if (o_.recompute && !cache && is_grad_enabled()) {
    // The masks are captured by value: the backward pass re-runs the body after forward()
    // has returned. Tensors in them that require grad (T5's position bias) are found by the
    // checkpoint and get their gradients.
    return checkpoint(
        [this, masks](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{body(in[0], masks, nullptr)};
        },
        {x})[0];
  }
  return body(x, masks, cache);
}

Tensor TransformerEncoderLayerImpl::body(const Tensor& x, const AttentionMasks& masks,
                                         KVCacheEntry* cache) {
  auto sa = [&](const Tensor& h) {
    return cache ? self_attn->forward_cached(h, *cache, masks) : self_attn->forward(h, h, h, masks);
  };
  if (o_.norm_first) {
    Tensor y = add(x, dropout1(sa(norm1(x))));
    return add(y, dropout2(ff(norm2(y))));
  }
  Tensor y = norm1(add(x, dropout1(sa(x))));
  return norm2(add(y, dropout2(ff(y))));
}

TransformerDecoderLayerImpl::TransformerDecoderLayerImpl(const TransformerLayerOptions& o)
    : Module("TransformerDecoderLayer"), o_(o) {
  check_layer_options(o, "TransformerDecoderLayer");
  self_attn = make_attention(o);
  register_module("self_attn", self_attn.ptr());
  multihead_attn = make_attention(o);
  register_module("multihead_attn", multihead_attn.ptr());
  linear1 = Linear(o.d_model, o.dim_feedforward, o.bias);
  register_module("linear1", linear1.ptr());
  dropout = Dropout(o.dropout);
  register_module("dropout", dropout.ptr());
  linear2 = Linear(o.dim_feedforward, o.d_model, o.bias);
  register_module("linear2", linear2.ptr());
  norm1 = LayerNorm(Shape{o.d_model}, o.layer_norm_eps);
  register_module("norm1", norm1.ptr());
  norm2 = LayerNorm(Shape{o.d_model}, o.layer_norm_eps);
  register_module("norm2", norm2.ptr());
  norm3 = LayerNorm(Shape{o.d_model}, o.layer_norm_eps);
  register_module("norm3", norm3.ptr());
  dropout1 = Dropout(o.dropout);
  register_module("dropout1", dropout1.ptr());
  dropout2 = Dropout(o.dropout);
  register_module("dropout2", dropout2.ptr());
  dropout3 = Dropout(o.dropout);
  register_module("dropout3", dropout3.ptr());
}

Tensor TransformerDecoderLayerImpl::ff(const Tensor& x) {
  return linear2(dropout(activation(linear1(x), o_.activation)));
}

Tensor TransformerDecoderLayerImpl::forward(const Tensor& x, const Tensor& memory,
                                            const AttentionMasks& self_masks,
                                            const AttentionMasks& memory_masks) {
  CS_CHECK(memory.defined() && memory.dim() == 3 && x.dim() == 3 && memory.size(0) == x.size(0) &&
               memory.size(2) == x.size(2),
           "TransformerDecoderLayer: memory must be [B, Ts, {}] with the target's batch size, "
           "got target {} and memory {}",
           o_.d_model, shape_str(x.shape()),
           memory.defined() ? shape_str(memory.shape()) : std::string("undefined"));
  if (o_.recompute && is_grad_enabled()) {
    return checkpoint(
        [this, self_masks, memory_masks](const std::vector<Tensor>& in) {
          return std::vector<Tensor>{body(in[0], in[1], self_masks, memory_masks)};
        },
        {x, memory})[0];
  }
  return body(x, memory, self_masks, memory_masks);
}

Tensor TransformerDecoderLayerImpl::body(const Tensor& x, const Tensor& memory,
                                         const AttentionMasks& self_masks,
                                         const AttentionMasks& memory_masks) {
  if (o_.norm_first) {
    Tensor h = norm1(x);
    Tensor y = add(x, dropout1(self_attn->forward(h, h, h, self_masks)));
    Tensor h2 = norm2(y);
    y = add(y, dropout2(multihead_attn->forward(h2, memory, memory, memory_masks)));
    return add(y, dropout3(ff(norm3(y))));
  }
  Tensor y = norm1(add(x, dropout1(self_attn->forward(x, x, x, self_masks))));
  y = norm2(add(y, dropout2(multihead_attn->forward(y, memory, memory, memory_masks))));
  return norm3(add(y, dropout3(ff(y))));
}

// ---------------------------------------------------------------------------------------------
LearnedPositionEmbeddingImpl::LearnedPositionEmbeddingImpl(int64_t max_pos, int64_t dim,
                                                           double init_std)
    : Module("LearnedPositionEmbedding"), max_positions(max_pos) {
  CS_CHECK(max_pos > 0 && dim > 0,
           "LearnedPositionEmbedding: max_positions and dim must be positive, got {} and {}",
           max_pos, dim);
  Tensor w = zeros({max_pos, dim});
  init::normal_(w, 0.0, init_std);
  weight = register_parameter("weight", w);
}

static void check_positions(const char* who, int64_t seq_len, int64_t offset, int64_t max_pos) {
  CS_CHECK(seq_len >= 0 && offset >= 0 && seq_len + offset <= max_pos,
           "{}: positions {} to {} (sequence length {}, offset {}) exceed max_position_embeddings "
           "{}",
           who, offset, offset + seq_len - 1, seq_len, offset, max_pos);
}

Tensor LearnedPositionEmbeddingImpl::forward(int64_t seq_len, int64_t offset) {
  check_positions("LearnedPositionEmbedding", seq_len, offset, max_positions);
  return slice(weight, 0, offset, offset + seq_len);
}

SinusoidalPositionEmbeddingImpl::SinusoidalPositionEmbeddingImpl(int64_t max_pos, int64_t dim)
    : Module("SinusoidalPositionEmbedding"), max_positions_(max_pos), dim_(dim) {
  CS_CHECK(max_pos > 0 && dim > 0 && dim % 2 == 0,
           "SinusoidalPositionEmbedding: max_positions must be positive and dim positive and "
           "even, got {} and {}",
           max_pos, dim);
  std::vector<float> t(static_cast<size_t>(max_pos * dim));
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t i = 0; i < dim / 2; ++i) {
      const double angle = static_cast<double>(p) / std::pow(10000.0, 2.0 * static_cast<double>(i) /
                                                                          static_cast<double>(dim));
      t[static_cast<size_t>(p * dim + 2 * i)] = static_cast<float>(std::sin(angle));
      t[static_cast<size_t>(p * dim + 2 * i + 1)] = static_cast<float>(std::cos(angle));
    }
  NoGradGuard ng;
  table_ = from_vector(t, {max_pos, dim});
}

void SinusoidalPositionEmbeddingImpl::to(Device d) {
  Module::to(d);
  detail::move_to_device(table_, d);  // a constant of the module, not in its state dict
}

Tensor SinusoidalPositionEmbeddingImpl::forward(int64_t seq_len, int64_t offset) {
  check_positions("SinusoidalPositionEmbedding", seq_len, offset, max_positions_);
  return slice(table_, 0, offset, offset + seq_len);
}

// ---------------------------------------------------------------------------------------------
RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : Module("RMSNorm"), dim_(dim), eps_(eps) {
  CS_CHECK(dim > 0 && eps >= 0, "RMSNorm: dim must be positive and eps >= 0, got {} and {}", dim,
           eps);
  weight = register_parameter("weight", ones({dim}));
}

Tensor RMSNormImpl::forward(const Tensor& x_in) {
  CS_CHECK(x_in.defined() && x_in.dim() >= 1 && x_in.size(-1) == dim_,
           "RMSNorm({}): input has shape {}; its last dim must be {}", dim_,
           x_in.defined() ? shape_str(x_in.shape()) : std::string("undefined"), dim_);
  CS_CHECK(is_floating(x_in.dtype()), "RMSNorm: expected a floating-point input, got {}",
           dtype_name(x_in.dtype()));
  Tensor x = x_in.dtype() == DType::f32 ? x_in : cast(x_in, DType::f32);
  Tensor var = mean(mul(x, x), {-1}, true);
  Tensor y = mul(x, rsqrt(var + eps_));
  if (x_in.dtype() != DType::f32) y = cast(y, x_in.dtype());
  return mul(weight, y);
}

// ---------------------------------------------------------------------------------------------
int64_t relative_position_bucket(int64_t rel, bool bidirectional, int64_t num_buckets,
                                 int64_t max_distance) {
  CS_CHECK(num_buckets >= (bidirectional ? 4 : 2) && max_distance > 0,
           "relative_position_bucket: need num_buckets >= {} and max_distance > 0, got {} and {}",
           bidirectional ? 4 : 2, num_buckets, max_distance);
  int64_t bucket = 0;
  if (bidirectional) {
    num_buckets /= 2;
    if (rel > 0) bucket += num_buckets;
    rel = rel < 0 ? -rel : rel;
  } else {
    rel = rel < 0 ? -rel : 0;
  }
  const int64_t max_exact = num_buckets / 2;
  if (rel < max_exact) return bucket + rel;
  // As HF in f32: log(rel / max_exact) / log(max_distance / max_exact) * (buckets - exact).
  const float lr = std::log(static_cast<float>(rel) / static_cast<float>(max_exact));
  const float ld = static_cast<float>(
      std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float f = lr / ld * static_cast<float>(num_buckets - max_exact);
  int64_t large = max_exact + static_cast<int64_t>(f);
  return bucket + std::min<int64_t>(large, num_buckets - 1);
}

RelativePositionBiasImpl::RelativePositionBiasImpl(int64_t num_heads, bool bidirectional,
                                                   int64_t num_buckets, int64_t max_distance)
    : Module("RelativePositionBias"),
      num_heads_(num_heads),
      num_buckets_(num_buckets),
      max_distance_(max_distance),
      bidirectional_(bidirectional) {
  CS_CHECK(num_heads > 0, "RelativePositionBias: num_heads must be positive, got {}", num_heads);
  (void)relative_position_bucket(0, bidirectional, num_buckets, max_distance);  // validates
  relative_attention_bias = Embedding(num_buckets, num_heads);
  register_module("relative_attention_bias", relative_attention_bias.ptr());
}

Tensor RelativePositionBiasImpl::forward(int64_t q_len, int64_t k_len, int64_t query_offset) {
  CS_CHECK(q_len >= 0 && k_len >= 0 && query_offset >= 0,
           "RelativePositionBias: lengths and offset must be >= 0, got {}, {}, {}", q_len, k_len,
           query_offset);
  std::vector<int64_t> idx(static_cast<size_t>(q_len * k_len));
  for (int64_t i = 0; i < q_len; ++i)
    for (int64_t j = 0; j < k_len; ++j)
      idx[static_cast<size_t>(i * k_len + j)] = relative_position_bucket(
          j - (i + query_offset), bidirectional_, num_buckets_, max_distance_);
  const Tensor& table = relative_attention_bias->weight;
  Tensor b = embedding(from_vector(idx, {q_len * k_len}).to(table.device()), table);
  return unsqueeze(permute(reshape(b, {q_len, k_len, num_heads_}), {2, 0, 1}), 0);
}

Tensor tied_logits(const Tensor& hidden, const Tensor& embedding_weight, const Tensor& bias) {
  CS_CHECK(
      hidden.defined() && embedding_weight.defined() && embedding_weight.dim() == 2 &&
          hidden.dim() >= 1 && hidden.size(-1) == embedding_weight.size(1),
      "tied_logits: hidden [..., E] and embedding weight [V, E] do not match: {} and {}",
      hidden.defined() ? shape_str(hidden.shape()) : std::string("undefined"),
      embedding_weight.defined() ? shape_str(embedding_weight.shape()) : std::string("undefined"));
  return linear(hidden, embedding_weight, bias);
}

}  // namespace cstorch::nn
