// libFuzzer target: BERT style WordPiece vocabularies. The input is an options byte (bit 0:
// lower_case, bit 1: strip_accents, bits 2-7: max_input_chars_per_word), vocab.txt, a NUL byte,
// and a text: the vocabulary is read by WordPieceTokenizer::from_file and, when it loads, the
// text is tokenized, encoded and decoded.
#include "cstorch/data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cstorch;
  if (size < 1) return 0;
  data::WordPieceOptions o;
  o.lower_case = data[0] & 1;
  o.strip_accents = data[0] & 2;
  o.max_input_chars_per_word = (data[0] >> 2) * 4;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  size_t a = in.find('\0');
  std::string_view text = a == std::string_view::npos ? std::string_view() : in.substr(a + 1);
  const std::string vocab = fuzz::write_scratch("vocab.txt", in.substr(0, a));
  FUZZ_CATCH({
    auto wp = data::WordPieceTokenizer::from_file(vocab, o);
    FUZZ_CATCH(wp.tokenize(text));
    FUZZ_CATCH(wp.decode(wp.encode(text)));
    std::vector<int64_t> raw;
    for (unsigned char c : text) raw.push_back(static_cast<int64_t>(c) - 8);
    FUZZ_CATCH(wp.decode(raw));
  });
  return 0;
}
