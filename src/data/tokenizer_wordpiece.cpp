// WordPiece (BERT): the basic tokenizer, reading vocab.txt, greedy longest-match-first
// sub-words (see cstorch/data/tokenizer.h).
#include <filesystem>
#include <fstream>

#include "cstorch/core/error.h"
#include "cstorch/data/tokenizer.h"
#include "data/unicode.h"

namespace cstorch::data {

namespace uni = unicode;

namespace {

// Python's str.split() separators (White_Space) plus BERT's own whitespace (Zs).
bool split_space(uint32_t cp) {
  return uni::is_whitespace(cp) || uni::bert_is_whitespace(cp);
}

std::string utf8(const std::vector<uint32_t>& cps, size_t from, size_t to) {
  std::string s;
  for (size_t i = from; i < to; ++i) uni::append_utf8(cps[i], &s);
  return s;
}

}  // namespace

std::vector<std::string> bert_basic_tokenize(std::string_view text, bool lower_case,
                                             bool strip_accents) {
  // Clean (drop NUL, U+FFFD and controls; whitespace becomes a space) and put spaces around
  // CJK ideographs, then split on whitespace.
  std::vector<std::vector<uint32_t>> words(1);
  auto cut = [&] {
    if (!words.back().empty()) words.emplace_back();
  };
  for (const auto& c : uni::decode_utf8(text)) {
    uint32_t cp = c.valid ? c.cp : 0xFFFD;  // an invalid byte is dropped like U+FFFD
    if (cp == 0 || cp == 0xFFFD || uni::bert_is_control(cp)) continue;
    if (split_space(cp)) {
      cut();
    } else if (uni::is_cjk(cp)) {
      cut();
      words.back().push_back(cp);
      cut();
    } else {
      words.back().push_back(cp);
    }
  }
  std::vector<std::string> out;
  std::vector<uint32_t> a, b;
  for (auto& w : words) {
    if (w.empty()) continue;
    if (lower_case) {
      a.clear();
      for (uint32_t cp : w) uni::lower(cp, &a);
      w.swap(a);
    }
    if (strip_accents) {
      b.clear();
      for (uint32_t cp : w) uni::strip_accents(cp, &b);
      w.swap(b);
    }
    // Each punctuation character is a token of its own.
    size_t start = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      if (!uni::bert_is_punctuation(w[i])) continue;
      if (i > start) out.push_back(utf8(w, start, i));
      out.push_back(utf8(w, i, i + 1));
      start = i + 1;
    }
    if (start < w.size()) out.push_back(utf8(w, start, w.size()));
  }
  return out;
}

WordPieceTokenizer WordPieceTokenizer::from_file(const std::string& path, WordPieceOptions opts) {
  const char* what = "WordPieceTokenizer";
  CS_CHECK(std::filesystem::is_regular_file(path), "{}: '{}': no such file", what, path);
  std::ifstream f(path, std::ios::binary);
  CS_CHECK(f.good(), "{}: cannot open '{}'", what, path);
  CS_CHECK(opts.max_input_chars_per_word >= 1,
           "{}: max_input_chars_per_word must be at least 1, got {}", what,
           opts.max_input_chars_per_word);
  WordPieceTokenizer t;
  t.o_ = std::move(opts);
  t.path_ = path;
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(f, line)) lines.push_back(line);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string tok = lines[i];
    size_t a = tok.find_first_not_of(" \t\r"), b = tok.find_last_not_of(" \t\r");
    tok = a == std::string::npos ? "" : tok.substr(a, b - a + 1);
    if (tok.empty()) {
      bool rest_blank = true;
      for (size_t k = i; k < lines.size(); ++k)
        if (lines[k].find_first_not_of(" \t\r") != std::string::npos) rest_blank = false;
      if (rest_blank) break;  // trailing blank lines
      fail(
          "{}: '{}' line {}: empty line (every line holds one token; its id is the line number "
          "from 0)",
          what, path, i + 1);
    }
    auto [it, fresh] = t.vocab_.emplace(tok, static_cast<int64_t>(t.tokens_.size()));
    CS_CHECK(fresh, "{}: '{}' line {}: token \"{}\" already on line {}", what, path, i + 1, tok,
             it->second + 1);
    t.tokens_.push_back(tok);
  }
  CS_CHECK(!t.tokens_.empty(), "{}: '{}': no tokens (an empty file)", what, path);
  t.unk_id_ = t.token_to_id(t.o_.unk_token);
  CS_CHECK(t.unk_id_ >= 0, "{}: '{}': the unknown token \"{}\" is not in the vocabulary", what,
           path, t.o_.unk_token);
  return t;
}

int64_t WordPieceTokenizer::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string& WordPieceTokenizer::id_to_token(int64_t id) const {
  CS_CHECK(id >= 0 && id < vocab_size(),
           "WordPieceTokenizer: id {} is not in the vocabulary '{}' (ids 0..{})", id, path_,
           vocab_size() - 1);
  return tokens_[static_cast<size_t>(id)];
}

void WordPieceTokenizer::wordpiece(const std::string& word, std::vector<std::string>* out) const {
  std::vector<uni::Char> cs = uni::decode_utf8(word);
  if (static_cast<int64_t>(cs.size()) > o_.max_input_chars_per_word) {
    out->push_back(o_.unk_token);
    return;
  }
  std::vector<std::string> subs;
  size_t start = 0;
  while (start < cs.size()) {
    // The longest prefix of the rest that is in the vocabulary ("##" marks a continuation).
    size_t end = cs.size();
    std::string found;
    while (start < end) {
      size_t to = end < cs.size() ? cs[end].pos : word.size();
      std::string sub = (start > 0 ? "##" : "") + word.substr(cs[start].pos, to - cs[start].pos);
      if (vocab_.count(sub)) {
        found = std::move(sub);
        break;
      }
      --end;
    }
    if (found.empty()) {
      out->push_back(o_.unk_token);
      return;
    }
    subs.push_back(std::move(found));
    start = end;
  }
  out->insert(out->end(), subs.begin(), subs.end());
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (const auto& w : bert_basic_tokenize(text, o_.lower_case, o_.strip_accents))
    wordpiece(w, &out);
  return out;
}

std::vector<int64_t> WordPieceTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> ids;
  for (const auto& t : tokenize(text)) ids.push_back(vocab_.at(t));
  return ids;
}

std::string WordPieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    CS_CHECK(ids[k] >= 0 && ids[k] < vocab_size(),
             "WordPieceTokenizer.decode: id {} at position {} is not in the vocabulary '{}' (ids "
             "0..{})",
             ids[k], k, path_, vocab_size() - 1);
    const std::string& t = tokens_[static_cast<size_t>(ids[k])];
    if (t.rfind("##", 0) == 0 && !out.empty())
      out += t.substr(2);
    else
      out += (out.empty() ? "" : " ") + t;
  }
  return out;
}

}  // namespace cstorch::data
