// Text data: the synthetic corpus, the files written from it, and the transformer models'
// loaders (GPT, BERT masking rates and exact resume, T5 span-corruption invariants, translation
// pairs) with their errors; the registered data processors built from YAML-like configs.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "cstorch/cstorch.h"
#include "cstorch/data/text.h"
#include "cstorch/data/tokenizer.h"
#include "modelzoo/config_view.h"
#include "modelzoo/model.h"
#include "unit/test_util.h"

namespace cs = cstorch;
namespace fs = std::filesystem;
using cs::Batch;
using cs::testing::expect_error;
using namespace cs::data;

namespace {

fs::path root() {
  static fs::path p = [] {
    auto d = fs::temp_directory_path() / ("cstorch_text_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return p;
}

// Small synthetic data sets, written once per process.
SyntheticTextOptions small() {
  return {.train_documents = 300, .val_documents = 20, .seed = 5, .vocab_size = 400};
}
const std::string& gpt_dir() {
  static std::string d = [] {
    auto p = (root() / "gpt").string();
    write_synthetic_gpt_data(p, 16, small());
    return p;
  }();
  return d;
}
const std::string& bert_dir() {
  static std::string d = [] {
    auto p = (root() / "bert").string();
    write_synthetic_bert_data(p, 48, small());
    return p;
  }();
  return d;
}
const std::string& t5_dir() {
  static std::string d = [] {
    auto p = (root() / "t5").string();
    write_synthetic_t5_data(p, small());
    return p;
  }();
  return d;
}
const std::string& mt_dir() {
  static std::string d = [] {
    auto p = (root() / "mt").string();
    write_synthetic_translation_data(p, small());
    return p;
  }();
  return d;
}

std::vector<int32_t> vals(const Batch& b, const std::string& k) {
  return b.at(k).to_vector<int32_t>();
}

std::vector<Batch> take(cs::utils::data::Loader& l, int n) {
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    auto b = l.next();
    if (!b) {
      l.reset();
      b = l.next();
    }
    out.push_back(*b);
  }
  return out;
}

void expect_same(const Batch& a, const Batch& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, v] : a) EXPECT_EQ(vals(a, k), vals(b, k)) << k;
}

}  // namespace

TEST(SyntheticText, DeterministicWithFixedFacts) {
  auto a = synthetic_documents(50, 3), b = synthetic_documents(50, 3),
       c = synthetic_documents(50, 4);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Each person's city is the same in every document that states it.
  std::map<std::string, std::string> city;
  int facts = 0;
  for (const auto& d : synthetic_documents(400, 3))
    for (const auto& s : d) {
      auto k = s.find(" lives in ");
      if (k == std::string::npos) continue;
      std::string who = s.substr(0, k), where = s.substr(k + 10);
      auto [it, fresh] = city.emplace(who, where);
      EXPECT_EQ(it->second, where) << who;
      ++facts;
    }
  EXPECT_GT(facts, 100);
  EXPECT_EQ(synthetic_translate("Alice has 3 red cats."),
            synthetic_translate("Alice has 3 red cats."));
  std::string t = synthetic_translate("The old fox saw 12 hats.");
  EXPECT_EQ(t.substr(t.size() - 1), ".");
  EXPECT_EQ(t.find("12 "), t.find(' ') + 1);  // reversed: "<hats> 12 <saw> ..."
}

TEST(SyntheticText, GptFilesAndLoader) {
  auto tok = BpeTokenizer::from_files(gpt_dir() + "/vocab.json", gpt_dir() + "/merges.txt");
  EXPECT_EQ(tok.vocab_size(), 400);
  EXPECT_EQ(tok.token_to_id("[MASK]"), SyntheticVocab::mask);
  auto h5 = make_gpt_loader(
      {.hdf5_files = {gpt_dir() + "/train"}, .max_sequence_length = 16, .vocab_size = 400},
      {.batch_size = 4});
  auto flat = make_gpt_loader(
      {.flat_file = gpt_dir() + "/train.bin", .max_sequence_length = 16, .vocab_size = 400},
      {.batch_size = 4});
  EXPECT_EQ(h5->size(), flat->size());
  Batch a = *h5->next(), b = *flat->next();
  expect_same(a, b);
  EXPECT_EQ(a.at("input_ids").dtype(), cs::DType::i32);
  EXPECT_EQ(a.at("input_ids").shape(), (cs::Shape{4, 16}));
  auto ids = vals(a, "input_ids"), lab = vals(a, "labels"), mask = vals(a, "attention_mask");
  for (int t = 0; t + 1 < 16; ++t)
    EXPECT_EQ(lab[static_cast<size_t>(t)], ids[static_cast<size_t>(t + 1)]);
  for (int m : mask) EXPECT_EQ(m, 1);
  // The first document decodes to the corpus text.
  std::string text = tok.decode(std::vector<int64_t>(ids.begin(), ids.begin() + 16));
  EXPECT_EQ(text.rfind(" " + synthetic_documents(1, 5)[0][0].substr(0, 5), 0), 0u) << text;

  expect_error(
      [&] {
        make_gpt_loader({.hdf5_files = {gpt_dir() + "/train"}, .max_sequence_length = 8}, {});
      },
      {"data_0.h5", "16 tokens", "max_sequence_length 8"});
  auto bad =
      make_gpt_loader({.hdf5_files = {gpt_dir() + "/train"}, .vocab_size = 50}, {.batch_size = 2});
  expect_error([&] { bad->next(); }, {"data_0.h5' row 0", "outside the vocabulary 0..49"});
  expect_error([&] { make_gpt_loader({.flat_file = gpt_dir() + "/train.bin"}, {}); },
               {"max_sequence_length must be given"});
}

TEST(BertData, MaskingRatesWithinBounds) {
  auto l = make_bert_loader({.files = {bert_dir() + "/train"},
                             .max_sequence_length = 48,
                             .vocab_size = 400,
                             .mask_seed = 9},
                            {.batch_size = 64});
  int64_t candidates = 0, selected = 0, masked = 0, randomised = 0, kept = 0, nsp1 = 0, rows = 0;
  std::set<int32_t> specials = {SyntheticVocab::cls, SyntheticVocab::sep, SyntheticVocab::pad};
  while (auto b = l->next()) {
    auto ids = vals(*b, "input_ids"), lab = vals(*b, "mlm_labels"), am = vals(*b, "attention_mask"),
         tt = vals(*b, "token_type_ids"), ns = vals(*b, "next_sentence_label");
    for (size_t k = 0; k < ids.size(); ++k) {
      if (lab[k] == -100) {
        if (am[k]) {
          EXPECT_NE(ids[k], SyntheticVocab::mask);
        }
        if (am[k] && !specials.count(ids[k])) ++candidates;
        continue;
      }
      ASSERT_EQ(am[k], 1);
      ASSERT_FALSE(specials.count(lab[k])) << "a special token was selected";
      ++candidates;
      ++selected;
      if (ids[k] == SyntheticVocab::mask)
        ++masked;
      else if (ids[k] == lab[k])
        ++kept;
      else
        ++randomised;
      EXPECT_TRUE(tt[k] == 0 || tt[k] == 1);
    }
    for (int v : ns) nsp1 += v;
    rows += static_cast<int64_t>(ns.size());
  }
  ASSERT_GT(candidates, 5000);
  // Binomial bounds at 5 standard deviations.
  auto within = [](int64_t k, int64_t n, double p) {
    double sd = std::sqrt(n * p * (1 - p));
    return std::abs(static_cast<double>(k) - n * p) < 5 * sd;
  };
  EXPECT_TRUE(within(selected, candidates, 0.15)) << selected << " of " << candidates;
  EXPECT_TRUE(within(masked, selected, 0.8)) << masked << " of " << selected;
  EXPECT_TRUE(within(randomised, selected, 0.1 * (1 - 1.0 / 394))) << randomised;
  EXPECT_TRUE(within(kept, selected, 0.1 + 0.1 / 394)) << kept;
  EXPECT_TRUE(within(nsp1, rows, 0.5)) << nsp1 << " of " << rows;
}

TEST(BertData, MaskChangesPerEpochAndResumesExactly) {
  BertDataOptions d{.files = {bert_dir() + "/train"},
                    .max_sequence_length = 48,
                    .vocab_size = 400,
                    .mask_seed = 1};
  LoaderOptions o{.batch_size = 8, .shuffle = true, .seed = 3, .drop_last = true};
  auto a = make_bert_loader(d, o);
  int64_t per_epoch = a->size();
  ASSERT_GT(per_epoch, 3);
  // Run into the second epoch, save, and continue on a fresh loader.
  auto first = take(*a, static_cast<int>(per_epoch) + 2);
  cs::State st = a->state_dict();
  auto rest = take(*a, 5);
  auto b = make_bert_loader(d, o);
  b->load_state_dict(st);
  auto again = take(*b, 5);
  for (size_t i = 0; i < rest.size(); ++i) expect_same(rest[i], again[i]);
  // Same rows, other epoch: another mask (compare by the unshuffled loader).
  LoaderOptions ordered{.batch_size = 8};
  auto c = make_bert_loader(d, ordered);
  auto e0 = take(*c, 1)[0];
  c->reset();
  auto e1 = *c->next();
  EXPECT_EQ(vals(e0, "token_type_ids"), vals(e1, "token_type_ids"));
  EXPECT_NE(vals(e0, "mlm_labels"), vals(e1, "mlm_labels"));
  // Another mask seed, another mask.
  d.mask_seed = 2;
  auto e0b = *make_bert_loader(d, ordered)->next();
  EXPECT_NE(vals(e0, "mlm_labels"), vals(e0b, "mlm_labels"));
}

// Every row predicts at least one token: at a low mlm_probability most rows drew none, and a
// batch of such rows had a masked-token loss averaged over nothing (NaN), which trained BERT's
// weights to NaN.
TEST(BertData, EveryRowPredictsAtLeastOneToken) {
  const std::vector<int32_t> row = {SyntheticVocab::cls, 40, 41, 42, 43, SyntheticVocab::sep, 0, 0};
  int rows_with_draws = 0;
  for (uint64_t key = 0; key < 200; ++key) {
    auto [ids, labels] = bert_mask_row(
        row, 6, 400, 0.01, SyntheticVocab::mask,
        {SyntheticVocab::cls, SyntheticVocab::sep, SyntheticVocab::pad, SyntheticVocab::mask}, key);
    int predicted = 0;
    for (size_t k = 0; k < labels.size(); ++k)
      if (labels[k] != -100) {
        ++predicted;
        EXPECT_TRUE(k >= 1 && k <= 4) << "key " << key << ": a special or padding position";
        EXPECT_EQ(labels[k], row[k]);
      }
    EXPECT_GE(predicted, 1) << "key " << key;
    rows_with_draws += predicted > 1;
  }
  EXPECT_LT(rows_with_draws, 10);  // p = 0.01: the draws alone rarely select two
}

namespace {
// Writes a BERT row file with the given rows (padded to msl with 0), attributes included.
void write_bert(const std::string& path, const std::vector<std::vector<int32_t>>& rows, int msl,
                bool with_nsp = true, int64_t vocab = 100) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  auto n = static_cast<hsize_t>(rows.size());
  std::vector<int32_t> ids, seg, mask, nsp(rows.size(), 0);
  for (const auto& r : rows)
    for (int k = 0; k < msl; ++k) {
      ids.push_back(k < static_cast<int>(r.size()) ? r[static_cast<size_t>(k)] : 0);
      seg.push_back(0);
      mask.push_back(k < static_cast<int>(r.size()) ? 1 : 0);
    }
  auto put = [&](const char* name, std::vector<hsize_t> dims, const std::vector<int32_t>& v) {
    hid_t sp = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    hid_t d = H5Dcreate2(f, name, H5T_STD_I32LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
    H5Dclose(d);
    H5Sclose(sp);
  };
  put("input_ids", {n, static_cast<hsize_t>(msl)}, ids);
  put("segment_ids", {n, static_cast<hsize_t>(msl)}, seg);
  put("input_mask", {n, static_cast<hsize_t>(msl)}, mask);
  if (with_nsp) put("next_sentence_labels", {n}, nsp);
  for (auto [name, v] : {std::pair{"vocab_size", vocab},
                         {"cls_id", 2},
                         {"sep_id", 3},
                         {"mask_id", 4},
                         {"pad_id", 0}}) {
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT64, &v);
    H5Aclose(a);
    H5Sclose(sp);
  }
  H5Fclose(f);
}
}  // namespace

TEST(BertData, Errors) {
  auto p = (root() / "bert_bad.h5").string();
  write_bert(p, {{2, 10, 11, 3}, {2, 12, 150, 3}}, 6);
  auto l = make_bert_loader({.files = {p}, .vocab_size = 100}, {.batch_size = 2});
  expect_error([&] { l->next(); },
               {"bert_bad.h5' row 1", "token id 150", "outside the vocabulary 0..99"});
  expect_error(
      [&] { make_bert_loader({.files = {p}, .max_sequence_length = 4, .vocab_size = 100}, {}); },
      {"bert_bad.h5", "rows of 6 tokens", "max_sequence_length 4"});
  expect_error([&] { make_bert_loader({.files = {p}, .vocab_size = 50}, {}); },
               {"vocabulary of 100 tokens", "vocab_size 50"});
  auto q = (root() / "bert_nonsp.h5").string();
  write_bert(q, {{2, 10, 3}}, 4, false);
  expect_error([&] { make_bert_loader({.files = {q}, .vocab_size = 100}, {}); },
               {"bert_nonsp.h5", "no dataset 'next_sentence_labels'"});
  auto r = (root() / "not_hdf5.h5").string();
  std::ofstream(r) << "hello";
  expect_error([&] { make_bert_loader({.files = {r}, .vocab_size = 100}, {}); },
               {"not_hdf5.h5", "cannot open as an HDF5 file"});
}

TEST(T5Data, LengthsAsInT5) {
  // T5's random_spans_helper: 512 encoder tokens take 568 raw tokens and make 114 targets.
  EXPECT_EQ(t5_span_lengths(512, 0.15, 3.0), (std::pair<int64_t, int64_t>{568, 114}));
  EXPECT_EQ(t5_span_lengths(128, 0.15, 3.0), (std::pair<int64_t, int64_t>{141, 29}));
  EXPECT_EQ(t5_span_lengths(64, 0.15, 3.0), (std::pair<int64_t, int64_t>{70, 14}));
  auto [tokens, targets] = t5_span_lengths(64, 0.15, 3.0);
  auto m = t5_noise_mask(tokens, 0.15, 3.0, 42);
  ASSERT_EQ(static_cast<int64_t>(m.size()), tokens);
  int64_t noise = std::count(m.begin(), m.end(), true), spans = 0;
  for (size_t k = 0; k < m.size(); ++k) spans += m[k] && (k == 0 || !m[k - 1]);
  // Python's round (half to even), as T5 uses.
  EXPECT_EQ(noise, static_cast<int64_t>(std::nearbyint(tokens * 0.15)));
  EXPECT_EQ(spans, static_cast<int64_t>(std::nearbyint(noise / 3.0)));
  EXPECT_FALSE(m[0]);  // a kept span comes first
  EXPECT_NE(m, t5_noise_mask(tokens, 0.15, 3.0, 43));
  std::vector<int32_t> toks(static_cast<size_t>(tokens));
  for (size_t k = 0; k < toks.size(); ++k) toks[k] = static_cast<int32_t>(10 + k);
  auto [in, tgt] = t5_corrupt(toks, m, 1000, 1);
  EXPECT_EQ(static_cast<int64_t>(in.size()), 64);
  EXPECT_EQ(static_cast<int64_t>(tgt.size()), targets);
  EXPECT_EQ(in.back(), 1);
  EXPECT_EQ(tgt.front(), 999);  // the first sentinel is the top id
}

TEST(T5Data, InputsAndTargetsReconstructTheTextAndResume) {
  auto tok = BpeTokenizer::from_files(t5_dir() + "/vocab.json", t5_dir() + "/merges.txt");
  int64_t vocab = tok.vocab_size() + 100;
  T5DataOptions d{.file = t5_dir() + "/train.bin",
                  .vocab_size = vocab,
                  .max_sequence_length = 32,
                  .noise_seed = 4};
  auto [tokens_len, targets_len] = t5_span_lengths(32, 0.15, 3.0);
  auto l = make_t5_loader(d, {.batch_size = 4});
  Batch b = *l->next();
  EXPECT_EQ(b.at("input_ids").shape(), (cs::Shape{4, 32}));
  EXPECT_EQ(b.at("labels").shape(), (cs::Shape{4, targets_len}));
  // The raw tokens of samples 0..3, from the file.
  auto raw = [&] {
    std::ifstream f(t5_dir() + "/train.bin", std::ios::binary);
    std::vector<uint16_t> v(static_cast<size_t>(4 * tokens_len));
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 2));
    return v;
  }();
  auto in = vals(b, "input_ids"), lab = vals(b, "labels"), dec = vals(b, "decoder_input_ids"),
       am = vals(b, "attention_mask"), dm = vals(b, "decoder_attention_mask");
  int64_t T = targets_len;
  for (int64_t j = 0; j < 4; ++j) {
    // Replace each sentinel of the inputs with the target tokens after the same sentinel.
    std::map<int32_t, std::vector<int32_t>> spans;
    int32_t cur = -1;
    for (int64_t t = 0; t < T && dm[static_cast<size_t>(j * T + t)]; ++t) {
      int32_t v = lab[static_cast<size_t>(j * T + t)];
      if (v >= vocab - 100)
        cur = v;
      else if (v != SyntheticVocab::eos || (t + 1 < T && dm[static_cast<size_t>(j * T + t + 1)]))
        spans[cur].push_back(v);
      EXPECT_EQ(dec[static_cast<size_t>(j * T + t)],
                t == 0 ? 0 : lab[static_cast<size_t>(j * T + t - 1)]);
    }
    std::vector<int32_t> rebuilt;
    for (int64_t t = 0; t < 32 && am[static_cast<size_t>(j * 32 + t)]; ++t) {
      int32_t v = in[static_cast<size_t>(j * 32 + t)];
      if (v >= vocab - 100)
        rebuilt.insert(rebuilt.end(), spans[v].begin(), spans[v].end());
      else
        rebuilt.push_back(v);
    }
    ASSERT_EQ(rebuilt.back(), SyntheticVocab::eos);
    rebuilt.pop_back();
    std::vector<int32_t> want(raw.begin() + j * tokens_len, raw.begin() + (j + 1) * tokens_len);
    EXPECT_EQ(rebuilt, want) << "sample " << j;
  }
  // Exact resume across an epoch boundary, with shuffling.
  LoaderOptions o{.batch_size = 16, .shuffle = true, .seed = 2, .drop_last = true};
  auto a = make_t5_loader(d, o);
  take(*a, static_cast<int>(a->size()) + 1);
  auto st = a->state_dict();
  auto rest = take(*a, 3);
  auto c = make_t5_loader(d, o);
  c->load_state_dict(st);
  auto again = take(*c, 3);
  for (size_t i = 0; i < rest.size(); ++i) expect_same(rest[i], again[i]);
}

TEST(T5Data, Errors) {
  auto tok = BpeTokenizer::from_files(t5_dir() + "/vocab.json", t5_dir() + "/merges.txt");
  T5DataOptions d{.file = t5_dir() + "/train.bin",
                  .vocab_size = tok.vocab_size() + 100,
                  .max_sequence_length = 32,
                  .max_target_length = 5};
  expect_error([&] { make_t5_loader(d, {}); },
               {"max_target_length 5", "encoder and decoder lengths do not match"});
  d.max_target_length = 0;
  d.vocab_size = tok.vocab_size() + 10;  // the sentinel range overlaps real tokens
  d.extra_ids = 100;
  expect_error([&] { make_t5_loader(d, {.batch_size = 64})->next(); },
               {"train.bin' token", "sentinels"});
  d.vocab_size = 1000;
  d.file = (root() / "missing.bin").string();
  expect_error([&] { make_t5_loader(d, {}); }, {"missing.bin"});
}

TEST(TranslationData, BatchesAndErrors) {
  ParallelDataOptions d{.source_file = mt_dir() + "/train.src",
                        .target_file = mt_dir() + "/train.tgt",
                        .vocab_size = 400,
                        .max_sequence_length = 40,
                        .max_target_length = 48};
  auto c = load_parallel_corpus(d);
  auto l = make_parallel_loader(c, {.batch_size = 2});
  Batch b = *l->next();
  auto src = read_token_lines(d.source_file, 400), tgt = read_token_lines(d.target_file, 400);
  auto in = vals(b, "input_ids"), lab = vals(b, "labels"), dec = vals(b, "decoder_input_ids");
  auto dm = vals(b, "decoder_attention_mask");
  for (size_t k = 0; k < src[0].size(); ++k) EXPECT_EQ(in[k], src[0][k]);
  EXPECT_EQ(in[src[0].size()], SyntheticVocab::eos);
  EXPECT_EQ(dec[0], SyntheticVocab::bos);
  for (size_t k = 0; k < tgt[0].size(); ++k) {
    EXPECT_EQ(lab[k], tgt[0][k]);
    EXPECT_EQ(dec[k + 1], tgt[0][k]);
  }
  EXPECT_EQ(lab[tgt[0].size()], SyntheticVocab::eos);
  EXPECT_EQ(dm[tgt[0].size()], 1);
  EXPECT_EQ(dm[tgt[0].size() + 1], 0);
  // The target decodes to the translation of the source.
  auto tok = BpeTokenizer::from_files(mt_dir() + "/vocab.json", mt_dir() + "/merges.txt");
  std::string s = tok.decode(std::vector<int64_t>(src[0].begin(), src[0].end()));
  std::string t = tok.decode(std::vector<int64_t>(tgt[0].begin(), tgt[0].end()));
  EXPECT_EQ(t, " " + synthetic_translate(s.substr(1)));

  auto put = [](const std::string& name, const std::string& text) {
    auto p = (root() / name).string();
    std::ofstream(p) << text;
    return p;
  };
  auto s2 = put("a.src", "5 6 7\n8 9\n"), t2 = put("a.tgt", "5 6\n");
  expect_error(
      [&] {
        load_parallel_corpus({.source_file = s2,
                              .target_file = t2,
                              .vocab_size = 100,
                              .max_sequence_length = 8,
                              .max_target_length = 8});
      },
      {"a.src' has 2 sentences", "a.tgt' has 1"});
  auto t3 = put("b.tgt", "5 6\n5 600\n");
  expect_error(
      [&] {
        load_parallel_corpus({.source_file = s2,
                              .target_file = t3,
                              .vocab_size = 100,
                              .max_sequence_length = 8,
                              .max_target_length = 8});
      },
      {"b.tgt' line 2", "token id 600", "0..99"});
  auto t4 = put("c.tgt", "5 x6\n5\n");
  expect_error([&] { read_token_lines(t4, 100); }, {"c.tgt' line 1", "\"x6\" is not a token id"});
  auto t5 = put("d.tgt", "5 6\n\n");
  expect_error([&] { read_token_lines(t5, 100); }, {"d.tgt' line 2", "empty sentence"});
  expect_error(
      [&] {
        load_parallel_corpus({.source_file = s2,
                              .target_file = put("e.tgt", "1\n2\n"),
                              .vocab_size = 100,
                              .max_sequence_length = 3,
                              .max_target_length = 8});
      },
      {"a.src' line 1", "4 tokens with eos", "max_sequence_length 3"});
}

// ---------------------------------------------------------------------------------------------
// Registered processors

namespace {
modelzoo::DataLoaderPtr processor(const cs::Config& c) {
  return modelzoo::data_processors().create(c.at("data_processor").get<std::string>(),
                                            modelzoo::ConfigView(c, "train_dataloader"),
                                            "train_dataloader");
}
}  // namespace

TEST(TextProcessors, EachBuildsBatchesFromTheSyntheticCorpus) {
  struct Case {
    std::string name;
    cs::Config extra;
    std::vector<std::string> keys;
  };
  std::vector<Case> cases = {
      {"GptHDF5DataProcessor",
       {{"data_dir", gpt_dir()}, {"max_sequence_length", 16}},
       {"attention_mask", "input_ids", "labels"}},
      {"GptFlatTokenDataProcessor",
       {{"data_dir", gpt_dir()}, {"max_sequence_length", 16}},
       {"attention_mask", "input_ids", "labels"}},
      {"BertDataProcessor",
       {{"data_dir", bert_dir()}, {"max_sequence_length", 48}, {"vocab_size", 400}},
       {"attention_mask", "input_ids", "mlm_labels", "next_sentence_label", "token_type_ids"}},
      {"T5DataProcessor",
       {{"data_dir", t5_dir()}, {"max_sequence_length", 32}, {"vocab_size", 500}},
       {"attention_mask", "decoder_attention_mask", "decoder_input_ids", "input_ids", "labels"}},
      {"TransformerDataProcessor",
       {{"data_dir", mt_dir()},
        {"max_sequence_length", 40},
        {"max_target_length", 48},
        {"vocab_size", 400}},
       {"attention_mask", "decoder_attention_mask", "decoder_input_ids", "input_ids", "labels"}},
  };
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    cs::Config cfg = c.extra;
    cfg["data_processor"] = c.name;
    cfg["batch_size"] = 4;
    cfg["num_workers"] = 2;
    auto dl = processor(cfg);
    auto b = dl->next();
    ASSERT_TRUE(b.has_value());
    std::vector<std::string> got;
    for (const auto& [k, v] : *b) {
      got.push_back(k);
      EXPECT_EQ(v.dtype(), cs::DType::i32) << k;
      EXPECT_EQ(v.shape()[0], 4) << k;
    }
    EXPECT_EQ(got, c.keys);
  }
}

TEST(TextProcessors, WritesTheCorpusOnFirstUseAndReportsKeyErrors) {
  auto dir = (root() / "fresh_gpt").string();
  cs::Config cfg = {{"data_processor", "GptFlatTokenDataProcessor"},
                    {"data_dir", dir},
                    {"batch_size", 2},
                    {"max_sequence_length", 32}};
  auto dl = processor(cfg);
  EXPECT_TRUE(fs::exists(dir + "/train.bin"));
  EXPECT_TRUE(fs::exists(dir + "/val/data_0.h5"));
  EXPECT_TRUE(dl->next().has_value());
  cs::Config off = {{"data_processor", "BertDataProcessor"},
                    {"data_dir", (root() / "none").string()},
                    {"batch_size", 2},
                    {"vocab_size", 512},
                    {"synthetic", false}};
  expect_error([&] { processor(off); },
               {"train_dataloader.data_dir", "no BERT files", "synthetic"});
  cs::Config unknown = {{"data_processor", "T5DataProcessor"},
                        {"data_dir", t5_dir()},
                        {"batch_size", 2},
                        {"vocab_size", 500},
                        {"noise_densty", 0.2}};
  expect_error([&] { processor(unknown); }, {"noise_densty"});
  cs::Config mismatch = {{"data_processor", "T5DataProcessor"},
                         {"data_dir", t5_dir()},
                         {"batch_size", 2},
                         {"vocab_size", 500},
                         {"max_sequence_length", 64},
                         {"max_target_length", 8}};
  expect_error([&] { processor(mismatch); },
               {"train_dataloader.max_target_length", "encoder and decoder lengths do not match"});
  cs::Config no_vocab = {
      {"data_processor", "TransformerDataProcessor"}, {"data_dir", mt_dir()}, {"batch_size", 2}};
  expect_error([&] { processor(no_vocab); }, {"train_dataloader.vocab_size"});
  cs::Config bad_split = {{"data_processor", "T5DataProcessor"},
                          {"data_dir", t5_dir()},
                          {"batch_size", 2},
                          {"vocab_size", 500},
                          {"split", "test"}};
  expect_error([&] { processor(bad_split); },
               {"train_dataloader.split", "'test'", "train and val"});
}

// The synthetic corpus is written only into a folder holding none of its files: it wrote over a
// user's train.src when train.tgt was missing, and beside a user's train/*.h5 (read together
// with them from then on) when the val split was missing.
TEST(TextProcessors, TheSyntheticCorpusNeverWritesOverOrBesideAUsersFiles) {
  auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  const fs::path tx = root() / "users_translation";
  fs::create_directories(tx);
  std::ofstream(tx / "train.src") << "5 6 7\n";
  cs::Config t = {{"data_processor", "TransformerDataProcessor"},
                  {"data_dir", tx.string()},
                  {"batch_size", 2},
                  {"vocab_size", 512}};
  expect_error([&] { processor(t); }, {"train_dataloader.data_dir",
                                       "no translation files for "
                                       "split 'train' but holds train.src",
                                       "another folder"});
  EXPECT_EQ(bytes(tx / "train.src"), "5 6 7\n");
  EXPECT_FALSE(fs::exists(tx / "train.tgt"));
  const fs::path gh = root() / "users_gpt_h5";
  fs::create_directories(gh / "train");
  std::ofstream(gh / "train" / "mine.h5") << "not read";
  cs::Config g = {{"data_processor", "GptHDF5DataProcessor"},
                  {"data_dir", gh.string()},
                  {"split", "val"},
                  {"batch_size", 2},
                  {"max_sequence_length", 32}};
  expect_error([&] { processor(g); },
               {"no GPT HDF5 files for split 'val' but holds train/mine.h5"});
  EXPECT_FALSE(fs::exists(gh / "train" / "data_0.h5"));
  EXPECT_FALSE(fs::exists(gh / "val"));
}

// The demo configs' data sections build loaders over the default synthetic corpus whose
// vocabulary matches the model's vocab_size (no sequence too long, no id out of range).
TEST(TextProcessors, DemoConfigsDataSectionsLoad) {
  for (std::string name : {"gpt2_tiny", "bert_tiny", "transformer_tiny", "t5_tiny"}) {
    SCOPED_TRACE(name);
    cs::Config cfg =
        cs::load_config_file(std::string(CSTORCH_SOURCE_DIR) + "/configs/" + name + ".yaml");
    const cs::Config& model = cfg["trainer"]["init"]["model"];
    int64_t vocab = model.contains("vocab_size") ? model["vocab_size"].get<int64_t>()
                                                 : model["src_vocab_size"].get<int64_t>();
    for (std::string which : {"train_dataloader", "val_dataloader"}) {
      cs::Config dl = cfg["trainer"]["fit"][which];
      dl["data_dir"] = (root() / ("cfg_" + name)).string();
      EXPECT_EQ(dl["vocab_size"].get<int64_t>(), vocab);
      auto loader = modelzoo::data_processors().create(dl["data_processor"].get<std::string>(),
                                                       modelzoo::ConfigView(dl, which), which);
      int64_t batches = 0;
      while (auto b = loader->next()) {
        for (const auto& [k, v] : *b) {
          if (k == "mlm_labels" || k == "next_sentence_label" ||
              k.find("mask") != std::string::npos)
            continue;
          auto x = v.to_vector<int32_t>();
          EXPECT_LT(*std::max_element(x.begin(), x.end()), vocab) << k;
          EXPECT_GE(*std::min_element(x.begin(), x.end()), 0) << k;
        }
        if (++batches == 20) break;
      }
      EXPECT_GE(batches, 5);  // the val splits are small (200 documents)
    }
    auto tok = BpeTokenizer::from_files((root() / ("cfg_" + name) / "vocab.json").string(),
                                        (root() / ("cfg_" + name) / "merges.txt").string());
    EXPECT_EQ(tok.vocab_size() + (name == "t5_tiny" ? 100 : 0), vocab);
  }
}
