// UTF-8 decoding and the character tables of the tokenizers (tables generated from the Unicode
// database into unicode_tables.inc by scripts/gen_unicode_tables.py).
#include "data/unicode.h"

#include <algorithm>

namespace cstorch::data::unicode {

namespace {

struct Range {
  uint32_t lo, hi;
};
struct MapEntry {
  uint32_t cp;
  uint32_t to[3];
};

#include "data/unicode_tables.inc"

template <size_t N>
bool in(const Range (&table)[N], uint32_t cp) {
  auto it = std::upper_bound(std::begin(table), std::end(table), cp,
                             [](uint32_t v, const Range& r) { return v < r.lo; });
  return it != std::begin(table) && cp <= (it - 1)->hi;
}

template <size_t N>
const MapEntry* find(const MapEntry (&table)[N], uint32_t cp) {
  auto it = std::lower_bound(std::begin(table), std::end(table), cp,
                             [](const MapEntry& e, uint32_t v) { return e.cp < v; });
  return it != std::end(table) && it->cp == cp ? &*it : nullptr;
}

}  // namespace

std::vector<Char> decode_utf8(std::string_view s) {
  std::vector<Char> out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid too.
    if (ok && ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
               (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF))
      ok = false;
    if (ok) {
      out.push_back({cp, i, len, true});
      i += len;
    } else {
      out.push_back({c, i, 1, false});
      ++i;
    }
  }
  return out;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool is_letter(uint32_t cp) {
  return in(kLetters, cp);
}
bool is_number(uint32_t cp) {
  return in(kNumbers, cp);
}
bool is_whitespace(uint32_t cp) {
  // The White_Space property (what \s matches in GPT-2's `regex` pattern).
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}
bool bert_is_whitespace(uint32_t cp) {
  return cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r' || in(kSpaceSeparators, cp);
}
bool bert_is_control(uint32_t cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  return in(kControl, cp);
}
bool bert_is_punctuation(uint32_t cp) {
  // BERT counts every non-alphanumeric printable ASCII character ($, ^, `, ...) as punctuation.
  if ((cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
      (cp >= 123 && cp <= 126))
    return true;
  return in(kPunctuation, cp);
}
bool is_cjk(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

void lower(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp < 0x80) {
    out->push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  const MapEntry* e = find(kLower, cp);
  if (!e) {
    out->push_back(cp);
    return;
  }
  for (int k = 0; k < kLowerWidth && e->to[k]; ++k) out->push_back(e->to[k]);
}

void strip_accents(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp < 0x80) {
    out->push_back(cp);
    return;
  }
  if (cp >= 0xAC00 && cp <= 0xD7A3) {  // Hangul syllable: NFD is its two or three jamo
    uint32_t s = cp - 0xAC00, l = s / 588, v = (s % 588) / 28, t = s % 28;
    out->push_back(0x1100 + l);
    out->push_back(0x1161 + v);
    if (t) out->push_back(0x11A7 + t);
    return;
  }
  const MapEntry* e = find(kStrip, cp);
  if (!e) {
    out->push_back(cp);
    return;
  }
  for (int k = 0; k < kStripWidth && e->to[k]; ++k) out->push_back(e->to[k]);
}

}  // namespace cstorch::data::unicode
