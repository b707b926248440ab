// "Attention Is All You Need" Transformer for the Trainer (see transformer.h).
#include "modelzoo/models/transformer/transformer.h"

#include <cmath>
#include <string>
#include <utility>

#include "cstorch/runtime.h"

namespace modelzoo::transformer {

namespace cs = cstorch;
namespace nn = cstorch::nn;

TransformerConfig TransformerConfig::base() {
  return TransformerConfig{};
}

TransformerConfig TransformerConfig::tiny() {
  TransformerConfig c;
  c.src_vocab_size = c.tgt_vocab_size = 128;
  c.d_model = 32;
  c.num_heads = 4;
  c.encoder_num_hidden_layers = c.decoder_num_hidden_layers = 2;
  c.d_ff = 64;
  c.src_max_position_embeddings = c.tgt_max_position_embeddings = 64;
  c.dropout_rate = 0;
  c.label_smoothing = 0;
  return c;
}

namespace {

// `key` or its alias (Model Zoo spells some sizes both ways); giving both is an error.
int64_t aliased_int(const ConfigView& a, const char* key, const char* alias, int64_t def) {
  if (a.has(key) && a.has(alias)) a.error(fmt::format("give {} or {}, not both", key, alias));
  return a.has(alias) ? a.get_int(alias, def) : a.get_int(key, def);
}

void check_rate(const ConfigView& a, const char* key, double v, bool closed = false) {
  if (!(v >= 0 && (closed ? v <= 1 : v < 1)))
    cs::fail("{}: must be in [0, 1{}, got {}", a.child_path(key), closed ? "]" : ")", v);
}

}  // namespace

TransformerConfig TransformerConfig::from(const ConfigView& a) {
  a.check_keys({"vocab_size",
                "src_vocab_size",
                "tgt_vocab_size",
                "d_model",
                "hidden_size",
                "num_heads",
                "encoder_num_hidden_layers",
                "decoder_num_hidden_layers",
                "d_ff",
                "filter_size",
                "max_position_embeddings",
                "src_max_position_embeddings",
                "tgt_max_position_embeddings",
                "dropout_rate",
                "attention_dropout_rate",
                "layer_norm_epsilon",
                "label_smoothing",
                "share_encoder_decoder_embedding",
                "share_embedding_weights",
                "recompute"});
  TransformerConfig c;
  const int64_t vocab = a.get_int("vocab_size", c.src_vocab_size);
  c.src_vocab_size = a.get_int("src_vocab_size", vocab);
  c.tgt_vocab_size = a.get_int("tgt_vocab_size", vocab);
  c.d_model = aliased_int(a, "d_model", "hidden_size", c.d_model);
  c.num_heads = a.get_int("num_heads", c.num_heads);
  c.encoder_num_hidden_layers = a.get_int("encoder_num_hidden_layers", c.encoder_num_hidden_layers);
  c.decoder_num_hidden_layers = a.get_int("decoder_num_hidden_layers", c.decoder_num_hidden_layers);
  c.d_ff = aliased_int(a, "d_ff", "filter_size", 4 * c.d_model);
  const int64_t maxpos = a.get_int("max_position_embeddings", c.src_max_position_embeddings);
  c.src_max_position_embeddings = a.get_int("src_max_position_embeddings", maxpos);
  c.tgt_max_position_embeddings = a.get_int("tgt_max_position_embeddings", maxpos);
  c.dropout_rate = a.get_double("dropout_rate", c.dropout_rate);
  c.attention_dropout_rate = a.get_double("attention_dropout_rate", c.attention_dropout_rate);
  c.layer_norm_epsilon = a.get_double("layer_norm_epsilon", c.layer_norm_epsilon);
  c.label_smoothing = a.get_double("label_smoothing", c.label_smoothing);
  c.share_encoder_decoder_embedding =
      a.get_bool("share_encoder_decoder_embedding", c.share_encoder_decoder_embedding);
  c.share_embedding_weights = a.get_bool("share_embedding_weights", c.share_embedding_weights);
  c.recompute = a.get_bool("recompute", c.recompute);
  for (auto [key, v] : {std::pair<const char*, int64_t>{"src_vocab_size", c.src_vocab_size},
                        {"tgt_vocab_size", c.tgt_vocab_size},
                        {a.has("hidden_size") ? "hidden_size" : "d_model", c.d_model},
                        {"num_heads", c.num_heads},
                        {"encoder_num_hidden_layers", c.encoder_num_hidden_layers},
                        {"decoder_num_hidden_layers", c.decoder_num_hidden_layers},
                        {a.has("filter_size") ? "filter_size" : "d_ff", c.d_ff},
                        {"src_max_position_embeddings", c.src_max_position_embeddings},
                        {"tgt_max_position_embeddings", c.tgt_max_position_embeddings}})
    if (v < 1) cs::fail("{}: must be positive, got {}", a.child_path(key), v);
  if (c.d_model % c.num_heads != 0)
    cs::fail("{}: {} heads do not divide d_model {}", a.child_path("num_heads"), c.num_heads,
             c.d_model);
  if (c.d_model % 2 != 0)
    cs::fail("{}: the sinusoidal positions need an even d_model, got {}",
             a.child_path(a.has("hidden_size") ? "hidden_size" : "d_model"), c.d_model);
  check_rate(a, "dropout_rate", c.dropout_rate);
  check_rate(a, "attention_dropout_rate", c.attention_dropout_rate);
  check_rate(a, "label_smoothing", c.label_smoothing, true);
  if (!(c.layer_norm_epsilon > 0))
    cs::fail("{}: must be positive, got {}", a.child_path("layer_norm_epsilon"),
             c.layer_norm_epsilon);
  if (c.share_encoder_decoder_embedding && c.src_vocab_size != c.tgt_vocab_size)
    cs::fail(
        "{}: one embedding for source and target needs src_vocab_size == tgt_vocab_size, got {} "
        "and {} (set share_encoder_decoder_embedding: false)",
        a.child_path("share_encoder_decoder_embedding"), c.src_vocab_size, c.tgt_vocab_size);
  return c;
}

int64_t TransformerConfig::num_parameters() const {
  const int64_t E = d_model, F = d_ff;
  const int64_t attn = 4 * E * E + 4 * E;          // in_proj [3E, E] + [3E], out_proj [E, E] + [E]
  const int64_t ffn = E * F + F + F * E + E;       // linear1, linear2
  const int64_t enc = attn + ffn + 2 * 2 * E;      // + norm1, norm2
  const int64_t dec = 2 * attn + ffn + 3 * 2 * E;  // + norm1..3
  int64_t emb =
      share_encoder_decoder_embedding ? src_vocab_size * E : (src_vocab_size + tgt_vocab_size) * E;
  if (!share_embedding_weights) emb += tgt_vocab_size * E;  // lm_head
  return emb + encoder_num_hidden_layers * enc + decoder_num_hidden_layers * dec;
}

TransformerModel::TransformerModel(const TransformerConfig& c)
    : seq2seq::Seq2SeqModel("TransformerModel", "transformer",
                            {c.src_vocab_size, c.tgt_vocab_size, c.src_max_position_embeddings,
                             c.tgt_max_position_embeddings},
                            c.label_smoothing),
      c_(c) {
  CS_CHECK(!c.share_encoder_decoder_embedding || c.src_vocab_size == c.tgt_vocab_size,
           "transformer: share_encoder_decoder_embedding needs equal vocabularies, got {} and {}",
           c.src_vocab_size, c.tgt_vocab_size);
  const int64_t E = c.d_model;
  // Embeddings ~ N(0, d_model^-0.5), so the sqrt(d_model) scaling gives unit variance (as
  // tensor2tensor and fairseq initialise them).
  auto make_embedding = [&](int64_t vocab, const char* name) {
    nn::Embedding e(vocab, E);
    nn::init::normal_(e->weight, 0.0, 1.0 / std::sqrt(static_cast<double>(E)));
    register_module(name, e.ptr());
    return e;
  };
  if (c.share_encoder_decoder_embedding) {
    src_emb_ = tgt_emb_ = make_embedding(c.src_vocab_size, "embedding");
  } else {
    src_emb_ = make_embedding(c.src_vocab_size, "encoder_embedding");
    tgt_emb_ = make_embedding(c.tgt_vocab_size, "decoder_embedding");
  }
  pe_ = nn::SinusoidalPositionEmbedding(
      std::max(c.src_max_position_embeddings, c.tgt_max_position_embeddings), E);
  drop_ = nn::Dropout(c.dropout_rate);
  register_module("drop", drop_.ptr());

  nn::TransformerLayerOptions o;
  o.d_model = E;
  o.nhead = c.num_heads;
  o.dim_feedforward = c.d_ff;
  o.dropout = c.dropout_rate;
  o.attention_dropout = c.attention_dropout_rate;
  o.activation = "relu";
  o.layer_norm_eps = c.layer_norm_epsilon;
  o.norm_first = false;
  o.recompute = c.recompute;
  // Weight matrices Xavier-uniform (torch.nn.Transformer's _reset_parameters); biases zero.
  auto init_linear = [](nn::Linear& l) {
    nn::init::xavier_uniform_(l->weight);
    nn::init::zeros_(l->bias);
  };
  auto encoder = std::make_shared<nn::Module>("TransformerEncoder");
  nn::ModuleList enc_layers;
  for (int64_t i = 0; i < c.encoder_num_hidden_layers; ++i) {
    auto l = std::make_shared<nn::TransformerEncoderLayerImpl>(o);
    nn::init::xavier_uniform_(l->self_attn->out_proj->weight);
    init_linear(l->linear1);
    init_linear(l->linear2);
    enc_layers->push_back(l);
    enc_.push_back(l);
  }
  encoder->register_module("layers", enc_layers.ptr());
  register_module("encoder", encoder);
  auto decoder = std::make_shared<nn::Module>("TransformerDecoder");
  nn::ModuleList dec_layers;
  for (int64_t i = 0; i < c.decoder_num_hidden_layers; ++i) {
    auto l = std::make_shared<nn::TransformerDecoderLayerImpl>(o);
    nn::init::xavier_uniform_(l->self_attn->out_proj->weight);
    nn::init::xavier_uniform_(l->multihead_attn->out_proj->weight);
    init_linear(l->linear1);
    init_linear(l->linear2);
    dec_layers->push_back(l);
    dec_.push_back(l);
  }
  decoder->register_module("layers", dec_layers.ptr());
  register_module("decoder", decoder);
  if (!c.share_embedding_weights) {
    lm_head_ = nn::Linear(E, c.tgt_vocab_size, false);
    nn::init::xavier_uniform_(lm_head_->weight);
    register_module("lm_head", lm_head_.ptr());
  }
}

cs::Tensor TransformerModel::embed(nn::Embedding& emb, const cs::Tensor& ids) {
  const int64_t T = ids.size(1);
  cs::Tensor x = emb(ids) * std::sqrt(static_cast<double>(c_.d_model));
  return drop_(cs::add(x, pe_(T).to(x.device())));  // the table is not model state
}

cs::Tensor TransformerModel::encode(const cs::Tensor& ids, const cs::Tensor& mask) {
  CS_CHECK(ids.defined() && ids.dim() == 2 && ids.size(1) <= c_.src_max_position_embeddings,
           "transformer: input_ids must be [B, S] with S <= src_max_position_embeddings {}, got "
           "{}",
           c_.src_max_position_embeddings,
           ids.defined() ? cs::shape_str(ids.shape()) : std::string("undefined"));
  cs::Tensor x = embed(src_emb_, ids);
  nn::AttentionMasks m;
  m.key_mask = mask;
  for (auto& l : enc_) x = l->forward(x, m);
  return x;
}

cs::Tensor TransformerModel::decode(const cs::Tensor& ids, const cs::Tensor& dec_mask,
                                    const cs::Tensor& memory, const cs::Tensor& src_mask) {
  CS_CHECK(ids.defined() && ids.dim() == 2 && ids.size(1) <= c_.tgt_max_position_embeddings,
           "transformer: decoder_input_ids must be [B, T] with T <= tgt_max_position_embeddings "
           "{}, got {}",
           c_.tgt_max_position_embeddings,
           ids.defined() ? cs::shape_str(ids.shape()) : std::string("undefined"));
  cs::Tensor y = embed(tgt_emb_, ids);
  nn::AttentionMasks self_m, mem_m;
  self_m.causal = true;
  self_m.key_mask = dec_mask;
  mem_m.key_mask = src_mask;
  for (auto& l : dec_) y = l->forward(y, memory, self_m, mem_m);
  return y;
}

cs::Tensor TransformerModel::logits_of(const seq2seq::Seq2SeqBatch& b) {
  cs::Tensor memory = encode(b.input_ids, b.attention_mask);
  cs::Tensor y = decode(b.decoder_input_ids, b.decoder_attention_mask, memory, b.attention_mask);
  return c_.share_embedding_weights ? nn::tied_logits(y, tgt_emb_->weight) : lm_head_(y);
}

MODELZOO_REGISTER(models, "transformer", [](const ConfigView& a) -> ModelPtr {
  return std::make_shared<TransformerModel>(TransformerConfig::from(a));
});

}  // namespace modelzoo::transformer
