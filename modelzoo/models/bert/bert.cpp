// BERT for the Trainer (see bert.h).
#include "modelzoo/models/bert/bert.h"

#include "cstorch/runtime.h"
#include "modelzoo/models/gpt2/gpt2.h"
#include "modelzoo/models/seq2seq/seq2seq.h"

namespace modelzoo::bert {

namespace cs = cstorch;
namespace nn = cstorch::nn;

BertConfig BertConfig::base() {
  return BertConfig{};
}

BertConfig BertConfig::tiny() {
  BertConfig c;
  c.vocab_size = 512;
  c.hidden_size = 64;
  c.num_hidden_layers = 2;
  c.num_heads = 4;
  c.filter_size = 256;
  c.max_position_embeddings = 128;
  return c;
}

BertConfig BertConfig::from(const ConfigView& a) {
  a.check_keys({"vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "filter_size",
                "max_position_embeddings", "num_segments", "dropout_rate", "attention_dropout_rate",
                "layer_norm_epsilon", "initializer_range", "disable_nsp", "encoder_nonlinearity",
                "recompute"});
  BertConfig c;
  c.vocab_size = a.get_int("vocab_size", c.vocab_size);
  c.hidden_size = a.get_int("hidden_size", c.hidden_size);
  c.num_hidden_layers = a.get_int("num_hidden_layers", c.num_hidden_layers);
  c.num_heads = a.get_int("num_heads", c.num_heads);
  c.filter_size = a.get_int("filter_size", 4 * c.hidden_size);
  c.max_position_embeddings = a.get_int("max_position_embeddings", c.max_position_embeddings);
  c.num_segments = a.get_int("num_segments", c.num_segments);
  c.dropout_rate = a.get_double("dropout_rate", c.dropout_rate);
  c.attention_dropout_rate = a.get_double("attention_dropout_rate", c.dropout_rate);
  c.layer_norm_epsilon = a.get_double("layer_norm_epsilon", c.layer_norm_epsilon);
  c.initializer_range = a.get_double("initializer_range", c.initializer_range);
  c.disable_nsp = a.get_bool("disable_nsp", false);
  c.recompute = a.get_bool("recompute", c.recompute);
  if (a.get_string("encoder_nonlinearity", "gelu") != "gelu")
    a.error("encoder_nonlinearity: only gelu is supported");
  for (auto [key, v] : {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
                        {"hidden_size", c.hidden_size},
                        {"num_hidden_layers", c.num_hidden_layers},
                        {"num_heads", c.num_heads},
                        {"filter_size", c.filter_size},
                        {"max_position_embeddings", c.max_position_embeddings},
                        {"num_segments", c.num_segments}})
    if (v < 1) cs::fail("{}: must be positive, got {}", a.child_path(key), v);
  if (c.hidden_size % c.num_heads != 0)
    cs::fail("{}: {} heads do not divide hidden_size {}", a.child_path("num_heads"), c.num_heads,
             c.hidden_size);
  for (auto [key, v] : {std::pair<const char*, double>{"dropout_rate", c.dropout_rate},
                        {"attention_dropout_rate", c.attention_dropout_rate}})
    if (!(v >= 0 && v < 1)) cs::fail("{}: must be in [0, 1), got {}", a.child_path(key), v);
  return c;
}

int64_t BertConfig::num_backbone_parameters() const {
  const int64_t E = hidden_size, Fs = filter_size;
  const int64_t emb = (vocab_size + max_position_embeddings + num_segments) * E + 2 * E;
  const int64_t layer =
      (3 * E * E + 3 * E) + (E * E + E) + 2 * E + (E * Fs + Fs) + (Fs * E + E) + 2 * E;
  return emb + num_hidden_layers * layer + (disable_nsp ? 0 : E * E + E);
}

int64_t BertConfig::num_parameters() const {
  const int64_t E = hidden_size;
  return num_backbone_parameters() + (E * E + E) + 2 * E + vocab_size +
         (disable_nsp ? 0 : 2 * E + 2);
}

namespace {
nn::Linear make_linear(int64_t in, int64_t out, double std) {
  nn::Linear l(in, out);
  nn::init::normal_(l->weight, 0.0, std);
  nn::init::zeros_(l->bias);
  return l;
}
}  // namespace

BertModel::BertModel(const BertConfig& c) : Model("BertModel"), c_(c) {
  const int64_t E = c.hidden_size;
  const double r = c.initializer_range;
  auto embeddings = std::make_shared<nn::Module>("BertEmbeddings");
  word_ = nn::Embedding(c.vocab_size, E);
  nn::init::normal_(word_->weight, 0.0, r);
  embeddings->register_module("word_embeddings", word_.ptr());
  pos_ = nn::LearnedPositionEmbedding(c.max_position_embeddings, E, r);
  embeddings->register_module("position_embeddings", pos_.ptr());
  type_ = nn::Embedding(c.num_segments, E);
  nn::init::normal_(type_->weight, 0.0, r);
  embeddings->register_module("token_type_embeddings", type_.ptr());
  emb_ln_ = nn::LayerNorm(cs::Shape{E}, c.layer_norm_epsilon);
  embeddings->register_module("LayerNorm", emb_ln_.ptr());
  emb_drop_ = nn::Dropout(c.dropout_rate);
  embeddings->register_module("dropout", emb_drop_.ptr());
  register_module("embeddings", embeddings);

  nn::TransformerLayerOptions o;
  o.d_model = E;
  o.nhead = c.num_heads;
  o.dim_feedforward = c.filter_size;
  o.dropout = c.dropout_rate;
  o.attention_dropout = c.attention_dropout_rate;
  o.activation = "gelu";
  o.layer_norm_eps = c.layer_norm_epsilon;
  o.norm_first = false;
  o.recompute = c.recompute;
  auto encoder = std::make_shared<nn::Module>("BertEncoder");
  nn::ModuleList layers;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    auto layer = std::make_shared<nn::TransformerEncoderLayerImpl>(o);
    nn::init::normal_(layer->self_attn->in_proj_weight, 0.0, r);
    nn::init::normal_(layer->self_attn->out_proj->weight, 0.0, r);
    for (auto* l : {&layer->linear1, &layer->linear2}) {
      nn::init::normal_((*l)->weight, 0.0, r);
      nn::init::zeros_((*l)->bias);
    }
    layers->push_back(layer);
    layers_.push_back(layer);
  }
  encoder->register_module("layers", layers.ptr());
  register_module("encoder", encoder);

  if (!c.disable_nsp) {
    auto pooler = std::make_shared<nn::Module>("BertPooler");
    pooler_ = make_linear(E, E, r);
    pooler->register_module("dense", pooler_.ptr());
    register_module("pooler", pooler);
  }
  auto cls = std::make_shared<nn::Module>("BertPreTrainingHeads");
  auto predictions = std::make_shared<nn::Module>("BertLMPredictionHead");
  auto transform = std::make_shared<nn::Module>("BertPredictionHeadTransform");
  mlm_dense_ = make_linear(E, E, r);
  transform->register_module("dense", mlm_dense_.ptr());
  mlm_ln_ = nn::LayerNorm(cs::Shape{E}, c.layer_norm_epsilon);
  transform->register_module("LayerNorm", mlm_ln_.ptr());
  predictions->register_module("transform", transform);
  mlm_bias_ = predictions->register_parameter("bias", cs::zeros({c.vocab_size}));
  cls->register_module("predictions", predictions);
  if (!c.disable_nsp) {
    nsp_ = make_linear(E, 2, r);
    cls->register_module("seq_relationship", nsp_.ptr());
  }
  register_module("cls", cls);
  mlm_acc_ = std::make_shared<cs::metrics::AccuracyMetric>("eval/masked_lm_accuracy");
  mlm_ppl_ = std::make_shared<cs::metrics::PerplexityMetric>("eval/mlm_perplexity");
  if (!c.disable_nsp) nsp_acc_ = std::make_shared<cs::metrics::AccuracyMetric>("eval/nsp_accuracy");
}

cs::Tensor BertModel::encode(const cs::Tensor& ids, const cs::Tensor& types,
                             const cs::Tensor& mask) {
  seq2seq::check_token_ids("bert", "input_ids", ids, c_.vocab_size);
  const int64_t T = ids.size(1);
  if (T > c_.max_position_embeddings)
    cs::fail("bert: input_ids has sequence length {} but max_position_embeddings is {}", T,
             c_.max_position_embeddings);
  for (const auto* t : {&types, &mask})
    CS_CHECK(!t->defined() || t->shape() == ids.shape(),
             "bert: {} has shape {} but input_ids is {}",
             t == &types ? "token_type_ids" : "attention_mask", cs::shape_str(t->shape()),
             cs::shape_str(ids.shape()));
  cs::Tensor x = cs::add(word_(ids), pos_(T));
  if (types.defined()) {
    seq2seq::check_token_ids("bert", "token_type_ids", types, c_.num_segments);
    x = cs::add(x, type_(types));
  } else {
    x = cs::add(x, cs::slice(type_->weight, 0, 0, 1));
  }
  x = emb_drop_(emb_ln_(x));
  nn::AttentionMasks m;
  m.key_mask = mask;
  for (auto& l : layers_) x = l->forward(x, m);
  return x;
}

cs::Tensor BertModel::mlm_logits(const cs::Tensor& hidden) {
  cs::Tensor t = mlm_ln_(cs::gelu(mlm_dense_(hidden), false));
  return nn::tied_logits(t, word_->weight, mlm_bias_);
}

cs::Tensor BertModel::nsp_logits(const cs::Tensor& hidden) {
  CS_CHECK(!c_.disable_nsp, "bert: nsp_logits with disable_nsp: true");
  cs::Tensor first = cs::squeeze(cs::slice(hidden, 1, 0, 1), 1);
  return nsp_(cs::tanh(pooler_(first)));
}

cs::Tensor BertModel::loss(const cs::Batch& b) {
  auto get = [&](const char* key) -> const cs::Tensor& {
    auto it = b.find(key);
    if (it == b.end())
      cs::fail(
          "bert: the batch has no \"{}\" (needs input_ids, attention_mask, token_type_ids, "
          "mlm_labels{})",
          key, c_.disable_nsp ? "" : ", next_sentence_label");
    return it->second;
  };
  const cs::Tensor& ids = get("input_ids");
  const cs::Tensor& labels = get("mlm_labels");
  CS_CHECK(labels.shape() == ids.shape(), "bert: mlm_labels has shape {} but input_ids is {}",
           cs::shape_str(labels.shape()), cs::shape_str(ids.shape()));
  if (!cs::is_tracing()) check_batch_values(b);
  cs::Tensor h = encode(ids, get("token_type_ids"), get("attention_mask"));
  const int64_t B = ids.size(0), T = ids.size(1);
  cs::Tensor lg = mlm_logits(h);
  cs::Tensor flat_labels = cs::reshape(labels, {B * T});
  cs::Tensor flat_logits = cs::reshape(lg, {B * T, c_.vocab_size});
  cs::Tensor loss = cs::cross_entropy(flat_logits, flat_labels, -100);
  cs::Tensor nsp_lg;
  if (!c_.disable_nsp) {
    const cs::Tensor& nsl = get("next_sentence_label");
    CS_CHECK(nsl.dim() == 1 && nsl.size(0) == B,
             "bert: next_sentence_label has shape {} but the batch size is {}",
             cs::shape_str(nsl.shape()), B);
    nsp_lg = nsp_logits(h);
    loss = cs::add(loss, cs::cross_entropy(nsp_lg, nsl));
  }
  if (!is_training()) {
    cs::Tensor predicted = cs::ne(labels, cs::full({}, -100, labels.dtype()));
    cs::Tensor w = cs::cast(predicted, cs::DType::f32);
    cs::Tensor safe = cs::where(predicted, labels, cs::zeros({}, labels.dtype()));
    cs::Tensor sum_ce = cs::cross_entropy(flat_logits, flat_labels, -100, 0.0, cs::Reduction::Sum);
    mlm_ppl_->update(safe, sum_ce, w);
    mlm_acc_->update(safe, cs::cast(cs::argmax(lg, -1), labels.dtype()), w);
    if (!c_.disable_nsp) {
      const cs::Tensor& nsl = get("next_sentence_label");
      nsp_acc_->update(nsl, cs::cast(cs::argmax(nsp_lg, -1), nsl.dtype()));
    }
  }
  return loss;
}

void BertModel::check_batch_values(const cs::Batch& b) const {
  using seq2seq::batch_entry;
  if (const cs::Tensor* t = batch_entry(b, "input_ids", 2))
    seq2seq::check_token_ids("bert", "input_ids", *t, c_.vocab_size);
  if (const cs::Tensor* t = batch_entry(b, "token_type_ids", 2))
    seq2seq::check_token_ids("bert", "token_type_ids", *t, c_.num_segments);
  if (const cs::Tensor* t = batch_entry(b, "mlm_labels", 2))
    seq2seq::check_token_ids("bert", "mlm_labels", *t, c_.vocab_size, true);
  if (const cs::Tensor* t = batch_entry(b, "attention_mask", 2))
    seq2seq::check_mask_values("bert", "attention_mask", *t);
  if (c_.disable_nsp) return;
  if (const cs::Tensor* t = batch_entry(b, "next_sentence_label", 1)) {
    const auto v = t->to_vector<int64_t>();
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] != 0 && v[i] != 1)
        cs::fail("bert: next_sentence_label[{}] = {} is not 0 or 1 (its two classes)", i, v[i]);
  }
}

double BertModel::loss_weight(const cs::Batch& b) const {
  auto it = b.find("mlm_labels");
  if (!c_.disable_nsp || it == b.end()) return Model::loss_weight(b);
  double n = 0;
  for (int64_t v : cs::cast(it->second, cs::DType::i64).to_vector<int64_t>()) n += v != -100;
  return n;
}

MODELZOO_REGISTER(models, "bert", [](const ConfigView& a) -> ModelPtr {
  return std::make_shared<BertModel>(BertConfig::from(a));
});

}  // namespace modelzoo::bert
