// GPT-2 for the Trainer (see gpt2.h).
#include "modelzoo/models/gpt2/gpt2.h"

#include <cmath>

#include "cstorch/runtime.h"
#include "modelzoo/models/seq2seq/seq2seq.h"

namespace modelzoo::gpt2 {

namespace cs = cstorch;
namespace nn = cstorch::nn;

GPT2Config GPT2Config::small() {
  return GPT2Config{};
}

GPT2Config GPT2Config::tiny() {
  GPT2Config c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_heads = 4;
  c.max_position_embeddings = 128;
  c.filter_size = 256;
  return c;
}

static void check_rate(const ConfigView& a, const char* key, double v) {
  if (!(v >= 0 && v < 1)) cs::fail("{}: must be in [0, 1), got {}", a.child_path(key), v);
}

GPT2Config GPT2Config::from(const ConfigView& a) {
  a.check_keys({"vocab_size", "hidden_size", "num_hidden_layers", "num_heads",
                "max_position_embeddings", "filter_size", "dropout_rate", "attention_dropout_rate",
                "embedding_dropout_rate", "layer_norm_epsilon", "initializer_range",
                "share_embedding_weights", "recompute"});
  GPT2Config c;
  c.vocab_size = a.get_int("vocab_size", c.vocab_size);
  c.hidden_size = a.get_int("hidden_size", c.hidden_size);
  c.num_hidden_layers = a.get_int("num_hidden_layers", c.num_hidden_layers);
  c.num_heads = a.get_int("num_heads", c.num_heads);
  c.max_position_embeddings = a.get_int("max_position_embeddings", c.max_position_embeddings);
  c.filter_size = a.get_int("filter_size", 4 * c.hidden_size);
  c.dropout_rate = a.get_double("dropout_rate", c.dropout_rate);
  c.attention_dropout_rate = a.get_double("attention_dropout_rate", c.dropout_rate);
  c.embedding_dropout_rate = a.get_double("embedding_dropout_rate", c.dropout_rate);
  c.layer_norm_epsilon = a.get_double("layer_norm_epsilon", c.layer_norm_epsilon);
  c.initializer_range = a.get_double("initializer_range", c.initializer_range);
  c.recompute = a.get_bool("recompute", c.recompute);
  if (!a.get_bool("share_embedding_weights", true))
    a.error("share_embedding_weights: false is not supported (GPT-2's head is tied)");
  for (auto [key, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_heads", c.num_heads},
                        {"max_position_embeddings", c.max_position_embeddings},
                        {"filter_size", c.filter_size}})
    if (v < 1) cs::fail("{}: must be positive, got {}", a.child_path(key), v);
  if (c.hidden_size % c.num_heads != 0)
    cs::fail("{}: {} heads do not divide hidden_size {}", a.child_path("num_heads"), c.num_heads,
             c.hidden_size);
  check_rate(a, "dropout_rate", c.dropout_rate);
  check_rate(a, "attention_dropout_rate", c.attention_dropout_rate);
  check_rate(a, "embedding_dropout_rate", c.embedding_dropout_rate);
  return c;
}

int64_t GPT2Config::num_parameters() const {
  const int64_t E = hidden_size, Fs = filter_size;
  const int64_t layer =
      2 * E + (3 * E * E + 3 * E) + (E * E + E) + 2 * E + (E * Fs + Fs) + (Fs * E + E);
  return vocab_size * E + max_position_embeddings * E + num_hidden_layers * layer + 2 * E;
}

GPT2Model::GPT2Model(const GPT2Config& c) : Model("GPT2Model"), c_(c) {
  const int64_t E = c.hidden_size;
  wte = nn::Embedding(c.vocab_size, E);
  nn::init::normal_(wte->weight, 0.0, c.initializer_range);
  register_module("wte", wte.ptr());
  wpe = nn::LearnedPositionEmbedding(c.max_position_embeddings, E, c.initializer_range);
  register_module("wpe", wpe.ptr());
  drop = nn::Dropout(c.embedding_dropout_rate);
  register_module("drop", drop.ptr());
  h = nn::ModuleList();
  nn::TransformerLayerOptions o;
  o.d_model = E;
  o.nhead = c.num_heads;
  o.dim_feedforward = c.filter_size;
  o.dropout = c.dropout_rate;
  o.attention_dropout = c.attention_dropout_rate;
  o.activation = "gelu_tanh";
  o.layer_norm_eps = c.layer_norm_epsilon;
  o.norm_first = true;
  o.recompute = c.recompute;
  const double resid_std = c.initializer_range / std::sqrt(2.0 * c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto layer = std::make_shared<nn::TransformerEncoderLayerImpl>(o);
    nn::init::normal_(layer->self_attn->in_proj_weight, 0.0, c.initializer_range);
    nn::init::normal_(layer->self_attn->out_proj->weight, 0.0, resid_std);
    nn::init::normal_(layer->linear1->weight, 0.0, c.initializer_range);
    nn::init::zeros_(layer->linear1->bias);
    nn::init::normal_(layer->linear2->weight, 0.0, resid_std);
    nn::init::zeros_(layer->linear2->bias);
    h->push_back(layer);
    layers_.push_back(layer);
  }
  register_module("h", h.ptr());
  ln_f = nn::LayerNorm(cs::Shape{E}, c.layer_norm_epsilon);
  register_module("ln_f", ln_f.ptr());
  perplexity_ = std::make_shared<cs::metrics::PerplexityMetric>("eval/lm_perplexity");
  accuracy_ = std::make_shared<cs::metrics::AccuracyMetric>("eval/accuracy");
}

cs::Tensor GPT2Model::hidden(const cs::Tensor& ids, KVCache* cache) {
  seq2seq::check_token_ids("gpt2", "input_ids", ids, c_.vocab_size);
  const int64_t T = ids.size(1), past = cache ? cache->length() : 0;
  if (T + past > c_.max_position_embeddings)
    cs::fail("gpt2: input_ids has sequence length {}{} but max_position_embeddings is {}", T,
             past ? fmt::format(" after {} cached positions", past) : std::string(),
             c_.max_position_embeddings);
  if (cache && cache->layers.empty()) cache->layers.resize(layers_.size());
  CS_CHECK(!cache || cache->layers.size() == layers_.size(),
           "gpt2: the KV cache has {} layers but the model has {}", cache->layers.size(),
           layers_.size());
  cs::Tensor x = drop(cs::add(wte(ids), wpe(T, past)));
  nn::AttentionMasks m;
  m.causal = true;
  m.causal_offset = past;
  for (size_t i = 0; i < layers_.size(); ++i)
    x = layers_[i]->forward(x, m, cache ? &cache->layers[i] : nullptr);
  return ln_f(x);
}

cs::Tensor GPT2Model::logits(const cs::Tensor& ids, KVCache* cache) {
  return nn::tied_logits(hidden(ids, cache), wte->weight);
}

cs::Tensor GPT2Model::loss(const cs::Batch& b) {
  auto get = [&](const char* key) -> const cs::Tensor& {
    auto it = b.find(key);
    if (it == b.end())
      cs::fail("gpt2: the batch has no \"{}\" (needs input_ids, attention_mask, labels)", key);
    return it->second;
  };
  const cs::Tensor& ids = get("input_ids");
  const cs::Tensor& mask = get("attention_mask");
  const cs::Tensor& labels = get("labels");
  CS_CHECK(ids.dim() == 2 && mask.shape() == ids.shape() && labels.shape() == ids.shape(),
           "gpt2: input_ids {}, attention_mask {} and labels {} must all be [B, T]",
           cs::shape_str(ids.shape()), cs::shape_str(mask.shape()), cs::shape_str(labels.shape()));
  if (!cs::is_tracing()) check_batch_values(b);  // eagerly, as the Trainer does before a step
  const bool eval = !is_training();
  return seq2seq::masked_token_loss(logits(ids), labels, mask, 0.0,
                                    eval ? perplexity_.get() : nullptr,
                                    eval ? accuracy_.get() : nullptr);
}

void GPT2Model::check_batch_values(const cs::Batch& b) const {
  if (const cs::Tensor* t = seq2seq::batch_entry(b, "input_ids", 2))
    seq2seq::check_token_ids("gpt2", "input_ids", *t, c_.vocab_size);
  if (const cs::Tensor* t = seq2seq::batch_entry(b, "labels", 2))
    seq2seq::check_token_ids("gpt2", "labels", *t, c_.vocab_size, true);
  if (const cs::Tensor* t = seq2seq::batch_entry(b, "attention_mask", 2))
    seq2seq::check_mask_values("gpt2", "attention_mask", *t);
}

double GPT2Model::loss_weight(const cs::Batch& b) const {
  auto it = b.find("attention_mask");
  return it == b.end() ? Model::loss_weight(b) : seq2seq::token_count(it->second);
}

MODELZOO_REGISTER(models, "gpt2", [](const ConfigView& a) -> ModelPtr {
  return std::make_shared<GPT2Model>(GPT2Config::from(a));
});

}  // namespace modelzoo::gpt2
