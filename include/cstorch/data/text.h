// Text data for the transformer models: an embedded synthetic corpus (no download), writers of
// every model's files from it, and restartable loaders that build the models' batches (GPT
// language modelling, BERT masked LM + next sentence, T5 span corruption, translation pairs).
// File formats and processor keys: docs/data.md.
//
// Every loader returns i32 tensors and follows the DatasetLoader contract (cstorch/data/
// dataset.h): samples in epoch_indices order (seeded shuffle, sharded by worker), batches of
// batch_size (the last one dropped when drop_last), restartable state {epoch, position,
// samples_streamed, num_samples, batch_size}. Random choices that change per epoch (BERT's
// masking, T5's noise spans) are drawn from a counter-based generator keyed by (seed, epoch,
// sample index), so a resumed loader reproduces the same stream exactly.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cstorch/data/dataset.h"
#include "cstorch/data/tokens.h"

namespace cstorch::data {

// ---------------------------------------------------------------------------------------------
// Synthetic corpus

// Special tokens of the synthetic vocabulary (ids 0..5, in this order).
struct SyntheticVocab {
  static constexpr int64_t pad = 0;   // "<pad>"
  static constexpr int64_t eos = 1;   // "<|endoftext|>": end of a document / sequence
  static constexpr int64_t cls = 2;   // "[CLS]"
  static constexpr int64_t sep = 3;   // "[SEP]"
  static constexpr int64_t mask = 4;  // "[MASK]"
  static constexpr int64_t bos = 5;   // "<s>": decoder start of the translation task
  static const std::vector<std::string>& special_tokens();
};

struct SyntheticTextOptions {
  int64_t train_documents = 4000;
  int64_t val_documents = 200;
  uint64_t seed = 2024;
  int64_t vocab_size = 512;  // of the BPE vocabulary trained on the training documents
};

// `n` documents of English-like sentences, each a list of sentences (text ending in '.').
// A document is about one person whose facts (city, job, pet, age, relatives) are fixed by the
// name, mixed with random descriptive sentences, small sums and counting runs, so a language
// model can learn facts, agreement and arithmetic beyond word frequencies. Deterministic in
// (n, seed) on every machine; document i depends only on (i, seed).
std::vector<std::vector<std::string>> synthetic_documents(int64_t n, uint64_t seed);

// The target side of the synthetic translation task for a source sentence: its words in
// reverse order, each word mapped to a fixed pseudo-word (numbers and punctuation kept), with
// the final '.' kept last.
std::string synthetic_translate(const std::string& sentence);

// Writers (into `dir`, created if missing; every file written whole then renamed). Each also
// writes vocab.json and merges.txt (BPE trained on the training documents) when missing.
// Splits are "train" and "val".
//  * gpt:         {split}/data_0.h5, GPT HDF5 (N, 3, msl) of the document stream (documents
//                 joined by eos) in windows of msl + 1 tokens; and {split}.bin, the same stream
//                 as flat uint16 tokens.
//  * bert:        {split}/data_0.h5 in the BERT row format (docs/data.md) with sequences of
//                 at most msl tokens, half of the pairs with a random second segment.
//  * t5:          {split}.bin, flat uint16 tokens of the document stream.
//  * translation: {split}.src and {split}.tgt, one sentence per line as space-separated ids
//                 (source: a corpus sentence; target: synthetic_translate of it).
//  * jsonl:       {split}.jsonl, one document per line as {"text": "..."} (its sentences
//                 joined by spaces), for the JSONLTextDataProcessor example.
void write_synthetic_gpt_data(const std::string& dir, int64_t msl,
                              const SyntheticTextOptions& o = {});
void write_synthetic_bert_data(const std::string& dir, int64_t msl,
                               const SyntheticTextOptions& o = {});
void write_synthetic_t5_data(const std::string& dir, const SyntheticTextOptions& o = {});
void write_synthetic_translation_data(const std::string& dir, const SyntheticTextOptions& o = {});
void write_synthetic_jsonl_data(const std::string& dir, const SyntheticTextOptions& o = {});

// ---------------------------------------------------------------------------------------------
// Loaders

// A restartable loader whose batches are built by `make(indices, epoch)` from sample indices
// drawn as DatasetLoader draws them (options: batch_size, shuffle, seed, drop_last, worker;
// batch_transform is applied to each batch).
class IndexBatchLoader : public DatasetLoader {
 public:
  using MakeBatch = std::function<Batch(const std::vector<int64_t>& indices, int64_t epoch)>;
  IndexBatchLoader(int64_t num_samples, LoaderOptions opts, MakeBatch make);

 protected:
  Batch fetch(const std::vector<int64_t>& indices, int64_t epoch) const override;

 private:
  MakeBatch make_;
};

// GPT language modelling: HDF5 (N, 3, msl) files (`hdf5`: a directory or file list) or one flat
// token file (msl + 1 windows). Batch: "input_ids", "attention_mask" (1 = counted in the
// loss), "labels", each i32 [B, msl]. Errors: a file msl above max_sequence_length; an input id
// (or a label where the mask is 1) outside 0..vocab_size-1 (naming file, row and value).
struct GptDataOptions {
  std::vector<std::string> hdf5_files;  // or
  std::string flat_file;
  TokenType token_type = TokenType::u16;  // flat files
  int64_t max_sequence_length = 0;        // flat files: the window; HDF5: an upper bound
  int64_t vocab_size = 0;                 // > 0: ids are checked
};
std::shared_ptr<utils::data::Loader> make_gpt_loader(const GptDataOptions& d,
                                                     const LoaderOptions& o);

// BERT pre-training rows (HDF5, docs/data.md) with dynamic masking: each epoch, every token
// other than [CLS], [SEP] and padding is selected with probability mlm_probability; a selected
// token becomes [MASK] (80%), a random non-special token (10%) or stays (10%). Batch:
// "input_ids", "attention_mask", "token_type_ids", "mlm_labels" (the original id where
// selected, -100 elsewhere), each i32 [B, msl]; "next_sentence_label" i32 [B] (1 = the second
// segment is a random one). Errors: missing datasets or attributes, shapes that disagree, rows
// longer than max_sequence_length, ids outside the vocabulary (file, row, value).
struct BertDataOptions {
  std::vector<std::string> files;  // HDF5 files, or one directory of *.h5
  int64_t max_sequence_length = 0;
  int64_t vocab_size = 0;  // required
  double mlm_probability = 0.15;
  uint64_t mask_seed = 0;
};
std::shared_ptr<utils::data::Loader> make_bert_loader(const BertDataOptions& d,
                                                      const LoaderOptions& o);
// The masking of one row (exposed for tests): returns {masked ids, labels}. Each non-special
// token within `length` is predicted with probability mlm_probability (80% replaced by
// mask_id, 10% by a random non-special token, 10% kept); a row whose draws predict none
// predicts the token of the lowest draw, so every row with such a token predicts at least one.
std::pair<std::vector<int32_t>, std::vector<int32_t>> bert_mask_row(
    const std::vector<int32_t>& ids, int64_t length, int64_t vocab_size, double mlm_probability,
    int64_t mask_id, const std::vector<int64_t>& special_ids, uint64_t key);

// T5 span corruption. `t5_span_lengths` is T5's random_spans_helper: for an encoder length
// (inputs_length) the raw tokens per sample and the targets length. `t5_noise_mask` is
// random_spans_noise_mask: noise spans alternating with kept spans (kept first), span counts
// from the density and mean span length, span lengths a random segmentation.
std::pair<int64_t, int64_t> t5_span_lengths(int64_t inputs_length, double noise_density,
                                            double mean_noise_span_length);
std::vector<bool> t5_noise_mask(int64_t length, double noise_density, double mean_noise_span_length,
                                uint64_t key);
// inputs: kept spans with each noise span replaced by one sentinel, then eos; targets: each
// noise span after its sentinel, then eos. Sentinel k (k = 0, 1, ...) is vocab_size - 1 - k.
std::pair<std::vector<int32_t>, std::vector<int32_t>> t5_corrupt(const std::vector<int32_t>& tokens,
                                                                 const std::vector<bool>& noise,
                                                                 int64_t vocab_size,
                                                                 int64_t eos_id);

// T5 over a flat token file, cut into samples of t5_span_lengths' tokens_length and corrupted
// afresh each epoch. Batch (i32): "input_ids", "attention_mask" [B, S]; "decoder_input_ids",
// "decoder_attention_mask", "labels" [B, T] with S = max_sequence_length and T =
// max_target_length (0: the derived targets length); labels padded with pad_id where the
// decoder mask is 0, decoder_input_ids = labels shifted right after decoder_start_id. Errors:
// T below the derived targets length, a token in the sentinel range or outside the
// vocabulary, a file with fewer tokens than one sample.
struct T5DataOptions {
  std::string file;
  TokenType token_type = TokenType::u16;
  int64_t vocab_size = 0;  // including the extra_ids sentinels at the top
  int64_t extra_ids = 100;
  int64_t max_sequence_length = 0;
  int64_t max_target_length = 0;
  double noise_density = 0.15;
  double mean_noise_span_length = 3.0;
  int64_t eos_id = SyntheticVocab::eos;
  int64_t pad_id = SyntheticVocab::pad;
  int64_t decoder_start_id = SyntheticVocab::pad;
  uint64_t noise_seed = 0;
};
std::shared_ptr<utils::data::Loader> make_t5_loader(const T5DataOptions& d, const LoaderOptions& o);

// Translation pairs: two text files with one sentence per line as space-separated token ids,
// line i of one translating line i of the other. Read whole when built (the loader shares
// them between workers). Source: ids then eos; labels: target ids then eos;
// decoder_input_ids: start_id then target ids. Batch (i32) as for T5 with S =
// max_sequence_length, T = max_target_length. Errors: files with different line counts, an
// empty line, a value that is not an integer or is outside the vocabulary (file, line,
// value), a sentence longer than the length allows (file, line, length, limit).
struct ParallelDataOptions {
  std::string source_file, target_file;
  int64_t vocab_size = 0;
  int64_t max_sequence_length = 0;
  int64_t max_target_length = 0;
  int64_t eos_id = SyntheticVocab::eos;
  int64_t pad_id = SyntheticVocab::pad;
  int64_t start_id = SyntheticVocab::bos;
};
struct ParallelCorpus;  // the loaded sentences
std::shared_ptr<const ParallelCorpus> load_parallel_corpus(const ParallelDataOptions& d);
int64_t parallel_corpus_size(const ParallelCorpus& c);
std::shared_ptr<utils::data::Loader> make_parallel_loader(std::shared_ptr<const ParallelCorpus> c,
                                                          const LoaderOptions& o);

// Reads a file of token-id lines (as the translation files hold). Errors as above.
std::vector<std::vector<int32_t>> read_token_lines(const std::string& path, int64_t vocab_size);

}  // namespace cstorch::data
