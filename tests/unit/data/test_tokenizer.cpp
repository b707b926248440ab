// Tokenizers: GPT-2 pre-tokenisation and byte map, byte-level BPE on small vocabularies written
// by the tests (known answers, round trips, the trainer), WordPiece and BERT's basic tokenizer,
// and the errors for malformed files and unknown ids. (PyTorch-side references of the same
// algorithms: tests/reference/test_tokenizer_reference.cpp.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "cstorch/data/tokenizer.h"
#include "unit/test_util.h"

namespace cs = cstorch;
namespace fs = std::filesystem;
using cs::testing::expect_error;
using namespace cs::data;
using Strs = std::vector<std::string>;

namespace {

fs::path tmp_dir() {
  static fs::path p = [] {
    auto d = fs::temp_directory_path() / ("cstorch_tok_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return p;
}
std::string write(const std::string& name, const std::string& text) {
  auto p = tmp_dir() / name;
  std::ofstream(p, std::ios::binary) << text;
  return p.string();
}

// A byte-level vocabulary: the 256 byte symbols (ids 0..255 in byte order), then `extra`.
std::string byte_vocab(const Strs& extra) {
  std::string s = "{";
  int id = 0;
  auto add = [&](const std::string& tok) {
    std::string esc;
    for (char c : tok) {
      if (c == '"' || c == '\\') esc += '\\';
      esc += c;
    }
    s += (id ? ", \"" : "\"") + esc + "\": " + std::to_string(id);
    ++id;
  };
  for (int b = 0; b < 256; ++b) add(byte_to_unicode(static_cast<uint8_t>(b)));
  for (const auto& t : extra) add(t);
  return s + "}";
}

}  // namespace

TEST(Gpt2Pretokenize, KnownAnswers) {
  EXPECT_EQ(gpt2_pretokenize("Hello world"), (Strs{"Hello", " world"}));
  EXPECT_EQ(gpt2_pretokenize("I'm here  now\n"), (Strs{"I", "'m", " here", " ", " now", "\n"}));
  EXPECT_EQ(gpt2_pretokenize("they'll've it's"), (Strs{"they", "'ll", "'ve", " it", "'s"}));
  EXPECT_EQ(gpt2_pretokenize("'hello 'Re"), (Strs{"'", "hello", " '", "Re"}));
  EXPECT_EQ(gpt2_pretokenize("abc123def 4.5"), (Strs{"abc", "123", "def", " 4", ".", "5"}));
  EXPECT_EQ(gpt2_pretokenize(" !!? x"), (Strs{" !!?", " x"}));
  EXPECT_EQ(gpt2_pretokenize("x   "), (Strs{"x", "   "}));
  EXPECT_EQ(gpt2_pretokenize("a\n\nb"), (Strs{"a", "\n", "\n", "b"}));
  EXPECT_EQ(gpt2_pretokenize("a \tb"), (Strs{"a", " ", "\t", "b"}));
  EXPECT_EQ(gpt2_pretokenize("héllo wörld"), (Strs{"héllo", " wörld"}));
  EXPECT_EQ(gpt2_pretokenize("日本語 текст x²½"), (Strs{"日本語", " текст", " x", "²½"}));
  EXPECT_EQ(gpt2_pretokenize(""), Strs{});
}

TEST(Gpt2Pretokenize, PiecesConcatenateToTheText) {
  std::string text = "  A mixed\ttext: 12,345 \xff\xfe bytes, \xe2\x82\xac 5!\n\n  end  ";
  std::string joined;
  for (const auto& p : gpt2_pretokenize(text)) {
    EXPECT_FALSE(p.empty());
    joined += p;
  }
  EXPECT_EQ(joined, text);
}

TEST(ByteToUnicode, Gpt2Map) {
  EXPECT_EQ(byte_to_unicode(' '), "Ġ");
  EXPECT_EQ(byte_to_unicode('\n'), "Ċ");
  EXPECT_EQ(byte_to_unicode('A'), "A");
  EXPECT_EQ(byte_to_unicode(0xA1), "¡");
  EXPECT_EQ(byte_to_unicode(0), "Ā");
  EXPECT_EQ(byte_to_unicode(0xAD), "Ń");  // the 68th non-printable byte -> U+0143
}

TEST(BpeTokenizer, KnownAnswersOnAHandMadeVocabulary) {
  // Merges in priority order: "l l", "h e", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l",
  // "Ġworl d".
  auto vocab = write("v1.json", byte_vocab({"ll", "he", "hell", "hello", "Ġw", "or", "Ġwor",
                                            "Ġworl", "Ġworld", "<|endoftext|>"}));
  auto merges =
      write("m1.txt", "#version: 0.2\nl l\nh e\nhe ll\nhell o\nĠ w\no r\nĠw or\nĠwor l\nĠworl d\n");
  auto t = BpeTokenizer::from_files(vocab, merges);
  EXPECT_EQ(t.vocab_size(), 266);
  EXPECT_EQ(t.num_merges(), 9);
  EXPECT_EQ(t.encode("hello world"), (std::vector<int64_t>{259, 264}));
  EXPECT_EQ(t.tokenize("hello worlds!"), (Strs{"hello", "Ġworld", "s", "!"}));
  // "ll" merges before "he": "hell" needs both; "hel" stays as he + l.
  EXPECT_EQ(t.tokenize("hel"), (Strs{"he", "l"}));
  EXPECT_EQ(t.tokenize("ellol"), (Strs{"e", "ll", "o", "l"}));
  // Special tokens are matched literally.
  EXPECT_EQ(t.encode("hello<|endoftext|>hello"), (std::vector<int64_t>{259, 265, 259}));
  EXPECT_EQ(t.decode({259, 265, 264, 10}), "hello<|endoftext|> world\n");
  // Without specials, the text of the special token is ordinary text.
  auto plain = BpeTokenizer::from_files(vocab, merges, Strs{});
  EXPECT_EQ(plain.tokenize("<|endoftext|>").size(), 13u);  // "<|", "endoftext", "|>": no merges
}

TEST(BpeTokenizer, TrainedVocabularyRoundTripsAnyBytes) {
  Strs texts;
  for (int i = 0; i < 50; ++i)
    texts.push_back("the quick brown fox jumps over the lazy dog " + std::to_string(i * 37) +
                    " times, didn't it?\n");
  auto vocab = (tmp_dir() / "trained.json").string(), merges = (tmp_dir() / "trained.txt").string();
  int64_t n = train_bpe(texts, {.vocab_size = 320, .special_tokens = {"<pad>", "<|endoftext|>"}},
                        vocab, merges);
  EXPECT_EQ(n, 320 - 258);
  auto t = BpeTokenizer::from_files(vocab, merges);
  EXPECT_EQ(t.vocab_size(), 320);
  EXPECT_EQ(t.token_to_id("<pad>"), 0);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 1);
  EXPECT_EQ(t.token_to_id("Ā"), 2);  // byte 0
  // Frequent words became single tokens.
  EXPECT_EQ(t.tokenize(" quick brown"), (Strs{"Ġquick", "Ġbrown"}));
  for (std::string s : {std::string("the quick brown fox"), std::string("UNSEEN wörds ✓ 日本"),
                        std::string("bytes \x00\x01\xff\xc3 and <|endoftext|> end", 32),
                        std::string("  lots   of\n\n\tspace  ")}) {
    auto ids = t.encode(s);
    EXPECT_EQ(t.decode(ids), s);
  }
  // Deterministic: training again writes the same files.
  auto vocab2 = (tmp_dir() / "trained2.json").string(),
       merges2 = (tmp_dir() / "trained2.txt").string();
  train_bpe(texts, {.vocab_size = 320, .special_tokens = {"<pad>", "<|endoftext|>"}}, vocab2,
            merges2);
  auto slurp = [](const std::string& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(slurp(vocab), slurp(vocab2));
  EXPECT_EQ(slurp(merges), slurp(merges2));
  // min_frequency stops early.
  int64_t few = train_bpe({"ab ab cd"}, {.vocab_size = 400, .min_frequency = 2}, vocab2, merges2);
  EXPECT_EQ(few, 1);  // only "a b" is seen twice
}

TEST(BpeTokenizer, MalformedFilesAndUnknownIds) {
  auto merges = write("ok.txt", "#version: 0.2\nh e\n");
  auto vocab = write("ok.json", byte_vocab({"he"}));
  expect_error(
      [&] { BpeTokenizer::from_files(write("bad1.json", "{\"a\": 0,\n \"b\": }"), merges); },
      {"bad1.json", "line 2", "not valid JSON"});
  expect_error([&] { BpeTokenizer::from_files(write("bad2.json", "[1, 2]"), merges); },
               {"bad2.json", "expected a JSON object"});
  expect_error(
      [&] { BpeTokenizer::from_files(write("bad3.json", "{\"a\": 0, \"b\": 0}"), merges); },
      {"bad3.json", "\"a\" and \"b\" both have id 0"});
  expect_error([&] { BpeTokenizer::from_files(write("bad4.json", "{\"a\": \"x\"}"), merges); },
               {"bad4.json", "token \"a\"", "non-negative integer"});
  expect_error([&] { BpeTokenizer::from_files(write("bad5.json", "{\"a\": -3}"), merges); },
               {"bad5.json", "id -3"});
  expect_error([&] { BpeTokenizer::from_files((tmp_dir() / "none.json").string(), merges); },
               {"none.json", "no such file"});
  expect_error(
      [&] { BpeTokenizer::from_files(vocab, write("bm1.txt", "#version: 0.2\nh e\nabc\n")); },
      {"bm1.txt", "line 3", "two tokens", "abc"});
  // A vocab.json given as the merges file (one long line): quoted by its first 80 bytes, with
  // several spaces (not two tokens) or one (a merge of unknown tokens).
  const std::string x300(300, 'x');
  expect_error(
      [&] {
        BpeTokenizer::from_files(vocab, write("bm4.txt", "{\"" + x300 + "\": 0, \"y\": 1}\n"));
      },
      {"bm4.txt", "line 1", "two tokens",
       "{\"" + std::string(78, 'x') + "...\" (315 bytes; is it a merges file?)"});
  const std::string one_space_error = [&] {
    try {
      BpeTokenizer::from_files(vocab, write("bm5.txt", "{\"" + x300 + "\": 0}\n"));
    } catch (const cstorch::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  }();
  EXPECT_NE(one_space_error.find("(307 bytes; is it a merges file?) uses token"), std::string::npos)
      << one_space_error;
  EXPECT_LT(one_space_error.size(), 500u) << one_space_error;
  expect_error([&] { BpeTokenizer::from_files(vocab, write("bm2.txt", "h e\nh e\n")); },
               {"bm2.txt", "line 2", "repeats line 1"});
  expect_error([&] { BpeTokenizer::from_files(vocab, write("bm3.txt", "h e\nhe y\n")); },
               {"bm3.txt", "line 2", "\"hey\"", "not in"});
  expect_error([&] { BpeTokenizer::from_files(vocab, merges, Strs{"<|nope|>"}); },
               {"special token \"<|nope|>\"", "not in"});
  auto t = BpeTokenizer::from_files(vocab, merges);
  expect_error([&] { t.decode({1, 256, 900}); }, {"id 900", "position 2", "ok.json"});
  expect_error([&] { t.id_to_token(-1); }, {"id -1"});
  // A vocabulary without every byte cannot encode text holding a missing byte.
  auto small =
      BpeTokenizer::from_files(write("small.json", "{\"h\": 0, \"e\": 1, \"he\": 2}"), merges);
  EXPECT_EQ(small.encode("hehe"), (std::vector<int64_t>{2, 2}));
  expect_error([&] { small.encode("hex"); }, {"byte 0x78", "\"hex\"", "small.json"});
  expect_error([&] { train_bpe({"x"}, {.vocab_size = 100}, vocab, merges); },
               {"vocab_size 100", "256 byte symbols"});
  expect_error(
      [&] {
        train_bpe({"x"}, {.vocab_size = 300, .special_tokens = {"a", "a"}}, vocab, merges);
      },
      {"\"a\" appears twice"});
}

TEST(BertBasicTokenize, KnownAnswers) {
  EXPECT_EQ(bert_basic_tokenize(" \tHeLLo!how  \n Are yoU?  ", true, true),
            (Strs{"hello", "!", "how", "are", "you", "?"}));
  EXPECT_EQ(bert_basic_tokenize("HäLLo!how  \n Are yoU?  ", false, false),
            (Strs{"HäLLo", "!", "how", "Are", "yoU", "?"}));
  EXPECT_EQ(bert_basic_tokenize("HäLLo Ñandú Ελληνικά", true, true),
            (Strs{"hallo", "nandu", "ελληνικα"}));
  EXPECT_EQ(bert_basic_tokenize("ah博推zz", true, true), (Strs{"ah", "博", "推", "zz"}));
  EXPECT_EQ(bert_basic_tokenize("a\x01"
                                "b\xef\xbf\xbd"
                                "c $5^",
                                true, true),
            (Strs{"abc", "$", "5", "^"}));
  EXPECT_EQ(bert_basic_tokenize("[MASK] «quoted» — dash", true, true),
            (Strs{"[", "mask", "]", "«", "quoted", "»", "—", "dash"}));
}

TEST(WordPieceTokenizer, KnownAnswersAndRoundTrip) {
  auto vocab = write("wp.txt",
                     "[PAD]\n[UNK]\n[CLS]\n[SEP]\nwant\n##want\n##ed\nwa\nun\nrunn\n##ing\n,\n"
                     "low\nlowest\n##est\n");
  auto t = WordPieceTokenizer::from_file(vocab);
  EXPECT_EQ(t.vocab_size(), 15);
  EXPECT_EQ(t.unk_id(), 1);
  EXPECT_EQ(t.tokenize("UNwant\u00E9d,running"),
            (Strs{"un", "##want", "##ed", ",", "runn", "##ing"}));
  EXPECT_EQ(t.encode("UNwant\u00E9d,running"), (std::vector<int64_t>{8, 5, 6, 11, 9, 10}));
  EXPECT_EQ(t.tokenize("lowest unwantedX"), (Strs{"lowest", "[UNK]"}));
  EXPECT_EQ(t.decode({8, 5, 6, 11, 9, 10}), "unwanted , running");
  // A word longer than max_input_chars_per_word is unknown even if it could be covered.
  auto short_words = WordPieceTokenizer::from_file(vocab, {.max_input_chars_per_word = 5});
  EXPECT_EQ(short_words.tokenize("want lowest"), (Strs{"want", "[UNK]"}));
  auto cased = WordPieceTokenizer::from_file(vocab, {.lower_case = false, .strip_accents = false});
  EXPECT_EQ(cased.tokenize("Want want"), (Strs{"[UNK]", "want"}));
}

TEST(WordPieceTokenizer, MalformedFiles) {
  expect_error([&] { WordPieceTokenizer::from_file(write("w1.txt", "[UNK]\na\n\nb\n")); },
               {"w1.txt", "line 3", "empty line"});
  expect_error([&] { WordPieceTokenizer::from_file(write("w2.txt", "[UNK]\na\nb\na\n")); },
               {"w2.txt", "line 4", "\"a\" already on line 2"});
  expect_error([&] { WordPieceTokenizer::from_file(write("w3.txt", "a\nb\n")); },
               {"w3.txt", "unknown token \"[UNK]\""});
  expect_error([&] { WordPieceTokenizer::from_file(write("w4.txt", "")); },
               {"w4.txt", "no tokens"});
  expect_error([&] { WordPieceTokenizer::from_file((tmp_dir() / "nope.txt").string()); },
               {"nope.txt", "no such file"});
  auto t = WordPieceTokenizer::from_file(write("w5.txt", "[UNK]\na\n\n\n"));  // trailing blanks
  EXPECT_EQ(t.vocab_size(), 2);
  expect_error([&] { t.decode({0, 2}); }, {"id 2", "position 1", "w5.txt"});
}
