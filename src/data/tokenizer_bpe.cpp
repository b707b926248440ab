// Byte-level BPE (GPT-2): pre-tokenisation, the byte-to-unicode map, reading vocab.json and
// merges.txt, encoding, decoding, and the trainer (see cstorch/data/tokenizer.h).
#include <algorithm>
#include <climits>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cstorch/core/error.h"
#include "cstorch/data/tokenizer.h"
#include "data/unicode.h"

namespace cstorch::data {

namespace {

namespace uni = unicode;

enum class Cls { Space, Letter, Number, Other };

Cls classify(const uni::Char& c) {
  if (!c.valid) return Cls::Other;
  if (uni::is_whitespace(c.cp)) return Cls::Space;
  if (uni::is_letter(c.cp)) return Cls::Letter;
  if (uni::is_number(c.cp)) return Cls::Number;
  return Cls::Other;
}

struct ByteMap {
  std::string to_text[256];
  std::unordered_map<uint32_t, uint8_t> from_cp;
  ByteMap() {
    // Bytes that are printable in Latin-1 stand for themselves; the rest (controls, space,
    // DEL, NBSP, soft hyphen) take U+0100, U+0101, ... in byte order.
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      uni::append_utf8(cp, &to_text[b]);
      from_cp[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// vocab.json nesting refused while parsing (a vocabulary is one flat object).
constexpr int kMaxVocabDepth = 64;

// A JSON value for a message: scalars as written (long ones cut), containers by kind and size,
// never dumped whole.
std::string short_json(const nlohmann::json& v) {
  if (v.is_object() || v.is_array())
    return fmt::format("{} ({} entries)", v.is_object() ? "an object" : "an array", v.size());
  std::string s = v.dump();
  return s.size() <= 60 ? s : s.substr(0, 57) + "...";
}

std::string read_file(const std::string& path, const char* what) {
  CS_CHECK(std::filesystem::is_regular_file(path), "{}: '{}': no such file", what, path);
  std::ifstream f(path, std::ios::binary);
  CS_CHECK(f.good(), "{}: cannot open '{}'", what, path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Line and column (from 1) of byte offset `pos` in `text`.
std::pair<size_t, size_t> line_col(const std::string& text, size_t pos) {
  pos = std::min(pos, text.size());
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

uint64_t pair_key(int64_t a, int64_t b) {
  return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b);
}

}  // namespace

const std::string& byte_to_unicode(uint8_t b) {
  return byte_map().to_text[b];
}

std::vector<std::string> gpt2_pretokenize(std::string_view text) {
  // The pattern's alternatives are tried in order at each match start, as the regex engine
  // does:  's|'t|'re|'ve|'m|'ll|'d | ' '?L+ | ' '?N+ | ' '?[^\sLN]+ | \s+(?!\S) | \s+
  std::vector<uni::Char> cs = uni::decode_utf8(text);
  std::vector<Cls> cls(cs.size());
  for (size_t i = 0; i < cs.size(); ++i) cls[i] = classify(cs[i]);
  const size_t n = cs.size();
  auto ascii = [&](size_t i) -> char {
    return i < n && cs[i].valid && cs[i].cp < 0x80 ? static_cast<char>(cs[i].cp) : '\0';
  };
  std::vector<std::string> out;
  size_t i = 0;
  while (i < n) {
    size_t end = i;
    if (ascii(i) == '\'') {
      char a = ascii(i + 1), b = ascii(i + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        end = i + 3;
    }
    if (end == i) {
      size_t j = i;
      if (ascii(j) == ' ' && j + 1 < n && cls[j + 1] != Cls::Space) ++j;
      if (j < n && cls[j] != Cls::Space) {
        // One run of letters, of numbers, or of anything else that is not whitespace.
        Cls c = cls[j];
        while (j < n && cls[j] == c) ++j;
        end = j;
      }
    }
    if (end == i) {
      // Whitespace: the run, less its last character when a non-space follows (that one
      // goes with the next piece as its optional leading space); a single whitespace
      // character before a non-space is a piece of its own.
      size_t j = i;
      while (j < n && cls[j] == Cls::Space) ++j;
      end = (j < n && j - i > 1) ? j - 1 : j;
    }
    size_t from = cs[i].pos, to = end < n ? cs[end].pos : text.size();
    out.emplace_back(text.substr(from, to - from));
    i = end;
  }
  return out;
}

namespace {
// A merges line (or token) in an error: quoted whole, or a long one (a vocab.json given as the
// merges file: one line of a megabyte) by its first 80 bytes, cut at a character boundary.
std::string quote_line(const std::string& text) {
  size_t cut = std::min<size_t>(text.size(), 80);
  while (cut > 0 && cut < text.size() && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80)
    --cut;
  if (cut == text.size()) return "\"" + text + "\"";
  return fmt::format("\"{}...\" ({} bytes; is it a merges file?)", text.substr(0, cut),
                     text.size());
}
}  // namespace

BpeTokenizer BpeTokenizer::from_files(const std::string& vocab_json, const std::string& merges_txt,
                                      std::optional<std::vector<std::string>> special_tokens) {
  const char* what = "BpeTokenizer";
  BpeTokenizer t;
  t.vocab_path_ = vocab_json;
  std::string text = read_file(vocab_json, what);
  nlohmann::json j;
  try {
    // A vocabulary is one flat object; deeper nesting is refused while parsing, so a hostile
    // file cannot build a structure that is deep to walk or print.
    j = nlohmann::json::parse(
        text, [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
          if ((event == nlohmann::json::parse_event_t::object_start ||
               event == nlohmann::json::parse_event_t::array_start) &&
              depth >= kMaxVocabDepth)
            fail(
                "{}: '{}': JSON nested deeper than {} levels (the limit; a vocabulary is one "
                "object mapping tokens to ids)",
                what, vocab_json, kMaxVocabDepth);
          return true;
        });
  } catch (const nlohmann::json::parse_error& e) {
    auto [line, col] = line_col(text, e.byte > 0 ? e.byte - 1 : 0);
    fail("{}: '{}' line {} column {}: not valid JSON ({})", what, vocab_json, line, col, e.what());
  } catch (const nlohmann::json::exception& e) {
    // The parser's other errors carry no position, e.g. a number too large for a double
    // ("2e999": out_of_range.406).
    fail("{}: '{}': not valid JSON ({})", what, vocab_json, e.what());
  }
  CS_CHECK(j.is_object(), "{}: '{}': expected a JSON object mapping tokens to ids, got a {}", what,
           vocab_json, j.type_name());
  CS_CHECK(!j.empty(), "{}: '{}': the vocabulary is empty", what, vocab_json);
  int64_t max_id = -1;
  for (auto it = j.begin(); it != j.end(); ++it) {
    CS_CHECK(it.value().is_number_integer(),
             "{}: '{}': token \"{}\" has id {}, expected a non-negative integer", what, vocab_json,
             it.key(), short_json(it.value()));
    int64_t id = it.value().get<int64_t>();
    CS_CHECK(id >= 0 && id < INT32_MAX, "{}: '{}': token \"{}\" has id {}, outside 0..2^31-2", what,
             vocab_json, it.key(), id);
    max_id = std::max(max_id, id);
  }
  // The id table is sized by the largest id: a vocabulary's ids are close to dense, so one far
  // beyond the token count is damage, refused before gigabytes are allocated for it.
  const int64_t id_limit = static_cast<int64_t>(j.size()) * 16 + 65536;
  CS_CHECK(max_id < id_limit,
           "{}: '{}': the largest id is {} for only {} tokens (ids must be below {}: 16 times the "
           "token count plus 65536)",
           what, vocab_json, max_id, j.size(), id_limit);
  t.id_to_token_.assign(static_cast<size_t>(max_id + 1), std::string());
  t.has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (auto it = j.begin(); it != j.end(); ++it) {
    auto id = static_cast<size_t>(it.value().get<int64_t>());
    CS_CHECK(!t.has_id_[id], "{}: '{}': tokens \"{}\" and \"{}\" both have id {}", what, vocab_json,
             t.id_to_token_[id], it.key(), id);
    t.has_id_[id] = true;
    t.id_to_token_[id] = it.key();
    t.vocab_[it.key()] = static_cast<int64_t>(id);
  }
  for (int b = 0; b < 256; ++b) t.byte_ids_[b] = t.token_to_id(byte_map().to_text[b]);

  std::string merges = read_file(merges_txt, what);
  std::istringstream in(merges);
  std::string line;
  std::unordered_map<uint64_t, size_t> seen;  // pair -> line
  for (size_t lineno = 1; std::getline(in, line); ++lineno) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (lineno == 1 && line.rfind("#version", 0) == 0) continue;
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 >= line.size() ||
        line.find(' ', sp + 1) != std::string::npos)
      fail("{}: '{}' line {}: expected two tokens separated by one space, got {}", what, merges_txt,
           lineno, quote_line(line));
    std::string a = line.substr(0, sp), b = line.substr(sp + 1);
    int64_t ia = t.token_to_id(a), ib = t.token_to_id(b), im = t.token_to_id(a + b);
    for (auto [tok, id] : {std::pair{a, ia}, std::pair{b, ib}, std::pair{a + b, im}})
      CS_CHECK(id >= 0, "{}: '{}' line {}: merge {} uses token {}, which is not in '{}'", what,
               merges_txt, lineno, quote_line(line), quote_line(tok), vocab_json);
    uint64_t key = pair_key(ia, ib);
    auto [it, fresh] = seen.emplace(key, lineno);
    CS_CHECK(fresh, "{}: '{}' line {}: merge {} repeats line {}", what, merges_txt, lineno,
             quote_line(line), it->second);
    t.ranks_[key] = static_cast<int32_t>(t.ranks_.size());
    t.merged_[key] = im;
  }

  if (special_tokens) {
    for (const auto& s : *special_tokens) {
      CS_CHECK(!s.empty(), "{}: an empty special token", what);
      CS_CHECK(t.token_to_id(s) >= 0, "{}: special token \"{}\" is not in '{}'", what, s,
               vocab_json);
      t.specials_.push_back(s);
    }
  } else {
    for (const auto& [tok, id] : t.vocab_)
      if (tok.size() > 4 && tok.rfind("<|", 0) == 0 && tok.compare(tok.size() - 2, 2, "|>") == 0)
        t.specials_.push_back(tok);
  }
  // Longest first, so a special token that contains another wins.
  std::sort(t.specials_.begin(), t.specials_.end(), [](const std::string& x, const std::string& y) {
    return x.size() != y.size() ? x.size() > y.size() : x < y;
  });
  return t;
}

int64_t BpeTokenizer::token_to_id(const std::string& token) const {
  auto it = vocab_.find(token);
  return it == vocab_.end() ? -1 : it->second;
}

const std::string& BpeTokenizer::id_to_token(int64_t id) const {
  CS_CHECK(id >= 0 && id < vocab_size() && has_id_[static_cast<size_t>(id)],
           "BpeTokenizer: id {} is not in the vocabulary '{}' (ids 0..{})", id, vocab_path_,
           vocab_size() - 1);
  return id_to_token_[static_cast<size_t>(id)];
}

void BpeTokenizer::encode_piece(const std::string& piece, std::vector<int64_t>* out) const {
  {
    std::lock_guard<std::mutex> lock(*cache_m_);
    auto it = cache_->find(piece);
    if (it != cache_->end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int64_t> sym;
  sym.reserve(piece.size());
  for (unsigned char c : piece) {
    int64_t id = byte_ids_[c];
    if (id < 0)
      fail("BpeTokenizer: the byte 0x{:02X} of \"{}\" has no token (\"{}\") in '{}'", c, piece,
           byte_map().to_text[c], vocab_path_);
    sym.push_back(id);
  }
  // The merge loop: merge every occurrence of the best-ranked adjacent pair until none is
  // ranked. Pieces are short (a word), so a linear scan per step is the fast choice.
  while (sym.size() > 1) {
    int32_t best = INT32_MAX;
    uint64_t best_key = 0;
    for (size_t k = 0; k + 1 < sym.size(); ++k) {
      auto it = ranks_.find(pair_key(sym[k], sym[k + 1]));
      if (it != ranks_.end() && it->second < best) {
        best = it->second;
        best_key = it->first;
      }
    }
    if (best == INT32_MAX) break;
    int64_t merged = merged_.at(best_key);
    size_t w = 0;
    for (size_t k = 0; k < sym.size(); ++k) {
      if (k + 1 < sym.size() && pair_key(sym[k], sym[k + 1]) == best_key) {
        sym[w++] = merged;
        ++k;
      } else {
        sym[w++] = sym[k];
      }
    }
    sym.resize(w);
  }
  out->insert(out->end(), sym.begin(), sym.end());
  std::lock_guard<std::mutex> lock(*cache_m_);
  if (cache_->size() < 200000) cache_->emplace(piece, std::move(sym));
}

std::vector<int64_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out;
  size_t pos = 0;
  auto plain = [&](std::string_view chunk) {
    for (const auto& piece : gpt2_pretokenize(chunk)) encode_piece(piece, &out);
  };
  while (pos < text.size()) {
    // The earliest special token (longest at that position).
    size_t best = std::string_view::npos;
    const std::string* which = nullptr;
    for (const auto& s : specials_) {
      size_t f = text.find(s, pos);
      if (f < best) {
        best = f;
        which = &s;
      }
    }
    if (!which) {
      plain(text.substr(pos));
      break;
    }
    plain(text.substr(pos, best - pos));
    out.push_back(vocab_.at(*which));
    pos = best + which->size();
  }
  return out;
}

std::vector<std::string> BpeTokenizer::tokenize(std::string_view text) const {
  std::vector<std::string> out;
  for (int64_t id : encode(text)) out.push_back(id_to_token(id));
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (size_t k = 0; k < ids.size(); ++k) {
    int64_t id = ids[k];
    CS_CHECK(id >= 0 && id < vocab_size() && has_id_[static_cast<size_t>(id)],
             "BpeTokenizer.decode: id {} at position {} is not in the vocabulary '{}' (ids 0..{})",
             id, k, vocab_path_, vocab_size() - 1);
    const std::string& tok = id_to_token_[static_cast<size_t>(id)];
    if (std::find(specials_.begin(), specials_.end(), tok) != specials_.end()) {
      out += tok;
      continue;
    }
    for (const auto& c : unicode::decode_utf8(tok)) {
      auto it = byte_map().from_cp.find(c.cp);
      CS_CHECK(c.valid && it != byte_map().from_cp.end(),
               "BpeTokenizer.decode: token \"{}\" (id {}) holds a character that stands for no "
               "byte (U+{:04X}); '{}' is not a byte-level vocabulary",
               tok, id, c.cp, vocab_path_);
      out.push_back(static_cast<char>(it->second));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Trainer

namespace {

void write_text_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    CS_CHECK(f.good(), "train_bpe: cannot create '{}'", tmp);
    f << text;
    f.flush();
    CS_CHECK(f.good(), "train_bpe: writing '{}' failed", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  CS_CHECK(!ec, "train_bpe: renaming '{}' to '{}' failed: {}", tmp, path, ec.message());
}

}  // namespace

int64_t train_bpe(const std::vector<std::string>& texts, const BpeTrainerOptions& o,
                  const std::string& vocab_json, const std::string& merges_txt) {
  const int64_t base = static_cast<int64_t>(o.special_tokens.size()) + 256;
  CS_CHECK(o.vocab_size >= base,
           "train_bpe: vocab_size {} is smaller than the {} special tokens plus 256 byte symbols",
           o.vocab_size, o.special_tokens.size());
  CS_CHECK(o.min_frequency >= 1, "train_bpe: min_frequency must be at least 1, got {}",
           o.min_frequency);
  std::vector<std::string> tokens;
  std::unordered_map<std::string, int64_t> ids;
  auto add = [&](const std::string& tok) {
    auto [it, fresh] = ids.emplace(tok, static_cast<int64_t>(tokens.size()));
    CS_CHECK(fresh,
             "train_bpe: token \"{}\" appears twice (a special token repeated, or equal "
             "to a byte symbol)",
             tok);
    tokens.push_back(tok);
    return it->second;
  };
  for (const auto& s : o.special_tokens) {
    CS_CHECK(!s.empty(), "train_bpe: an empty special token");
    add(s);
  }
  int64_t byte_id[256];
  for (int b = 0; b < 256; ++b) byte_id[b] = add(byte_map().to_text[b]);

  // Unique words (pieces) with their counts, in first-seen order so ties break the same way
  // on every machine.
  std::unordered_map<std::string, size_t> index;
  std::vector<std::vector<int64_t>> words;
  std::vector<int64_t> counts;
  for (const auto& t : texts)
    for (const auto& piece : gpt2_pretokenize(t)) {
      auto [it, fresh] = index.emplace(piece, words.size());
      if (fresh) {
        std::vector<int64_t> w;
        for (unsigned char c : piece) w.push_back(byte_id[c]);
        words.push_back(std::move(w));
        counts.push_back(0);
      }
      ++counts[it->second];
    }

  // Pair counts, updated incrementally: each merge only touches the words holding the pair.
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<size_t>> where;  // pair -> words (may be stale)
  for (size_t w = 0; w < words.size(); ++w)
    for (size_t k = 0; k + 1 < words[w].size(); ++k) {
      uint64_t key = pair_key(words[w][k], words[w][k + 1]);
      pair_count[key] += counts[w];
      where[key].push_back(w);
    }
  std::string merges = "#version: 0.2\n";
  int64_t n_merges = 0;
  while (static_cast<int64_t>(tokens.size()) < o.vocab_size) {
    uint64_t best = 0;
    int64_t best_n = 0;
    for (const auto& [key, n] : pair_count) {
      if (n < best_n || n <= 0) continue;
      if (n > best_n) {
        best = key;
        best_n = n;
        continue;
      }
      const auto& ka = tokens[key >> 32];
      const auto& kb = tokens[key & 0xffffffffu];
      const auto& ba = tokens[best >> 32];
      const auto& bb = tokens[best & 0xffffffffu];
      if (std::tie(ka, kb) < std::tie(ba, bb)) best = key;
    }
    if (best_n < o.min_frequency) break;
    int64_t a = static_cast<int64_t>(best >> 32), b = static_cast<int64_t>(best & 0xffffffffu);
    std::string merged_tok = tokens[static_cast<size_t>(a)] + tokens[static_cast<size_t>(b)];
    // Another pair may already have produced the same string: the merge line is still needed,
    // the token is not new.
    int64_t m = ids.count(merged_tok) ? ids.at(merged_tok) : add(merged_tok);
    merges += tokens[static_cast<size_t>(a)] + " " + tokens[static_cast<size_t>(b)] + "\n";
    ++n_merges;
    std::vector<size_t> affected = std::move(where[best]);
    where.erase(best);
    std::sort(affected.begin(), affected.end());
    affected.erase(std::unique(affected.begin(), affected.end()), affected.end());
    for (size_t w : affected) {
      auto& sym = words[w];
      bool has = false;
      for (size_t k = 0; k + 1 < sym.size(); ++k)
        if (sym[k] == a && sym[k + 1] == b) has = true;
      if (!has) continue;
      for (size_t k = 0; k + 1 < sym.size(); ++k)
        pair_count[pair_key(sym[k], sym[k + 1])] -= counts[w];
      std::vector<int64_t> next;
      for (size_t k = 0; k < sym.size(); ++k) {
        if (k + 1 < sym.size() && sym[k] == a && sym[k + 1] == b) {
          next.push_back(m);
          ++k;
        } else {
          next.push_back(sym[k]);
        }
      }
      sym = std::move(next);
      for (size_t k = 0; k + 1 < sym.size(); ++k) {
        uint64_t key = pair_key(sym[k], sym[k + 1]);
        pair_count[key] += counts[w];
        where[key].push_back(w);
      }
    }
    for (auto it = pair_count.begin(); it != pair_count.end();)
      it = it->second <= 0 ? pair_count.erase(it) : std::next(it);
  }

  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = static_cast<int64_t>(i);
  write_text_file(vocab_json, vocab.dump() + "\n");
  write_text_file(merges_txt, merges);
  return n_merges;
}

}  // namespace cstorch::data
