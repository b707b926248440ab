// T5 v1.0 for the Trainer (see t5.h).
#include "modelzoo/models/t5/t5.h"

#include <cmath>
#include <string>
#include <utility>

#include "cstorch/runtime.h"

namespace modelzoo::t5 {

namespace cs = cstorch;
namespace nn = cstorch::nn;

T5Config T5Config::small() {
  return T5Config{};
}

T5Config T5Config::tiny() {
  T5Config c;
  c.src_vocab_size = c.tgt_vocab_size = 128;
  c.d_model = 32;
  c.d_kv = 16;
  c.d_ff = 64;
  c.num_heads = 4;
  c.encoder_num_hidden_layers = c.decoder_num_hidden_layers = 2;
  c.src_max_position_embeddings = c.tgt_max_position_embeddings = 64;
  c.dropout_rate = 0;
  return c;
}

T5Config T5Config::from(const ConfigView& a) {
  a.check_keys({"vocab_size",
                "src_vocab_size",
                "tgt_vocab_size",
                "d_model",
                "d_kv",
                "d_ff",
                "num_heads",
                "encoder_num_hidden_layers",
                "decoder_num_hidden_layers",
                "relative_attention_num_buckets",
                "relative_attention_max_distance",
                "max_position_embeddings",
                "src_max_position_embeddings",
                "tgt_max_position_embeddings",
                "dropout_rate",
                "layer_norm_epsilon",
                "initializer_factor",
                "label_smoothing",
                "share_encoder_decoder_embedding",
                "share_embedding_weights",
                "encoder_nonlinearity",
                "decoder_nonlinearity",
                "position_embedding_type"});
  T5Config c;
  const int64_t vocab = a.get_int("vocab_size", c.src_vocab_size);
  c.src_vocab_size = a.get_int("src_vocab_size", vocab);
  c.tgt_vocab_size = a.get_int("tgt_vocab_size", vocab);
  c.d_model = a.get_int("d_model", c.d_model);
  c.num_heads = a.get_int("num_heads", c.num_heads);
  c.d_kv =
      a.get_int("d_kv", a.has("d_model") ? c.d_model / std::max<int64_t>(c.num_heads, 1) : c.d_kv);
  c.d_ff = a.get_int("d_ff", c.d_ff);
  c.encoder_num_hidden_layers = a.get_int("encoder_num_hidden_layers", c.encoder_num_hidden_layers);
  c.decoder_num_hidden_layers = a.get_int("decoder_num_hidden_layers", c.decoder_num_hidden_layers);
  c.relative_attention_num_buckets =
      a.get_int("relative_attention_num_buckets", c.relative_attention_num_buckets);
  c.relative_attention_max_distance =
      a.get_int("relative_attention_max_distance", c.relative_attention_max_distance);
  const int64_t maxpos = a.get_int("max_position_embeddings", c.src_max_position_embeddings);
  c.src_max_position_embeddings = a.get_int("src_max_position_embeddings", maxpos);
  c.tgt_max_position_embeddings = a.get_int("tgt_max_position_embeddings", maxpos);
  c.dropout_rate = a.get_double("dropout_rate", c.dropout_rate);
  c.layer_norm_epsilon = a.get_double("layer_norm_epsilon", c.layer_norm_epsilon);
  c.initializer_factor = a.get_double("initializer_factor", c.initializer_factor);
  c.label_smoothing = a.get_double("label_smoothing", c.label_smoothing);
  c.share_encoder_decoder_embedding =
      a.get_bool("share_encoder_decoder_embedding", c.share_encoder_decoder_embedding);
  c.share_embedding_weights = a.get_bool("share_embedding_weights", c.share_embedding_weights);
  for (const char* key : {"encoder_nonlinearity", "decoder_nonlinearity"}) {
    const std::string v = a.get_string(key, "relu");
    if (cs::ascii_lower(v) != "relu")
      cs::fail("{}: '{}' is not supported: T5 v1.0 uses relu (gated variants are not implemented)",
               a.child_path(key), v);
  }
  {
    const std::string v = a.get_string("position_embedding_type", "relative");
    if (cs::ascii_lower(v) != "relative")
      cs::fail("{}: '{}' is not supported: T5 uses relative position biases",
               a.child_path("position_embedding_type"), v);
  }
  for (auto [key, v] : {std::pair<const char*, int64_t>{"src_vocab_size", c.src_vocab_size},
                        {"tgt_vocab_size", c.tgt_vocab_size},
                        {"d_model", c.d_model},
                        {"d_kv", c.d_kv},
                        {"d_ff", c.d_ff},
                        {"num_heads", c.num_heads},
                        {"encoder_num_hidden_layers", c.encoder_num_hidden_layers},
                        {"decoder_num_hidden_layers", c.decoder_num_hidden_layers},
                        {"relative_attention_max_distance", c.relative_attention_max_distance},
                        {"src_max_position_embeddings", c.src_max_position_embeddings},
                        {"tgt_max_position_embeddings", c.tgt_max_position_embeddings}})
    if (v < 1) cs::fail("{}: must be positive, got {}", a.child_path(key), v);
  if (c.relative_attention_num_buckets < 4)
    cs::fail("{}: needs at least 4 buckets (2 per direction in the encoder), got {}",
             a.child_path("relative_attention_num_buckets"), c.relative_attention_num_buckets);
  if (!(c.dropout_rate >= 0 && c.dropout_rate < 1))
    cs::fail("{}: must be in [0, 1), got {}", a.child_path("dropout_rate"), c.dropout_rate);
  if (!(c.label_smoothing >= 0 && c.label_smoothing <= 1))
    cs::fail("{}: must be in [0, 1], got {}", a.child_path("label_smoothing"), c.label_smoothing);
  if (!(c.layer_norm_epsilon >= 0))
    cs::fail("{}: must be >= 0, got {}", a.child_path("layer_norm_epsilon"), c.layer_norm_epsilon);
  if (!(c.initializer_factor > 0))
    cs::fail("{}: must be positive, got {}", a.child_path("initializer_factor"),
             c.initializer_factor);
  if (c.share_encoder_decoder_embedding && c.src_vocab_size != c.tgt_vocab_size)
    cs::fail(
        "{}: one embedding for both stacks needs src_vocab_size == tgt_vocab_size, got {} and {} "
        "(set share_encoder_decoder_embedding: false)",
        a.child_path("share_encoder_decoder_embedding"), c.src_vocab_size, c.tgt_vocab_size);
  return c;
}

int64_t T5Config::num_parameters() const {
  const int64_t E = d_model, I = num_heads * d_kv;
  const int64_t attn = 4 * E * I;                                  // q, k, v [I, E] and o [E, I]
  const int64_t ffn = 2 * E * d_ff;                                // wi [d_ff, E], wo [E, d_ff]
  const int64_t rel = relative_attention_num_buckets * num_heads;  // block 0 of each stack
  const int64_t enc = encoder_num_hidden_layers * (attn + ffn + 2 * E) + rel + E;
  const int64_t dec = decoder_num_hidden_layers * (2 * attn + ffn + 3 * E) + rel + E;
  int64_t emb =
      share_encoder_decoder_embedding ? src_vocab_size * E : (src_vocab_size + tgt_vocab_size) * E;
  if (!share_embedding_weights) emb += tgt_vocab_size * E;  // lm_head
  return emb + enc + dec;
}

// ---------------------------------------------------------------------------------------------
T5AttentionImpl::T5AttentionImpl(const T5Config& c, bool has_relative_bias, bool bidirectional)
    : Module("T5Attention"), heads_(c.num_heads), dropout_(c.dropout_rate) {
  const int64_t E = c.d_model, I = c.num_heads * c.d_kv;
  const double f = c.initializer_factor;
  auto make = [&](const char* name, int64_t in, int64_t out, double std) {
    nn::Linear l(in, out, false);
    nn::init::normal_(l->weight, 0.0, std);
    register_module(name, l.ptr());
    return l;
  };
  // HF's T5 initialisation: the query's std carries the 1/sqrt(d_kv) that the scores omit.
  q = make("q", E, I, f / std::sqrt(static_cast<double>(E * c.d_kv)));
  k = make("k", E, I, f / std::sqrt(static_cast<double>(E)));
  v = make("v", E, I, f / std::sqrt(static_cast<double>(E)));
  o = make("o", I, E, f / std::sqrt(static_cast<double>(I)));
  if (has_relative_bias) {
    rel_ = nn::RelativePositionBias(c.num_heads, bidirectional, c.relative_attention_num_buckets,
                                    c.relative_attention_max_distance);
    nn::init::normal_(rel_->relative_attention_bias->weight, 0.0,
                      f / std::sqrt(static_cast<double>(E)));
    // Registered under HF's name (the table itself, not the helper module around it).
    register_module("relative_attention_bias", rel_->relative_attention_bias.ptr());
  }
}

cs::Tensor T5AttentionImpl::forward(const cs::Tensor& x, const cs::Tensor& kv,
                                    const nn::AttentionMasks& masks) {
  return o(nn::multi_head_attention(q(x), k(kv), v(kv), heads_, masks,
                                    is_training() ? dropout_ : 0.0, 1.0));
}

cs::Tensor T5AttentionImpl::position_bias(int64_t q_len, int64_t k_len) {
  CS_CHECK(rel_.ptr() != nullptr, "T5Attention: this layer has no relative_attention_bias");
  return rel_(q_len, k_len);
}

// ---------------------------------------------------------------------------------------------
T5Model::T5Model(const T5Config& c)
    : seq2seq::Seq2SeqModel("T5Model", "t5",
                            {c.src_vocab_size, c.tgt_vocab_size, c.src_max_position_embeddings,
                             c.tgt_max_position_embeddings},
                            c.label_smoothing),
      c_(c) {
  CS_CHECK(!c.share_encoder_decoder_embedding || c.src_vocab_size == c.tgt_vocab_size,
           "t5: share_encoder_decoder_embedding needs equal vocabularies, got {} and {}",
           c.src_vocab_size, c.tgt_vocab_size);
  auto make_embedding = [&](int64_t vocab, const char* name) {
    nn::Embedding e(vocab, c.d_model);
    nn::init::normal_(e->weight, 0.0, c.initializer_factor);
    register_module(name, e.ptr());
    return e;
  };
  if (c.share_encoder_decoder_embedding) {
    src_emb_ = tgt_emb_ = make_embedding(c.src_vocab_size, "shared");
  } else {
    src_emb_ = make_embedding(c.src_vocab_size, "encoder_embed_tokens");
    tgt_emb_ = make_embedding(c.tgt_vocab_size, "decoder_embed_tokens");
  }
  drop_ = nn::Dropout(c.dropout_rate);
  register_module("dropout", drop_.ptr());
  encoder_ = build_stack("encoder", false);
  decoder_ = build_stack("decoder", true);
  if (!c.share_embedding_weights) {
    lm_head_ = nn::Linear(c.d_model, c.tgt_vocab_size, false);
    nn::init::normal_(lm_head_->weight, 0.0, c.initializer_factor);
    register_module("lm_head", lm_head_.ptr());
  }
}

T5Model::Stack T5Model::build_stack(const char* name, bool decoder) {
  const int64_t E = c_.d_model,
                L = decoder ? c_.decoder_num_hidden_layers : c_.encoder_num_hidden_layers;
  const double f = c_.initializer_factor;
  Stack s;
  auto stack = std::make_shared<nn::Module>("T5Stack");
  nn::ModuleList blocks;
  auto norm = [&](nn::Module& parent) {
    nn::RMSNorm n(E, c_.layer_norm_epsilon);
    parent.register_module("layer_norm", n.ptr());
    return n;
  };
  for (int64_t i = 0; i < L; ++i) {
    Block b;
    auto block = std::make_shared<nn::Module>("T5Block");
    nn::ModuleList layer;
    auto sa = std::make_shared<nn::Module>("T5LayerSelfAttention");
    b.self_attn = T5Attention(c_, i == 0, !decoder);
    sa->register_module("SelfAttention", b.self_attn.ptr());
    b.self_norm = norm(*sa);
    layer->push_back(sa);
    if (decoder) {
      auto ca = std::make_shared<nn::Module>("T5LayerCrossAttention");
      b.cross_attn = T5Attention(c_, false, false);
      ca->register_module("EncDecAttention", b.cross_attn.ptr());
      b.cross_norm = norm(*ca);
      layer->push_back(ca);
    }
    auto ff = std::make_shared<nn::Module>("T5LayerFF");
    auto drd = std::make_shared<nn::Module>("T5DenseActDense");
    b.wi = nn::Linear(E, c_.d_ff, false);
    nn::init::normal_(b.wi->weight, 0.0, f / std::sqrt(static_cast<double>(E)));
    drd->register_module("wi", b.wi.ptr());
    b.wo = nn::Linear(c_.d_ff, E, false);
    nn::init::normal_(b.wo->weight, 0.0, f / std::sqrt(static_cast<double>(c_.d_ff)));
    drd->register_module("wo", b.wo.ptr());
    ff->register_module("DenseReluDense", drd);
    b.ff_norm = norm(*ff);
    layer->push_back(ff);
    block->register_module("layer", layer.ptr());
    blocks->push_back(block);
    s.blocks.push_back(b);
  }
  stack->register_module("block", blocks.ptr());
  s.final_norm = nn::RMSNorm(E, c_.layer_norm_epsilon);
  stack->register_module("final_layer_norm", s.final_norm.ptr());
  register_module(name, stack);
  return s;
}

cs::Tensor T5Model::run_stack(Stack& s, cs::Tensor x, const cs::Tensor& self_key_mask, bool causal,
                              const cs::Tensor& memory, const cs::Tensor& memory_key_mask) {
  const int64_t T = x.size(1);
  nn::AttentionMasks self_m;
  self_m.key_mask = self_key_mask;
  self_m.causal = causal;
  // Computed once by the first layer's table and added in every layer.
  if (!s.blocks.empty()) self_m.position_bias = s.blocks[0].self_attn->position_bias(T, T);
  nn::AttentionMasks mem_m;
  mem_m.key_mask = memory_key_mask;
  for (Block& b : s.blocks) {
    cs::Tensor h = b.self_norm(x);
    x = cs::add(x, drop_(b.self_attn->forward(h, h, self_m)));
    if (b.cross_attn.ptr()) {
      h = b.cross_norm(x);
      x = cs::add(x, drop_(b.cross_attn->forward(h, memory, mem_m)));
    }
    h = b.ff_norm(x);
    x = cs::add(x, drop_(b.wo(drop_(cs::relu(b.wi(h))))));
  }
  return drop_(s.final_norm(x));
}

cs::Tensor T5Model::encode(const cs::Tensor& ids, const cs::Tensor& mask) {
  CS_CHECK(ids.defined() && ids.dim() == 2 && ids.size(1) <= c_.src_max_position_embeddings,
           "t5: input_ids must be [B, S] with S <= src_max_position_embeddings {}, got {}",
           c_.src_max_position_embeddings,
           ids.defined() ? cs::shape_str(ids.shape()) : std::string("undefined"));
  return run_stack(encoder_, drop_(src_emb_(ids)), mask, false, cs::Tensor(), cs::Tensor());
}

cs::Tensor T5Model::decode(const cs::Tensor& ids, const cs::Tensor& dec_mask,
                           const cs::Tensor& memory, const cs::Tensor& src_mask) {
  CS_CHECK(ids.defined() && ids.dim() == 2 && ids.size(1) <= c_.tgt_max_position_embeddings,
           "t5: decoder_input_ids must be [B, T] with T <= tgt_max_position_embeddings {}, got {}",
           c_.tgt_max_position_embeddings,
           ids.defined() ? cs::shape_str(ids.shape()) : std::string("undefined"));
  CS_CHECK(memory.defined() && memory.dim() == 3 && memory.size(0) == ids.size(0) &&
               memory.size(2) == c_.d_model,
           "t5: the encoder output must be [B, S, {}] with the decoder's batch {}, got {}",
           c_.d_model, ids.size(0),
           memory.defined() ? cs::shape_str(memory.shape()) : std::string("undefined"));
  return run_stack(decoder_, drop_(tgt_emb_(ids)), dec_mask, true, memory, src_mask);
}

cs::Tensor T5Model::logits_of(const seq2seq::Seq2SeqBatch& b) {
  cs::Tensor memory = encode(b.input_ids, b.attention_mask);
  cs::Tensor y = decode(b.decoder_input_ids, b.decoder_attention_mask, memory, b.attention_mask);
  if (!c_.share_embedding_weights) return lm_head_(y);
  // T5 v1.0: the tied projection sees the decoder output rescaled by d_model^-0.5.
  return nn::tied_logits(y * (1.0 / std::sqrt(static_cast<double>(c_.d_model))), tgt_emb_->weight);
}

MODELZOO_REGISTER(models, "t5", [](const ConfigView& a) -> ModelPtr {
  return std::make_shared<T5Model>(T5Config::from(a));
});

}  // namespace modelzoo::t5
