// Text generation from GPT-2: the KV-cache path against the full forward, greedy determinism,
// top-k / top-p filtering, seeded sampling, errors (`cszoo generate`: tests/e2e/test_generate.cpp).
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "cstorch/cstorch.h"
#include "modelzoo/generation/generation.h"
#include "unit/test_util.h"

namespace cstorch::testing {
namespace {

namespace gen = modelzoo::generation;
using modelzoo::gpt2::GPT2Config;
using modelzoo::gpt2::GPT2Model;

// Built anew for each test, as when each test runs in a process of its own: a model kept for
// the process's life would keep its metrics registered (live_metrics()) into later tests of a
// whole-binary or sharded run.
std::unique_ptr<GPT2Model> tiny_model() {
  manual_seed(11);
  auto c = GPT2Config::tiny();
  c.vocab_size = 97;
  c.max_position_embeddings = 48;
  // Sharper distributions than a fresh init so sampling has a real choice structure.
  auto m = std::make_unique<GPT2Model>(c);
  NoGradGuard ng;
  m->wte->weight.mul_(scalar_tensor(8.0));
  return m;
}

// Every step's next-token logits from the cached path equal the full forward's at that
// position (1e-5), for greedy and sampled runs.
TEST(Generation, KvCacheMatchesFullForward) {
  const auto model = tiny_model();
  GPT2Model& m = *model;
  const std::vector<int64_t> prompt{3, 14, 15, 92, 65};
  for (bool sample : {false, true}) {
    gen::GenerationOptions o;
    o.max_new_tokens = 12;
    o.do_sample = sample;
    o.seed = 4;
    o.keep_logits = true;
    auto r = gen::generate(m, prompt, o);
    ASSERT_EQ(r.tokens.size(), 12u);
    std::vector<int64_t> seq = prompt;
    seq.insert(seq.end(), r.tokens.begin(), r.tokens.end() - 1);
    NoGradGuard ng;
    m.eval();
    auto full =
        m.logits(from_vector(seq, {1, static_cast<int64_t>(seq.size())})).to_vector<double>();
    m.train();
    const size_t V = 97, P = prompt.size();
    for (size_t s = 0; s < r.step_logits.size(); ++s) {
      D want(full.begin() + static_cast<long>((P - 1 + s) * V),
             full.begin() + static_cast<long>((P + s) * V));
      D got(r.step_logits[s].begin(), r.step_logits[s].end());
      expect_close(got, want, 1e-5, "step " + std::to_string(s));
    }
    // And without the cache (the whole sequence recomputed each step) the same tokens.
    o.use_cache = false;
    EXPECT_EQ(gen::generate(m, prompt, o).tokens, r.tokens);
  }
}

TEST(Generation, GreedyIsDeterministicAndArgmax) {
  const auto model = tiny_model();
  GPT2Model& m = *model;
  gen::GenerationOptions o;
  o.max_new_tokens = 10;
  o.keep_logits = true;
  auto a = gen::generate(m, {1, 2, 3}, o);
  auto b = gen::generate(m, {1, 2, 3}, o);
  EXPECT_EQ(a.tokens, b.tokens);
  for (size_t s = 0; s < a.tokens.size(); ++s) {
    const auto& row = a.step_logits[s];
    for (float v : row) EXPECT_LE(v, row[static_cast<size_t>(a.tokens[s])]);
  }
  // The model's training mode is restored.
  EXPECT_TRUE(m.is_training());
  // eos stops generation after emitting it.
  o.eos_token_id = a.tokens[2];
  auto c = gen::generate(m, {1, 2, 3}, o);
  ASSERT_LE(c.tokens.size(), 3u);
  EXPECT_EQ(c.tokens.back(), a.tokens[2]);
}

TEST(Generation, GreedyTokenTiesGoToLowestId) {
  EXPECT_EQ(gen::greedy_token({0.5f, 2.f, 2.f, -1.f}), 1);
}

TEST(Generation, TopKNeverSamplesOutsideTopK) {
  const std::vector<float> logits{0.1f, 3.f, -2.f, 2.5f, 1.f, 2.9f, 0.f, -1.f};
  gen::GenerationOptions o;
  o.do_sample = true;
  o.top_k = 3;
  auto p = gen::sampling_distribution(logits, o);
  // Exactly tokens 1, 5, 3 carry mass, renormalised softmax.
  auto e = [&](size_t i) { return std::exp(static_cast<double>(logits[i])); };
  const double z = e(1) + e(5) + e(3);
  EXPECT_NEAR(p[1], e(1) / z, 1e-12);
  EXPECT_NEAR(p[5], e(5) / z, 1e-12);
  EXPECT_NEAR(p[3], e(3) / z, 1e-12);
  for (size_t i : {0, 2, 4, 6, 7}) EXPECT_EQ(p[i], 0.0) << i;
  std::map<int64_t, int> counts;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    o.seed = seed;
    gen::Sampler s(o);
    for (int i = 0; i < 50; ++i) ++counts[s.next(logits)];
  }
  for (auto& [tok, n] : counts) EXPECT_TRUE(tok == 1 || tok == 5 || tok == 3) << tok;
  EXPECT_EQ(counts.size(), 3u);  // and every one of them is drawn
  // top_k 1 is greedy.
  o.top_k = 1;
  gen::Sampler s1(o);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s1.next(logits), 1);
}

TEST(Generation, TopPRespectsTheNucleus) {
  // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (logs of them as logits).
  const std::vector<float> logits{std::log(0.0625f), std::log(0.5f), std::log(0.125f),
                                  std::log(0.25f), std::log(0.0625f)};
  gen::GenerationOptions o;
  o.do_sample = true;
  auto mass = [&](double p) {
    o.top_p = p;
    auto d = gen::sampling_distribution(logits, o);
    int n = 0;
    for (double x : d) n += x > 0;
    return std::make_pair(n, d);
  };
  // The fewest top tokens reaching the mass: 0.5 -> {1}; 0.6 -> {1, 3}; 0.75 -> {1, 3};
  // 0.8 -> {1, 3, 2}; 1 -> all.
  EXPECT_EQ(mass(0.5).first, 1);
  EXPECT_EQ(mass(0.6).first, 2);
  EXPECT_EQ(mass(0.75).first, 2);
  auto [n, d] = mass(0.8);
  EXPECT_EQ(n, 3);
  EXPECT_NEAR(d[1], 0.5 / 0.875, 1e-6);
  EXPECT_NEAR(d[3], 0.25 / 0.875, 1e-6);
  EXPECT_NEAR(d[2], 0.125 / 0.875, 1e-6);
  EXPECT_EQ(mass(1.0).first, 5);
  EXPECT_EQ(mass(0.01).first, 1);  // at least one token
  // Draws stay in the nucleus and hit all of it.
  o.top_p = 0.8;
  std::map<int64_t, int> counts;
  gen::Sampler s(o);
  for (int i = 0; i < 2000; ++i) ++counts[s.next(logits)];
  EXPECT_EQ(counts.size(), 3u);
  for (auto& [tok, c] : counts) EXPECT_TRUE(tok == 1 || tok == 3 || tok == 2) << tok;
  // Frequencies follow the renormalised probabilities (binomial sd ~ 0.011 at n = 2000).
  EXPECT_NEAR(counts[1] / 2000.0, 0.5 / 0.875, 0.05);
  // Temperature sharpens before filtering: at T = 0.25 token 1 alone holds > 0.8.
  o.temperature = 0.25;
  EXPECT_EQ(mass(0.8).first, 1);
}

TEST(Generation, SeededSamplingRepeats) {
  const auto model = tiny_model();
  GPT2Model& m = *model;
  gen::GenerationOptions o;
  o.max_new_tokens = 16;
  o.do_sample = true;
  o.top_k = 20;
  o.top_p = 0.95;
  o.temperature = 1.5;
  o.seed = 123;
  auto a = gen::generate(m, {7, 8}, o);
  auto b = gen::generate(m, {7, 8}, o);
  EXPECT_EQ(a.tokens, b.tokens);
  // Another seed gives another sequence (16 draws from a flattened distribution).
  o.seed = 124;
  EXPECT_NE(gen::generate(m, {7, 8}, o).tokens, a.tokens);
}

TEST(Generation, Errors) {
  const auto model = tiny_model();
  GPT2Model& m = *model;
  gen::GenerationOptions o;
  EXPECT_ERROR(gen::generate(m, {}, o), "prompt is empty");
  EXPECT_ERROR(gen::generate(m, {1, 97}, o), "prompt token 97 (position 1)", "vocabulary [0, 97)");
  o.max_new_tokens = 46;
  EXPECT_ERROR(gen::generate(m, {1, 2, 3}, o), "prompt (3 tokens)", "max_new_tokens (46)",
               "max_position_embeddings 48");
  o.max_new_tokens = 4;
  o.do_sample = true;
  o.temperature = 0;
  EXPECT_ERROR(gen::generate(m, {1}, o), "temperature must be positive");
  o.temperature = 1;
  o.top_p = 0;
  EXPECT_ERROR(gen::generate(m, {1}, o), "top_p must be in (0, 1]");
  o.top_p = 1;
  o.top_k = -1;
  EXPECT_ERROR(gen::generate(m, {1}, o), "top_k must be >= 0");
}

}  // namespace
}  // namespace cstorch::testing
