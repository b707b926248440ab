// Greedy and sampled generation with a KV cache (see generation.h).
#include "modelzoo/generation/generation.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cstorch/core/error.h"

namespace modelzoo::generation {

namespace cs = cstorch;

void check_options(const GenerationOptions& o) {
  CS_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got {}",
           o.max_new_tokens);
  CS_CHECK(!o.do_sample || (o.temperature > 0 && std::isfinite(o.temperature)),
           "generate: temperature must be positive when sampling, got {} (use greedy decoding "
           "for temperature 0)",
           o.temperature);
  CS_CHECK(o.top_k >= 0, "generate: top_k must be >= 0 (0 = no limit), got {}", o.top_k);
  CS_CHECK(o.top_p > 0 && o.top_p <= 1, "generate: top_p must be in (0, 1], got {}", o.top_p);
}

int64_t greedy_token(const std::vector<float>& logits) {
  CS_CHECK(!logits.empty(), "generate: empty logits");
  return static_cast<int64_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

std::vector<double> sampling_distribution(const std::vector<float>& logits,
                                          const GenerationOptions& o) {
  check_options(o);
  const size_t V = logits.size();
  CS_CHECK(V > 0, "generate: empty logits");
  size_t keep = V;
  if (o.top_k > 0) keep = std::min(keep, static_cast<size_t>(o.top_k));
  // The kept tokens by descending logit (ties: lower id first, a total order, so only the first
  // `keep` need sorting); temperature keeps the order.
  std::vector<size_t> order(V);
  std::iota(order.begin(), order.end(), size_t{0});
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    [&](size_t a, size_t b) {
                      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
                    });
  const double inv_t = o.do_sample ? 1.0 / o.temperature : 1.0;
  // Softmax over the kept tokens (max-subtracted, in double).
  const double top = static_cast<double>(logits[order[0]]) * inv_t;
  std::vector<double> p(keep);
  double z = 0;
  for (size_t i = 0; i < keep; ++i)
    z += p[i] = std::exp(static_cast<double>(logits[order[i]]) * inv_t - top);
  for (auto& x : p) x /= z;
  if (o.top_p < 1) {
    // The nucleus: add tokens while the mass before them is still short of top_p.
    double mass = 0;
    size_t n = 0;
    while (n < keep && (n == 0 || mass < o.top_p)) mass += p[n++];
    keep = n;
    for (size_t i = 0; i < keep; ++i) p[i] /= mass;
  }
  std::vector<double> dist(V, 0.0);
  for (size_t i = 0; i < keep; ++i) dist[order[i]] = p[i];
  return dist;
}

Sampler::Sampler(const GenerationOptions& o) : o_(o), rng_(o.seed) {
  check_options(o);
}

int64_t Sampler::next(const std::vector<float>& logits) {
  if (!o_.do_sample) return greedy_token(logits);
  const std::vector<double> dist = sampling_distribution(logits, o_);
  // A uniform double in [0, 1) from 53 bits (std::uniform_real_distribution is not specified
  // bit-exactly across standard libraries; this is).
  const double u = static_cast<double>(rng_() >> 11) * (1.0 / 9007199254740992.0);
  double c = 0;
  int64_t last = -1;
  for (size_t i = 0; i < dist.size(); ++i) {
    if (dist[i] <= 0) continue;
    last = static_cast<int64_t>(i);
    c += dist[i];
    if (u < c) return last;
  }
  return last;  // rounding left u just above the total mass: the last kept token
}

namespace {

// Restores the model's training mode however generate() leaves.
struct EvalScope {
  explicit EvalScope(cs::nn::Module& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  ~EvalScope() { m_.train(was_training_); }
  cs::nn::Module& m_;
  bool was_training_;
};

std::vector<float> last_row(const cs::Tensor& logits) {
  const int64_t T = logits.size(1), V = logits.size(2);
  return cs::reshape(cs::slice(logits, 1, T - 1, T), {V}).to_vector<float>();
}

}  // namespace

GenerationResult generate(gpt2::GPT2Model& model, const std::vector<int64_t>& prompt,
                          const GenerationOptions& o) {
  check_options(o);
  const auto& c = model.config();
  CS_CHECK(!prompt.empty(), "generate: the prompt is empty (give at least one token id)");
  for (size_t i = 0; i < prompt.size(); ++i)
    CS_CHECK(prompt[i] >= 0 && prompt[i] < c.vocab_size,
             "generate: prompt token {} (position {}) is outside the vocabulary [0, {})", prompt[i],
             i, c.vocab_size);
  const int64_t P = static_cast<int64_t>(prompt.size());
  CS_CHECK(P + o.max_new_tokens <= c.max_position_embeddings,
           "generate: the prompt ({} tokens) plus max_new_tokens ({}) is {} positions, more than "
           "the model's max_position_embeddings {}",
           P, o.max_new_tokens, P + o.max_new_tokens, c.max_position_embeddings);
  EvalScope scope(model);
  cs::NoGradGuard no_grad;
  Sampler sampler(o);
  GenerationResult r;
  std::vector<int64_t> seq = prompt;
  gpt2::KVCache cache;
  gpt2::KVCache* kv = o.use_cache ? &cache : nullptr;
  cs::Tensor logits = model.logits(cs::from_vector(seq, {1, P}), kv);
  for (int64_t i = 0; i < o.max_new_tokens; ++i) {
    std::vector<float> row = last_row(logits);
    const int64_t tok = sampler.next(row);
    if (o.keep_logits) r.step_logits.push_back(std::move(row));
    r.tokens.push_back(tok);
    seq.push_back(tok);
    if ((o.eos_token_id && tok == *o.eos_token_id) || i + 1 == o.max_new_tokens) break;
    logits = o.use_cache
                 ? model.logits(cs::from_vector(std::vector<int64_t>{tok}, {1, 1}), kv)
                 : model.logits(cs::from_vector(seq, {1, static_cast<int64_t>(seq.size())}));
  }
  return r;
}

}  // namespace modelzoo::generation
