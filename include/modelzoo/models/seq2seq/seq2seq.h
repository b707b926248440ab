// Shared by the encoder-decoder models ("transformer", "t5"): the batch they read, its checks,
// and the masked token loss.
//
// Batch keys (all [B, S] or [B, T], integer): "input_ids" (source tokens), "attention_mask"
// (1 = real source token), "decoder_input_ids" (target tokens shifted right),
// "decoder_attention_mask" (1 = real target token, counted in the loss), "labels" (the target
// tokens to predict; -100 is ignored like torch's ignore_index).
//
// Loss = sum_t CE_t * decoder_attention_mask_t / sum_t decoder_attention_mask_t, with
// torch.nn.functional.cross_entropy's label smoothing when it is > 0.
#pragma once
#include <cstdint>
#include <memory>

#include "cstorch/metrics.h"
#include "cstorch/runtime.h"
#include "cstorch/tensor.h"
#include "modelzoo/model.h"

namespace modelzoo::seq2seq {

struct Seq2SeqBatch {
  cstorch::Tensor input_ids, attention_mask;
  cstorch::Tensor decoder_input_ids, decoder_attention_mask, labels;
};

struct BatchLimits {
  int64_t src_vocab_size = 0, tgt_vocab_size = 0;
  int64_t src_max_positions = 0, tgt_max_positions = 0;
};

// Reads and checks the five keys. Errors (each names the model and the key): a missing key;
// not a 2-d integer tensor; attention_mask not shaped like input_ids; decoder_attention_mask or
// labels not shaped like decoder_input_ids; encoder and decoder batch sizes that differ; a
// source or target length past its max positions; eagerly (outside a trace) also a token id
// outside its vocabulary (input_ids, decoder_input_ids) or a label outside [0, V) that is not
// -100, or a mask value other than 0 and 1, named with its [row, column].
Seq2SeqBatch read_batch(const char* model, const cstorch::Batch& batch, const BatchLimits& lim);
// The value checks of read_batch alone, on the keys that are present as 2-d integer tensors.
void check_values(const char* model, const cstorch::Batch& batch, const BatchLimits& lim);

// Host checks of a [B, T] batch entry, named "<model>: <key>[b, t] = v ..." in errors; the
// values are not read inside a trace (its tensors have sizes only). check_token_ids: an integer
// tensor [B, T] (checked in a trace too) of ids in [0, vocab), or the ignore index -100 where
// allowed. check_mask_values: every value 0 or 1 (a mask is a weight: 2 would count a token
// twice).
void check_token_ids(const char* model, const char* key, const cstorch::Tensor& ids, int64_t vocab,
                     bool allow_ignore = false);
void check_mask_values(const char* model, const char* key, const cstorch::Tensor& mask);
// batch[key] when present as a `dim`-d integer tensor, else nullptr (left to the model's loss(),
// which names what is wrong).
const cstorch::Tensor* batch_entry(const cstorch::Batch& batch, const char* key, int64_t dim);

// The tokens a mask [B, T] counts (its sum; host values): a token model's loss_weight.
double token_count(const cstorch::Tensor& mask);

// Masked token loss of any token model (the seq2seq models and GPT-2): logits [B, T, V],
// labels [B, T] (-100 ignored), mask [B, T] (1 = counted); sum_t CE_t * mask_t / sum_t mask_t.
// With metrics given (eval) it also updates perplexity (of the unsmoothed cross-entropy) and
// accuracy over the counted tokens.
cstorch::Tensor masked_token_loss(const cstorch::Tensor& logits, const cstorch::Tensor& labels,
                                  const cstorch::Tensor& mask, double label_smoothing,
                                  cstorch::metrics::PerplexityMetric* perplexity = nullptr,
                                  cstorch::metrics::AccuracyMetric* accuracy = nullptr);
// The loss above for a seq2seq batch (labels, decoder_attention_mask).
inline cstorch::Tensor masked_token_loss(const cstorch::Tensor& logits, const Seq2SeqBatch& b,
                                         double label_smoothing,
                                         cstorch::metrics::PerplexityMetric* perplexity = nullptr,
                                         cstorch::metrics::AccuracyMetric* accuracy = nullptr) {
  return masked_token_loss(logits, b.labels, b.decoder_attention_mask, label_smoothing, perplexity,
                           accuracy);
}

// An encoder-decoder model over the batch above: reads and checks the batch, and computes the
// masked token loss (with the eval metrics "eval/lm_perplexity" and "eval/accuracy"). A model
// supplies its limits and label smoothing at construction and its logits from a checked batch.
class Seq2SeqModel : public Model {
 public:
  // `name` is the registered model name (used in errors).
  Seq2SeqModel(std::string type_name, const char* name, const BatchLimits& limits,
               double label_smoothing);
  // Logits [B, T, tgt_vocab_size] of a batch (checks as in loss()).
  cstorch::Tensor logits(const cstorch::Batch& batch) { return logits_of(read(batch)); }
  cstorch::Tensor loss(const cstorch::Batch& batch) override;
  double loss_weight(const cstorch::Batch& batch) const override;       // unmasked tokens
  void check_batch_values(const cstorch::Batch& batch) const override;  // as read_batch

 protected:
  virtual cstorch::Tensor logits_of(const Seq2SeqBatch& b) = 0;
  Seq2SeqBatch read(const cstorch::Batch& batch) const { return read_batch(name_, batch, limits_); }

 private:
  const char* name_;
  BatchLimits limits_;
  double label_smoothing_;
  std::shared_ptr<cstorch::metrics::PerplexityMetric> perplexity_;
  std::shared_ptr<cstorch::metrics::AccuracyMetric> accuracy_;
};

}  // namespace modelzoo::seq2seq
