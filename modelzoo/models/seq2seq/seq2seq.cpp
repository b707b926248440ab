// Batch checks and the masked token loss of the encoder-decoder models (see seq2seq.h).
#include "modelzoo/models/seq2seq/seq2seq.h"

#include <string>

namespace modelzoo::seq2seq {

namespace cs = cstorch;

namespace {

std::string describe(const cs::Tensor& t) {
  return t.defined() ? fmt::format("{} {}", cs::dtype_name(t.dtype()), cs::shape_str(t.shape()))
                     : std::string("undefined");
}

}  // namespace

void check_token_ids(const char* model, const char* key, const cs::Tensor& ids, int64_t vocab,
                     bool allow_ignore) {
  CS_CHECK(ids.defined() && ids.dim() == 2 && cs::is_integral(ids.dtype()),
           "{}: {} must be an integer tensor [B, T], got {}", model, key, describe(ids));
  if (cs::is_tracing()) return;
  const auto v = ids.to_vector<int64_t>();
  const int64_t T = ids.size(1);
  for (size_t i = 0; i < v.size(); ++i) {
    if ((v[i] >= 0 && v[i] < vocab) || (allow_ignore && v[i] == -100)) continue;
    cs::fail("{}: {}[{}, {}] = {} is outside the vocabulary [0, {}){}", model, key,
             static_cast<int64_t>(i) / T, static_cast<int64_t>(i) % T, v[i], vocab,
             allow_ignore ? " (and is not the ignore index -100)" : "");
  }
}

void check_mask_values(const char* model, const char* key, const cs::Tensor& mask) {
  if (cs::is_tracing() || !mask.defined() || mask.dim() != 2) return;
  const auto v = mask.to_vector<double>();  // (converts: no cast op needed)
  const int64_t T = mask.size(1);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != 0.0 && v[i] != 1.0)
      cs::fail("{}: {}[{}, {}] = {} is not 0 or 1 (1 marks a token to attend to and count)", model,
               key, static_cast<int64_t>(i) / T, static_cast<int64_t>(i) % T, v[i]);
}

const cs::Tensor* batch_entry(const cs::Batch& batch, const char* key, int64_t dim) {
  auto it = batch.find(key);
  if (it == batch.end() || !it->second.defined() || it->second.dim() != dim ||
      !cs::is_integral(it->second.dtype()))
    return nullptr;
  return &it->second;
}

Seq2SeqBatch read_batch(const char* model, const cs::Batch& batch, const BatchLimits& lim) {
  auto get = [&](const char* key) -> const cs::Tensor& {
    auto it = batch.find(key);
    if (it == batch.end())
      cs::fail(
          "{}: the batch has no \"{}\" (needs input_ids, attention_mask, decoder_input_ids, "
          "decoder_attention_mask, labels)",
          model, key);
    const cs::Tensor& t = it->second;
    CS_CHECK(t.defined() && t.dim() == 2 && cs::is_integral(t.dtype()),
             "{}: {} must be an integer tensor [B, length], got {}", model, key, describe(t));
    return t;
  };
  Seq2SeqBatch b;
  b.input_ids = get("input_ids");
  b.attention_mask = get("attention_mask");
  b.decoder_input_ids = get("decoder_input_ids");
  b.decoder_attention_mask = get("decoder_attention_mask");
  b.labels = get("labels");
  CS_CHECK(b.attention_mask.shape() == b.input_ids.shape(),
           "{}: attention_mask {} must have the shape of input_ids {}", model,
           cs::shape_str(b.attention_mask.shape()), cs::shape_str(b.input_ids.shape()));
  CS_CHECK(b.decoder_input_ids.size(0) == b.input_ids.size(0),
           "{}: the encoder batch size {} (input_ids {}) and the decoder batch size {} "
           "(decoder_input_ids {}) differ",
           model, b.input_ids.size(0), cs::shape_str(b.input_ids.shape()),
           b.decoder_input_ids.size(0), cs::shape_str(b.decoder_input_ids.shape()));
  CS_CHECK(b.decoder_attention_mask.shape() == b.decoder_input_ids.shape(),
           "{}: decoder_attention_mask {} must have the shape of decoder_input_ids {}", model,
           cs::shape_str(b.decoder_attention_mask.shape()),
           cs::shape_str(b.decoder_input_ids.shape()));
  CS_CHECK(b.labels.shape() == b.decoder_input_ids.shape(),
           "{}: labels {} must have the shape of decoder_input_ids {} (one label per decoder "
           "position)",
           model, cs::shape_str(b.labels.shape()), cs::shape_str(b.decoder_input_ids.shape()));
  CS_CHECK(b.input_ids.size(1) <= lim.src_max_positions,
           "{}: input_ids has sequence length {} but src_max_position_embeddings is {}", model,
           b.input_ids.size(1), lim.src_max_positions);
  CS_CHECK(b.decoder_input_ids.size(1) <= lim.tgt_max_positions,
           "{}: decoder_input_ids has sequence length {} but tgt_max_position_embeddings is {}",
           model, b.decoder_input_ids.size(1), lim.tgt_max_positions);
  check_values(model, batch, lim);
  return b;
}

void check_values(const char* model, const cs::Batch& batch, const BatchLimits& lim) {
  const struct {
    const char* key;
    int64_t vocab;  // 0: a mask
    bool allow_ignore;
  } entries[] = {{"input_ids", lim.src_vocab_size, false},
                 {"attention_mask", 0, false},
                 {"decoder_input_ids", lim.tgt_vocab_size, false},
                 {"decoder_attention_mask", 0, false},
                 {"labels", lim.tgt_vocab_size, true}};
  for (const auto& e : entries)
    if (const cs::Tensor* t = batch_entry(batch, e.key, 2))
      e.vocab > 0 ? check_token_ids(model, e.key, *t, e.vocab, e.allow_ignore)
                  : check_mask_values(model, e.key, *t);
}

double token_count(const cs::Tensor& mask) {
  double n = 0;
  for (double v : cs::cast(mask, cs::DType::f32).to_vector<double>()) n += v;
  return n;
}

cs::Tensor masked_token_loss(const cs::Tensor& logits, const cs::Tensor& labels_bt,
                             const cs::Tensor& mask, double label_smoothing,
                             cs::metrics::PerplexityMetric* perplexity,
                             cs::metrics::AccuracyMetric* accuracy) {
  const int64_t B = logits.size(0), T = logits.size(1), V = logits.size(2);
  cs::Tensor flat = cs::reshape(logits, {B * T, V});
  cs::Tensor labels = cs::reshape(labels_bt, {B * T});
  cs::Tensor w = cs::cast(mask, cs::DType::f32);
  cs::Tensor wf = cs::reshape(w, {B * T});
  cs::Tensor ce = cs::cross_entropy(flat, labels, -100, label_smoothing, cs::Reduction::None);
  cs::Tensor total = cs::sum(cs::mul(ce, wf));
  cs::Tensor loss = cs::div(total, cs::sum(wf));
  if (perplexity) {
    // Perplexity of the model's distribution: the unsmoothed cross-entropy.
    cs::Tensor nll =
        label_smoothing > 0
            ? cs::sum(cs::mul(cs::cross_entropy(flat, labels, -100, 0.0, cs::Reduction::None), wf))
            : total;
    perplexity->update(labels_bt, nll, w);
  }
  if (accuracy) accuracy->update(labels_bt, cs::cast(cs::argmax(logits, -1), labels_bt.dtype()), w);
  return loss;
}

Seq2SeqModel::Seq2SeqModel(std::string type_name, const char* name, const BatchLimits& limits,
                           double label_smoothing)
    : Model(std::move(type_name)),
      name_(name),
      limits_(limits),
      label_smoothing_(label_smoothing),
      perplexity_(std::make_shared<cs::metrics::PerplexityMetric>("eval/lm_perplexity")),
      accuracy_(std::make_shared<cs::metrics::AccuracyMetric>("eval/accuracy")) {}

void Seq2SeqModel::check_batch_values(const cs::Batch& batch) const {
  check_values(name_, batch, limits_);
}

double Seq2SeqModel::loss_weight(const cs::Batch& batch) const {
  auto it = batch.find("decoder_attention_mask");
  return it == batch.end() ? Model::loss_weight(batch) : token_count(it->second);
}

cs::Tensor Seq2SeqModel::loss(const cs::Batch& batch) {
  Seq2SeqBatch b = read(batch);
  const bool eval = !is_training();
  return masked_token_loss(logits_of(b), b, label_smoothing_, eval ? perplexity_.get() : nullptr,
                           eval ? accuracy_.get() : nullptr);
}

}  // namespace modelzoo::seq2seq
