// libFuzzer target: GPT-2 style BPE files. The input is vocab.json, a NUL byte, merges.txt, a
// NUL byte, and a text: the files are read by BpeTokenizer::from_files and, when they load, the
// text is encoded and decoded. Byte-level BPE is lossless, so decode(encode(text)) must give the
// text back: a difference is a finding too.
#include "cstorch/data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cstorch;
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t a = in.find('\0');
  if (a == std::string_view::npos) return 0;
  size_t b = in.find('\0', a + 1);
  std::string_view text = b == std::string_view::npos ? std::string_view() : in.substr(b + 1);
  const std::string vocab = fuzz::write_scratch("vocab.json", in.substr(0, a));
  const std::string merges = fuzz::write_scratch("merges.txt", in.substr(a + 1, b - a - 1));
  FUZZ_CATCH({
    auto bpe = data::BpeTokenizer::from_files(vocab, merges);
    FUZZ_CATCH(bpe.tokenize(text));
    FUZZ_CATCH({
      std::vector<int64_t> ids = bpe.encode(text);
      if (bpe.decode(ids) != text) {
        std::fprintf(stderr, "fuzz: BPE decode(encode(text)) differs from the text\n");
        std::abort();
      }
    });
    // Ids straight from the input bytes: out-of-range ones must be errors.
    std::vector<int64_t> raw;
    for (unsigned char c : text) raw.push_back(static_cast<int64_t>(c) * 37 - 100);
    FUZZ_CATCH(bpe.decode(raw));
  });
  return 0;
}
