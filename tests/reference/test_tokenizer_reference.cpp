// Tokenizers against references written in Python in the test suite (tokenizer_reference.py):
// GPT-2 pre-tokenisation and byte-level BPE encoding on a vocabulary trained here, the BPE
// trainer's merges against a naive Python trainer, and BERT's basic + WordPiece tokenisation on
// a vocabulary made here. Exact agreement is required (token ids and strings).
#include <gtest/gtest.h>

#include <fstream>

#include "cstorch/data/tokenizer.h"
#include "ref_util.h"

namespace cstorch::reftest {
namespace {

using namespace cstorch::data;

std::vector<std::string> texts() {
  return {
      "Hello world! It's a test, isn't it? We'll see; they've gone.",
      "  leading spaces, trailing spaces   ",
      "tabs\tand\nnewlines\n\n\nand  double  spaces",
      "numbers 12345 and 3.14159 and 1,000,000 and x2y3",
      "Punctuation!!! ... ??? (brackets) [more] {braces} \"quotes\" 'single'",
      "Accents: café naïve résumé Ångström Ñandú façade",
      "Greek: Καλημέρα κόσμε; Cyrillic: Привет, мир!",
      "CJK: 日本語のテキスト 中文 한국어",
      "Emoji 😀👍🏽 and symbols © ® ™ € £ ¥ §",
      "Numbers elsewhere: ² ³ ½ ¾ ٣٤ ⅷ",
      "Combining marks: e\u0301 a\u0308 n\u0303",
      "Odd spaces:\u00a0nbsp\u3000ideographic\u2003em \x1c"
      "fs",
      "'s'S 'RE 're've'm'll'd Don'T",
      "the quick brown fox jumps over the lazy dog",
      "",
      " ",
      "\n",
  };
}

std::vector<std::string> train_texts() {
  std::vector<std::string> t;
  for (int i = 0; i < 30; ++i) {
    t.push_back("the quick brown fox jumps over the lazy dog number " + std::to_string(i * 7));
    t.push_back("Hello world, it's a test of the tokenizer: café, naïve, Привет мир " +
                std::to_string(i));
    // In place from the literal: moving a temporary std::string in here makes GCC 12 report a
    // false -Warray-bounds in libstdc++'s memcpy (since the tests use a precompiled header).
    t.emplace_back("numbers like 12345 and 3.14159 repeat; they'll repeat and they've repeated");
  }
  return t;
}

TEST(TokenizerReference, BpeWordPieceAndTrainerMatchPython) {
  if (auto why = torch_unavailable_reason(); !why.empty()) FAIL() << why;
  auto dir = make_temp_dir("tokref");
  std::string vocab = (dir / "vocab.json").string(), merges = (dir / "merges.txt").string();
  const std::vector<std::string> specials = {"<pad>", "<|endoftext|>"};
  const int64_t vocab_size = 420;
  train_bpe(train_texts(), {.vocab_size = vocab_size, .special_tokens = specials}, vocab, merges);
  auto bpe = BpeTokenizer::from_files(vocab, merges, std::vector<std::string>{});

  // A WordPiece vocabulary: specials, whole words, a few sub-words and every ASCII letter alone
  // and as a continuation.
  std::string wp_vocab = (dir / "vocab.txt").string();
  {
    std::ofstream f(wp_vocab);
    for (const char* s :
         {"[PAD]", "[UNK]", "[CLS]",  "[SEP]", "[MASK]", "the", "quick",  "brown", "fox",
          "hello", "world", "test",   "it",    "isn",    "un",  "##able", "##ing", "##ed",
          "cafe",  "naive", "привет", "мир",   "日",     "本",  "中",     "文",    "##ume",
          "res",   "!",     ",",      "?",     ".",      "'",   "(",      ")",     "[",
          "]",     "\"",    ";",      ":",     "1",      "2",   "3",      "##4",   "##5"})
      f << s << "\n";
    for (char c = 'a'; c <= 'z'; ++c) f << c << "\n##" << c << "\n";
  }
  auto wp = WordPieceTokenizer::from_file(wp_vocab);

  json in;
  in["bpe"] = {{"vocab", vocab},
               {"merges", merges},
               {"texts", texts()},
               {"train_texts", train_texts()},
               {"train_vocab_size", vocab_size},
               {"train_specials", specials}};
  in["wordpiece"] = {{"vocab", wp_vocab}, {"texts", texts()}, {"lower_case", true}};
  write_json(dir / "in.json", in);
  std::string out;
  int rc = run_reference_script("tokenizer_reference.py",
                                {(dir / "in.json").string(), (dir / "out.json").string()}, &out);
  ASSERT_EQ(rc, 0) << out;
  json ref = read_json(dir / "out.json");

  // The trainer: the same merges, in the same order.
  std::vector<std::string> lines;
  {
    std::ifstream f(merges);
    std::string l;
    while (std::getline(f, l))
      if (l.rfind("#version", 0) != 0 && !l.empty()) lines.push_back(l);
  }
  EXPECT_EQ(lines, ref["train_merges"].get<std::vector<std::string>>());
  // Training ran until no pair was seen twice, short of the vocabulary size.
  EXPECT_GT(lines.size(), 100u);

  auto ts = texts();
  for (size_t i = 0; i < ts.size(); ++i) {
    SCOPED_TRACE("text " + std::to_string(i) + ": " + ts[i]);
    EXPECT_EQ(gpt2_pretokenize(ts[i]), ref["pretokens"][i].get<std::vector<std::string>>());
    auto ids = bpe.encode(ts[i]);
    EXPECT_EQ(ids, ref["bpe_ids"][i].get<std::vector<int64_t>>());
    EXPECT_EQ(bpe.decode(ids), ts[i]);
    EXPECT_EQ(wp.tokenize(ts[i]), ref["wordpiece_tokens"][i].get<std::vector<std::string>>());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cstorch::reftest
