// Tokenizers that read the standard files, and a small byte-level BPE trainer.
//
//   auto bpe = data::BpeTokenizer::from_files("vocab.json", "merges.txt");   // GPT-2 style
//   std::vector<int64_t> ids = bpe.encode("Hello world");                     // {15496, 995}
//   std::string text = bpe.decode(ids);                                        // "Hello world"
//   auto wp = data::WordPieceTokenizer::from_file("vocab.txt");               // BERT style
//   wp.tokenize("Unaffable!");                               // {"una", "##ff", "##able", "!"}
//
// * BpeTokenizer: GPT-2's byte-level BPE. Text is split into pieces by GPT-2's pre-tokenisation
//   pattern  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+  (written
//   by hand, no regex library); each piece's UTF-8 bytes are mapped to printable characters by
//   GPT-2's byte-to-unicode table and merged by the ranked merges of merges.txt (lowest rank
//   first, every occurrence left to right), and the merged symbols are looked up in vocab.json.
//   Special tokens (e.g. "<|endoftext|>") are matched literally before pre-tokenisation.
// * WordPieceTokenizer: BERT's basic tokenizer (clean control characters, split CJK
//   ideographs, whitespace split, optional lower-casing and accent stripping, punctuation
//   split) followed by greedy longest-match-first WordPiece with "##" continuations; a word
//   longer than max_input_chars_per_word characters, or one that cannot be covered by the
//   vocabulary, becomes the unknown token.
//
// Unicode: text is UTF-8. Letter / number / punctuation / control classes, lower-casing
// (Python's str.lower) and accent stripping (NFD, then drop non-spacing marks) come from tables
// generated from the Unicode 14.0 database (scripts/gen_unicode_tables.py), so they agree with
// Python 3.10's unicodedata. Invalid UTF-8 bytes are kept as single "other" characters, so
// byte-level BPE still round-trips them.
//
// Errors (cstorch::Error) name the file and line (or JSON position) of a malformed vocabulary or
// merges file, and the token or id that is unknown when encoding or decoding.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cstorch::data {

// GPT-2's pre-tokenisation of `text` into pieces (concatenated they give `text` back).
std::vector<std::string> gpt2_pretokenize(std::string_view text);

// GPT-2's byte-to-unicode map: byte b -> the UTF-8 text of the printable character standing for
// it in vocab.json / merges.txt (printable ASCII and Latin-1 bytes stand for themselves; the
// others are U+0100 + k, e.g. the space byte is "Ġ").
const std::string& byte_to_unicode(uint8_t b);

class BpeTokenizer {
 public:
  // Reads vocab.json (an object token -> id, ids non-negative and unique) and merges.txt (an
  // optional "#version" first line, then one "left right" pair per line, highest priority
  // first; blank lines are skipped). `special_tokens`: vocabulary entries matched literally in
  // the text before pre-tokenisation; by default every vocabulary entry of the form <|...|>.
  // Errors: a file that cannot be read; invalid JSON (naming line and column), a non-object, a
  // non-integer or negative id, two tokens with one id; a merges line without exactly two
  // fields, a duplicated merge, or a merge whose parts or result are not in the vocabulary
  // (naming file and line); a special token not in the vocabulary.
  static BpeTokenizer from_files(
      const std::string& vocab_json, const std::string& merges_txt,
      std::optional<std::vector<std::string>> special_tokens = std::nullopt);

  // Token ids of `text`. Errors: a merged symbol missing from the vocabulary (a vocabulary
  // without all 256 byte symbols), naming the symbol and the piece of text.
  std::vector<int64_t> encode(std::string_view text) const;
  // The token strings (in vocab.json's byte-mapped form) of `text`.
  std::vector<std::string> tokenize(std::string_view text) const;
  // The UTF-8 bytes the ids stand for (special tokens as their text). Errors: an id outside the
  // vocabulary, naming it and its position.
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }
  // -1 when absent.
  int64_t token_to_id(const std::string& token) const;
  const std::string& id_to_token(int64_t id) const;  // error outside the vocabulary
  int64_t num_merges() const { return static_cast<int64_t>(ranks_.size()); }

 private:
  BpeTokenizer() = default;
  void encode_piece(const std::string& piece, std::vector<int64_t>* out) const;
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> id_to_token_;  // "" for ids no token has
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, int32_t> ranks_;   // (left id << 32 | right id) -> rank
  std::unordered_map<uint64_t, int64_t> merged_;  // same key -> id of the merged token
  std::vector<std::string> specials_;             // longest first
  std::string vocab_path_;
  int64_t byte_ids_[256];  // vocabulary id of each byte's symbol (-1 if missing)
  // Encoded pieces (the merge loop is the expensive part and text repeats words).
  mutable std::shared_ptr<std::mutex> cache_m_ = std::make_shared<std::mutex>();
  mutable std::shared_ptr<std::unordered_map<std::string, std::vector<int64_t>>> cache_ =
      std::make_shared<std::unordered_map<std::string, std::vector<int64_t>>>();
};

struct BpeTrainerOptions {
  int64_t vocab_size = 1000;  // total, including the special tokens and the 256 byte symbols
  int64_t min_frequency = 2;  // a pair seen fewer times (weighted by word count) is not merged
  std::vector<std::string> special_tokens;  // ids 0, 1, ... in this order
};

// Trains byte-level BPE on `texts` (pre-tokenised as in gpt2_pretokenize) and writes vocab.json
// and merges.txt readable by BpeTokenizer::from_files (and by GPT-2 tooling). Vocabulary: the
// special tokens, then the 256 byte symbols in byte order, then one token per merge. Each step
// merges the most frequent adjacent pair (ties: the smaller pair of token strings); training
// stops at vocab_size or when no pair reaches min_frequency. Deterministic. Returns the number
// of merges. Errors: vocab_size smaller than the specials plus 256, a duplicated special token,
// a file that cannot be written.
int64_t train_bpe(const std::vector<std::string>& texts, const BpeTrainerOptions& opts,
                  const std::string& vocab_json, const std::string& merges_txt);

// BERT's BasicTokenizer: the words and punctuation marks of `text` (lower-cased and with
// accents stripped when asked).
std::vector<std::string> bert_basic_tokenize(std::string_view text, bool lower_case,
                                             bool strip_accents);

struct WordPieceOptions {
  bool lower_case = true;
  bool strip_accents = true;  // NFD, then drop non-spacing marks (BERT does this when lower-casing)
  std::string unk_token = "[UNK]";
  int64_t max_input_chars_per_word = 100;
};

class WordPieceTokenizer {
 public:
  // Reads vocab.txt: one token per line, id = line number from 0 (a trailing '\r' and
  // surrounding spaces are removed). Errors: a file that cannot be read, an empty line before
  // the end, a duplicated token (naming both lines), no line at all, the unknown token missing.
  static WordPieceTokenizer from_file(const std::string& vocab_txt, WordPieceOptions opts = {});

  std::vector<std::string> tokenize(std::string_view text) const;
  std::vector<int64_t> encode(std::string_view text) const;
  // Tokens joined by spaces with "##" continuations glued on (BERT's convert_tokens_to_string).
  // Errors: an id outside the vocabulary.
  std::string decode(const std::vector<int64_t>& ids) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  int64_t token_to_id(const std::string& token) const;  // -1 when absent
  const std::string& id_to_token(int64_t id) const;
  int64_t unk_id() const { return unk_id_; }

 private:
  WordPieceTokenizer() = default;
  void wordpiece(const std::string& word, std::vector<std::string>* out) const;
  WordPieceOptions o_;
  std::unordered_map<std::string, int64_t> vocab_;
  std::vector<std::string> tokens_;
  std::string path_;
  int64_t unk_id_ = -1;
};

}  // namespace cstorch::data
