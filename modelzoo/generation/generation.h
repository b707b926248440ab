// Text generation from a trained causal LM (GPT-2): greedy decoding or sampling with
// temperature, top-k and top-p (nucleus) filtering, seeded, over the model's KV cache (each
// new token costs one position of compute; the prompt is processed once).
//
//   GenerationOptions o;  o.max_new_tokens = 20;  o.do_sample = true;  o.top_k = 40;
//   auto out = generate(model, {464, 2068}, o);  // out.tokens: the new token ids
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "modelzoo/models/gpt2/gpt2.h"

namespace modelzoo::generation {

struct GenerationOptions {
  int64_t max_new_tokens = 20;
  // false: greedy (the most likely token; ties go to the lowest id). true: sample from the
  // filtered distribution below.
  bool do_sample = false;
  double temperature = 1.0;  // logits / temperature before filtering (> 0 when sampling)
  int64_t top_k = 0;         // keep the k most likely tokens (0 = all)
  double top_p = 1.0;        // keep the smallest set of most likely tokens whose mass >= top_p
  uint64_t seed = 0;         // the sampler's own generator (std::mt19937_64): repeatable
  std::optional<int64_t> eos_token_id;  // stop after generating it
  // false: recompute the whole sequence each step (a check of the cached path; slow).
  bool use_cache = true;
  // Keep each step's next-token logits in GenerationResult::step_logits (tests).
  bool keep_logits = false;
};

// Errors naming the option: max_new_tokens < 0, temperature <= 0 while sampling, top_k < 0,
// top_p outside (0, 1].
void check_options(const GenerationOptions& o);

// The probabilities sampling draws from, for one row of next-token logits: softmax of
// logits / temperature (in double), then only the top_k most likely tokens (ties: the lower
// id first), then only the nucleus: the fewest most likely tokens whose probability sums to
// at least top_p (at least one token), renormalised. Filtered tokens have probability 0.
std::vector<double> sampling_distribution(const std::vector<float>& logits,
                                          const GenerationOptions& o);

// The most likely token (the lowest id among equal maxima).
int64_t greedy_token(const std::vector<float>& logits);

// Draws token ids from sampling_distribution with its own seeded generator.
class Sampler {
 public:
  explicit Sampler(const GenerationOptions& o);
  int64_t next(const std::vector<float>& logits);

 private:
  GenerationOptions o_;
  std::mt19937_64 rng_;
};

struct GenerationResult {
  std::vector<int64_t> tokens;                  // the generated ids (not the prompt)
  std::vector<std::vector<float>> step_logits;  // per generated token, when keep_logits
};

// Generates up to max_new_tokens after `prompt` (batch of one), in eval mode without
// gradients (the model's training mode is restored afterwards). Errors: an empty prompt; a
// prompt token outside the vocabulary (named with its position); prompt length +
// max_new_tokens beyond max_position_embeddings (the model has no positions past it); bad
// options (check_options).
GenerationResult generate(gpt2::GPT2Model& model, const std::vector<int64_t>& prompt,
                          const GenerationOptions& o);

}  // namespace modelzoo::generation
