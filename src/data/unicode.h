// Internal UTF-8 and character-class helpers of the tokenizers: decoding and encoding code
// points, and the built-in tables (letters, numbers, whitespace, punctuation, control, CJK,
// lower-casing, accent stripping) described in cstorch/data/tokenizer.h.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cstorch::data::unicode {

// One decoded character: its code point and the bytes it spans in the source text. An invalid
// or truncated sequence is one character per byte, with `valid` false (code point = the byte).
struct Char {
  uint32_t cp;
  size_t pos, len;
  bool valid;
};

std::vector<Char> decode_utf8(std::string_view s);
void append_utf8(uint32_t cp, std::string* out);

bool is_letter(uint32_t cp);      // \p{L} (approximate, see the tables)
bool is_number(uint32_t cp);      // \p{N}
bool is_whitespace(uint32_t cp);  // Unicode White_Space (regex \s)
// BERT's classes: whitespace (' ', \t, \n, \r, Zs), control (Cc and Cf except \t \n \r),
// punctuation (every non-alphanumeric printable ASCII character, and P* elsewhere), CJK
// ideographs.
bool bert_is_whitespace(uint32_t cp);
bool bert_is_control(uint32_t cp);
bool bert_is_punctuation(uint32_t cp);
bool is_cjk(uint32_t cp);
// Python's str.lower() within the tables; appends one or two code points.
void lower(uint32_t cp, std::vector<uint32_t>* out);
// NFD followed by dropping the non-spacing marks (Mn), appended to `out`: the base letter of a
// precomposed letter, nothing for a combining mark, the jamo of a Hangul syllable.
void strip_accents(uint32_t cp, std::vector<uint32_t>* out);

}  // namespace cstorch::data::unicode
