// The embedded synthetic corpus (a small probabilistic grammar with fixed per-person facts) and
// the writers of every model's files from it (see cstorch/data/text.h).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/splitmix.h"
#include "cstorch/data/text.h"
#include "cstorch/data/tokenizer.h"
#include "data/h5util.h"

namespace cstorch::data {

namespace fs = std::filesystem;

const std::vector<std::string>& SyntheticVocab::special_tokens() {
  static const std::vector<std::string> s = {"<pad>", "<|endoftext|>", "[CLS]",
                                             "[SEP]", "[MASK]",        "<s>"};
  return s;
}

namespace {

using Words = std::vector<std::string>;
const Words kNames = {"Alice", "Bob",  "Carol", "David", "Emma",  "Frank", "Grace",  "Henry",
                      "Irene", "Jack", "Karen", "Leo",   "Maria", "Nora",  "Oscar",  "Paul",
                      "Quinn", "Rosa", "Sam",   "Tina",  "Umar",  "Vera",  "Walter", "Xena",
                      "Yuri",  "Zoe",  "Hugo",  "Ivy",   "Omar",  "Lily"};
const Words kCities = {"Paris", "Lyon",   "Berlin", "Munich", "Rome",  "Milan", "Madrid", "Lisbon",
                       "Oslo",  "Vienna", "Dublin", "Cairo",  "Tokyo", "Lima",  "Quito",  "Delhi"};
const Words kCountries = {"France", "France",   "Germany", "Germany", "Italy",   "Italy",
                          "Spain",  "Portugal", "Norway",  "Austria", "Ireland", "Egypt",
                          "Japan",  "Peru",     "Ecuador", "India"};
const Words kJobs = {"teacher", "doctor",  "farmer", "baker",    "pilot",  "nurse",
                     "writer",  "painter", "singer", "engineer", "lawyer", "artist"};
const Words kAnimals = {"cat",    "dog",  "horse", "rabbit", "parrot",
                        "turtle", "goat", "fox",   "owl",    "mouse"};
const Words kColours = {"red",   "blue",  "green", "yellow", "black",
                        "white", "brown", "grey",  "orange", "purple"};
const Words kAdjectives = {"small", "big",  "old",   "young", "quiet",
                           "happy", "lazy", "quick", "tall",  "clever"};
const Words kNouns = {"ball",   "book",  "tree", "river", "house", "garden",
                      "bridge", "apple", "hat",  "boat",  "chair", "road"};
const Words kVerbs = {"saw",      "found",   "liked",   "painted",
                      "followed", "watched", "carried", "visited"};
const Words kFruits = {"apples", "pears", "plums", "oranges", "lemons", "cherries"};
const Words kRelations = {"brother", "sister", "friend", "cousin", "neighbour"};
const Words kWeather = {"sunny", "rainy", "windy", "cold", "warm", "cloudy"};

uint64_t h(uint64_t a, uint64_t b) {
  return mix64(a ^ mix64(b + kGoldenGamma));
}

struct Gen {
  uint64_t s;
  uint64_t next() { return splitmix64_next(s); }
  size_t pick(size_t n) { return static_cast<size_t>(next() % n); }
  const std::string& of(const Words& w) { return w[pick(w.size())]; }
};

std::string capitalised(std::string s) {
  if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = static_cast<char>(s[0] - 32);
  return s;
}

// Facts of person p (fixed by the corpus seed, the same in every document).
struct Person {
  size_t city, job, pet, colour, relation, other;
  int age;
};
Person person(uint64_t seed, size_t p) {
  uint64_t k = h(seed, 0x5eed0000 + p);
  Person r;
  r.city = h(k, 1) % kCities.size();
  r.job = h(k, 2) % kJobs.size();
  r.pet = h(k, 3) % kAnimals.size();
  r.colour = h(k, 4) % kColours.size();
  r.age = 20 + static_cast<int>(h(k, 5) % 60);
  r.relation = h(k, 6) % kRelations.size();
  r.other = (p + 1 + h(k, 7) % (kNames.size() - 1)) % kNames.size();
  return r;
}

std::string sentence(Gen& g, uint64_t seed, size_t p, int kind) {
  const std::string& name = kNames[p];
  Person f = person(seed, p);
  std::string s;
  switch (kind) {
    case 0:
      s = name + " lives in " + kCities[f.city] + ".";
      break;
    case 1: {
      const std::string& job = kJobs[f.job];
      bool vowel = std::string("aeiou").find(job[0]) != std::string::npos;
      s = name + " works as " + (vowel ? "an " : "a ") + job + ".";
      break;
    }
    case 2: {
      const std::string& colour = kColours[f.colour];
      bool vowel = std::string("aeiou").find(colour[0]) != std::string::npos;
      s = name + " has " + (vowel ? "an " : "a ") + colour + " " + kAnimals[f.pet] + ".";
      break;
    }
    case 3:
      s = name + " is " + std::to_string(f.age) + " years old.";
      break;
    case 4:
      s = "the " + kRelations[f.relation] + " of " + name + " is " + kNames[f.other] + ".";
      break;
    case 5: {
      std::string a1 = g.of(kAdjectives), n1 = g.of(kAnimals), v = g.of(kVerbs);
      std::string a2 = g.of(kAdjectives), n2 = g.of(kNouns);
      s = "the " + a1 + " " + n1 + " " + v + " the " + a2 + " " + n2 + ".";
      break;
    }
    case 6: {
      int a = 1 + static_cast<int>(g.pick(9)), b = 1 + static_cast<int>(g.pick(9));
      const std::string& fr = g.of(kFruits);
      s = name + " had " + std::to_string(a) + " " + fr + " and got " + std::to_string(b) +
          " more, so " + name + " had " + std::to_string(a + b) + " " + fr + ".";
      break;
    }
    case 7: {
      int k = 1 + static_cast<int>(g.pick(50));
      s = name + " counted " + std::to_string(k) + ", " + std::to_string(k + 1) + ", " +
          std::to_string(k + 2) + ", " + std::to_string(k + 3) + ".";
      break;
    }
    case 8: {
      size_t c = g.pick(kCities.size());
      s = kCities[c] + " is a city in " + kCountries[c] + ".";
      break;
    }
    default:
      s = "in " + kCities[f.city] + " it was " + g.of(kWeather) + " today.";
      break;
  }
  return capitalised(s);
}

}  // namespace

std::vector<std::vector<std::string>> synthetic_documents(int64_t n, uint64_t seed) {
  CS_CHECK(n >= 0, "synthetic_documents: the document count must be >= 0, got {}", n);
  std::vector<std::vector<std::string>> docs(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Gen g{h(seed, static_cast<uint64_t>(i))};
    size_t p = g.pick(kNames.size());
    auto& d = docs[static_cast<size_t>(i)];
    d.push_back(sentence(g, seed, p, static_cast<int>(g.pick(5))));  // opens with a fact
    size_t more = 3 + g.pick(5);
    for (size_t k = 0; k < more; ++k)
      d.push_back(sentence(g, seed, p, static_cast<int>(g.pick(10))));
  }
  return docs;
}

std::string synthetic_translate(const std::string& sentence) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < sentence.size()) {
    size_t j = sentence.find(' ', i);
    if (j == std::string::npos) j = sentence.size();
    if (j > i) words.push_back(sentence.substr(i, j - i));
    i = j + 1;
  }
  bool stop = !words.empty() && words.back().size() > 1 && words.back().back() == '.';
  if (stop) words.back().pop_back();
  static const char* kCons = "bdfgklmnprstvz";
  static const char* kVow = "aeiou";
  std::string out;
  for (size_t k = words.size(); k-- > 0;) {
    std::string w = words[k], tail;
    while (!w.empty() && (w.back() == ',' || w.back() == '.')) {
      tail.insert(tail.begin(), w.back());
      w.pop_back();
    }
    std::string mapped;
    if (!w.empty() &&
        std::all_of(w.begin(), w.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      mapped = w;
    } else if (!w.empty()) {
      bool cap = w[0] >= 'A' && w[0] <= 'Z';
      std::string low = w;
      for (auto& c : low) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      uint64_t x = 1469598103934665603ull;
      for (unsigned char c : low) x = (x ^ c) * 1099511628211ull;
      size_t syll = low.size() > 5 ? 3 : 2;
      for (size_t s = 0; s < syll; ++s) {
        x = mix64(x + s);
        mapped += kCons[x % 14];
        mapped += kVow[(x >> 8) % 5];
      }
      if (cap) mapped = capitalised(mapped);
    }
    if (!out.empty()) out += ' ';
    out += mapped + tail;
  }
  if (stop) out += '.';
  return out;
}

namespace {

std::string split_name(bool train) {
  return train ? "train" : "val";
}

// The corpus split and the tokenizer of `dir` (trained and written on first use).
struct Corpus {
  std::vector<std::vector<std::string>> train, val;
  std::shared_ptr<BpeTokenizer> tok;
};

Corpus corpus(const std::string& dir, const SyntheticTextOptions& o) {
  CS_CHECK(o.train_documents >= 1 && o.val_documents >= 1,
           "synthetic text: need at least one training and one validation document");
  fs::create_directories(dir);
  Corpus c;
  c.train = synthetic_documents(o.train_documents, o.seed);
  c.val = synthetic_documents(o.val_documents, o.seed ^ 0x7a11da7aULL);
  std::string vocab = (fs::path(dir) / "vocab.json").string();
  std::string merges = (fs::path(dir) / "merges.txt").string();
  if (!fs::exists(vocab) || !fs::exists(merges)) {
    std::vector<std::string> texts;
    // Both sides of the translation task, so the pseudo-words get tokens of their own too.
    for (const auto& d : c.train)
      for (const auto& s : d) {
        texts.push_back(" " + s);
        texts.push_back(" " + synthetic_translate(s));
      }
    train_bpe(texts,
              BpeTrainerOptions{.vocab_size = o.vocab_size,
                                .min_frequency = 2,
                                .special_tokens = SyntheticVocab::special_tokens()},
              vocab, merges);
  }
  c.tok = std::make_shared<BpeTokenizer>(
      BpeTokenizer::from_files(vocab, merges, SyntheticVocab::special_tokens()));
  return c;
}

// A document's text: its sentences joined by spaces (each with the leading space a
// pre-tokenised word carries).
std::vector<int64_t> stream(const std::vector<std::vector<std::string>>& docs,
                            const BpeTokenizer& tok) {
  std::vector<int64_t> out;
  for (const auto& d : docs) {
    for (const auto& s : d) {
      auto ids = tok.encode(" " + s);
      out.insert(out.end(), ids.begin(), ids.end());
    }
    out.push_back(SyntheticVocab::eos);
  }
  return out;
}

void write_lines(const std::string& path, const std::vector<std::vector<int64_t>>& lines) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    CS_CHECK(f.good(), "synthetic text: cannot create '{}'", tmp);
    for (const auto& l : lines) {
      for (size_t k = 0; k < l.size(); ++k) f << (k ? " " : "") << l[k];
      f << '\n';
    }
    CS_CHECK(f.good(), "synthetic text: writing '{}' failed", tmp);
  }
  fs::rename(tmp, path);
}

}  // namespace

void write_synthetic_gpt_data(const std::string& dir, int64_t msl, const SyntheticTextOptions& o) {
  CS_CHECK(msl >= 2, "write_synthetic_gpt_data: msl must be at least 2, got {}", msl);
  Corpus c = corpus(dir, o);
  for (bool train : {true, false}) {
    auto toks = stream(train ? c.train : c.val, *c.tok);
    std::string name = split_name(train);
    write_binary_tokens((fs::path(dir) / (name + ".bin")).string(), toks, TokenType::u16);
    // Windows of msl + 1 tokens, overlapping by one (the last label is the next input).
    int64_t n = (static_cast<int64_t>(toks.size()) - 1) / msl;
    CS_CHECK(n >= 1, "write_synthetic_gpt_data: the {} split has {} tokens, fewer than msl + 1",
             name, toks.size());
    std::vector<int32_t> data(static_cast<size_t>(n * 3 * msl));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t t = 0; t < msl; ++t) {
        auto at = [&](int64_t row) { return static_cast<size_t>((i * 3 + row) * msl + t); };
        data[at(0)] = static_cast<int32_t>(toks[static_cast<size_t>(i * msl + t)]);
        data[at(1)] = 1;
        data[at(2)] = static_cast<int32_t>(toks[static_cast<size_t>(i * msl + t + 1)]);
      }
    fs::create_directories(fs::path(dir) / name);
    std::string path = (fs::path(dir) / name / "data_0.h5").string();
    h5::write_file(path, [&](hid_t f) {
      h5::write_i32(f, path, "data", {static_cast<hsize_t>(n), 3, static_cast<hsize_t>(msl)},
                    data.data());
    });
  }
}

void write_synthetic_bert_data(const std::string& dir, int64_t msl, const SyntheticTextOptions& o) {
  CS_CHECK(msl >= 8, "write_synthetic_bert_data: msl must be at least 8, got {}", msl);
  Corpus c = corpus(dir, o);
  for (bool train : {true, false}) {
    const auto& docs = train ? c.train : c.val;
    std::vector<std::vector<std::vector<int64_t>>> enc;  // doc -> sentence -> ids
    for (const auto& d : docs) {
      enc.emplace_back();
      for (const auto& s : d) enc.back().push_back(c.tok->encode(" " + s));
    }
    std::vector<int32_t> ids, seg, mask, nsp;
    Gen g{h(o.seed, train ? 0xbe47 : 0xbe48)};
    for (size_t di = 0; di < enc.size(); ++di) {
      for (size_t si = 0; si + 1 < enc[di].size(); ++si) {
        std::vector<int64_t> a = enc[di][si], b;
        bool random_next = docs.size() > 1 && g.pick(2) == 1;
        if (random_next) {
          size_t other = (di + 1 + g.pick(enc.size() - 1)) % enc.size();
          b = enc[other][g.pick(enc[other].size())];
        } else {
          b = enc[di][si + 1];
        }
        // BERT's truncate_seq_pair: drop from the end of the longer segment.
        while (static_cast<int64_t>(a.size() + b.size()) + 3 > msl)
          (a.size() > b.size() ? a : b).pop_back();
        std::vector<int32_t> row, srow;
        row.push_back(SyntheticVocab::cls);
        for (auto t : a) row.push_back(static_cast<int32_t>(t));
        row.push_back(SyntheticVocab::sep);
        srow.assign(row.size(), 0);
        for (auto t : b) row.push_back(static_cast<int32_t>(t));
        row.push_back(SyntheticVocab::sep);
        srow.resize(row.size(), 1);
        size_t len = row.size();
        row.resize(static_cast<size_t>(msl), SyntheticVocab::pad);
        srow.resize(static_cast<size_t>(msl), 0);
        ids.insert(ids.end(), row.begin(), row.end());
        seg.insert(seg.end(), srow.begin(), srow.end());
        for (int64_t k = 0; k < msl; ++k) mask.push_back(static_cast<size_t>(k) < len ? 1 : 0);
        nsp.push_back(random_next ? 1 : 0);
      }
    }
    auto n = static_cast<hsize_t>(nsp.size());
    std::string name = split_name(train);
    fs::create_directories(fs::path(dir) / name);
    std::string path = (fs::path(dir) / name / "data_0.h5").string();
    h5::write_file(path, [&](hid_t f) {
      h5::write_i32(f, path, "input_ids", {n, static_cast<hsize_t>(msl)}, ids.data());
      h5::write_i32(f, path, "segment_ids", {n, static_cast<hsize_t>(msl)}, seg.data());
      h5::write_i32(f, path, "input_mask", {n, static_cast<hsize_t>(msl)}, mask.data());
      h5::write_i32(f, path, "next_sentence_labels", {n}, nsp.data());
      h5::write_attr(f, path, "vocab_size", c.tok->vocab_size());
      h5::write_attr(f, path, "cls_id", SyntheticVocab::cls);
      h5::write_attr(f, path, "sep_id", SyntheticVocab::sep);
      h5::write_attr(f, path, "mask_id", SyntheticVocab::mask);
      h5::write_attr(f, path, "pad_id", SyntheticVocab::pad);
    });
  }
}

void write_synthetic_t5_data(const std::string& dir, const SyntheticTextOptions& o) {
  Corpus c = corpus(dir, o);
  for (bool train : {true, false})
    write_binary_tokens((fs::path(dir) / (split_name(train) + ".bin")).string(),
                        stream(train ? c.train : c.val, *c.tok), TokenType::u16);
}

void write_synthetic_translation_data(const std::string& dir, const SyntheticTextOptions& o) {
  Corpus c = corpus(dir, o);
  for (bool train : {true, false}) {
    std::vector<std::vector<int64_t>> src, tgt;
    for (const auto& d : train ? c.train : c.val)
      for (const auto& s : d) {
        src.push_back(c.tok->encode(" " + s));
        tgt.push_back(c.tok->encode(" " + synthetic_translate(s)));
      }
    std::string name = split_name(train);
    write_lines((fs::path(dir) / (name + ".src")).string(), src);
    write_lines((fs::path(dir) / (name + ".tgt")).string(), tgt);
  }
}

}  // namespace cstorch::data

namespace cstorch::data {

void write_synthetic_jsonl_data(const std::string& dir, const SyntheticTextOptions& o) {
  Corpus c = corpus(dir, o);
  for (bool train : {true, false}) {
    std::string path = (fs::path(dir) / (split_name(train) + ".jsonl")).string();
    std::string tmp = path + ".tmp";
    {
      std::ofstream f(tmp, std::ios::trunc);
      CS_CHECK(f.good(), "synthetic text: cannot create '{}'", tmp);
      for (const auto& d : train ? c.train : c.val) {
        std::string text;
        for (const auto& s : d) text += (text.empty() ? "" : " ") + s;
        f << nlohmann::json{{"text", text}}.dump() << '\n';
      }
      CS_CHECK(f.good(), "synthetic text: writing '{}' failed", tmp);
    }
    fs::rename(tmp, path);
  }
}

}  // namespace cstorch::data
