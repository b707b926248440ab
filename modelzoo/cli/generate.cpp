// cszoo generate: text generation from a trained causal LM (GPT-2).
//
//   cszoo generate --params configs/gpt2_tiny.yaml --checkpoint model_dir/checkpoint_100.mdl
//       --prompt_ids 1,2,3 --max_new_tokens 20 [--top_k 40] [--top_p 0.9] [--temperature 0.8]
//       [--seed 1] [--eos_token_id ID]
//
// Greedy unless --top_k, --top_p or --temperature asks for sampling (--temperature 0 is
// greedy). Prints the prompt and generated ids, and the text when --tokenizer names the
// byte-level BPE files (the embedded corpus writes them next to its data: data/gpt2/vocab.json,
// data/gpt2/merges.txt).
#include <filesystem>
#include <sstream>

#include "cstorch/checkpoint.h"
#include "cstorch/config.h"
#include "cstorch/data/tokenizer.h"
#include "modelzoo/cli.h"
#include "modelzoo/cli/whole_number.h"
#include "modelzoo/generation/generation.h"
#include "modelzoo/legacy.h"

namespace modelzoo {

namespace {

struct GenerateArgs {
  std::string params, checkpoint, prompt, prompt_ids, tokenizer;
  int64_t max_new_tokens = 20;
  // Set only when given on the command line.
  std::optional<int64_t> top_k, eos_token_id;
  std::optional<double> top_p, temperature;
  uint64_t seed = 0;
  // What CLI11 parses into (2.1 has no std::optional options).
  int64_t top_k_in = 0, eos_in = 0;
  double top_p_in = 1, temperature_in = 1;
};

std::vector<int64_t> parse_ids(const std::string& s) {
  std::vector<int64_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && std::isspace(static_cast<unsigned char>(item[used]))) ++used;
    CS_CHECK(!item.empty() && used == item.size(),
             "--prompt_ids: '{}' is not an integer (expected comma-separated token ids, e.g. "
             "1,2,3)",
             item);
    ids.push_back(v);
  }
  return ids;
}

// The model section of a Trainer config (the first trainer of a list) or of a legacy params
// file.
Config model_section(const std::string& path) {
  Config root = cstorch::load_config_file(path);
  if (is_legacy_params(root)) root = convert_legacy_params(root, "train");
  CS_CHECK(root.is_object() && root.contains("trainer"), "{}: no trainer section", path);
  Config t = root["trainer"];
  if (t.is_array()) {
    CS_CHECK(!t.empty() && t[0].is_object() && t[0].contains("trainer"),
             "{}: trainer[0] has no trainer entry", path);
    t = t[0]["trainer"];
  }
  CS_CHECK(
      t.is_object() && t.contains("init") && t["init"].is_object() && t["init"].contains("model"),
      "{}: no trainer.init.model section", path);
  return t["init"]["model"];
}

void run_generate(const GenerateArgs& a) {
  namespace gen = generation;
  std::optional<cstorch::data::BpeTokenizer> tok;
  if (!a.tokenizer.empty()) {
    auto comma = a.tokenizer.find(',');
    CS_CHECK(comma != std::string::npos,
             "--tokenizer: expected VOCAB_JSON,MERGES_TXT (two files), got '{}'", a.tokenizer);
    const std::string vocab = a.tokenizer.substr(0, comma), merges = a.tokenizer.substr(comma + 1);
    for (const auto& f : {vocab, merges})
      CS_CHECK(std::filesystem::is_regular_file(f), "--tokenizer: '{}' does not exist", f);
    tok = cstorch::data::BpeTokenizer::from_files(vocab, merges);
  }
  CS_CHECK(a.prompt.empty() != a.prompt_ids.empty(),
           "generate: give the prompt either as --prompt \"text\" or as --prompt_ids 1,2,3 "
           "(exactly one)");
  std::vector<int64_t> prompt;
  if (!a.prompt.empty()) {
    CS_CHECK(tok.has_value(),
             "--prompt: text prompts need a tokenizer (--tokenizer vocab.json,merges.txt); or "
             "pass token ids with --prompt_ids");
    prompt = tok->encode(a.prompt);
  } else {
    prompt = parse_ids(a.prompt_ids);
  }

  Config margs = model_section(a.params);
  ConfigView mv(margs, "trainer.init.model");
  mv.expect_map();
  const std::string name = mv.at("name").as_string();
  margs.erase("name");
  ModelPtr model = models().create(name, ConfigView(margs, mv.path()), mv.child_path("name"));
  auto* lm = dynamic_cast<gpt2::GPT2Model*>(model.get());
  CS_CHECK(lm != nullptr,
           "{}: model '{}' is not a causal language model with a KV cache (generate supports "
           "gpt2)",
           mv.child_path("name"), name);

  cstorch::State s = cstorch::load(a.checkpoint);
  const cstorch::State& weights = s.is_map() && s.contains("model") ? s.at("model") : s;
  try {
    model->load_state_dict(cstorch::nn::StateDict::from_state(weights));
  } catch (const cstorch::Error& e) {
    cstorch::fail("--checkpoint {}: the weights do not fit the model of {}: {}", a.checkpoint,
                  a.params, e.what());
  }

  gen::GenerationOptions o;
  o.max_new_tokens = a.max_new_tokens;
  o.do_sample = a.top_k.has_value() || a.top_p.has_value() ||
                (a.temperature.has_value() && *a.temperature != 0);
  if (a.temperature && *a.temperature == 0) o.do_sample = false;
  o.temperature = a.temperature.value_or(1.0);
  o.top_k = a.top_k.value_or(0);
  o.top_p = a.top_p.value_or(1.0);
  o.seed = a.seed;
  o.eos_token_id = a.eos_token_id;
  CS_CHECK(!a.temperature || *a.temperature >= 0, "--temperature must be >= 0, got {}",
           *a.temperature);
  gen::GenerationResult r = gen::generate(*lm, prompt, o);
  fmt::print("prompt_ids: {}\n", fmt::join(prompt, ","));
  fmt::print("generated_ids: {}\n", fmt::join(r.tokens, ","));
  if (tok) fmt::print("text: {}{}\n", a.prompt, tok->decode(r.tokens));
}

}  // namespace

void register_generate_command(CLI::App& app, int& status) {
  static GenerateArgs a;
  auto* g = app.add_subcommand(
      "generate",
      "Generate tokens from a trained causal LM (GPT-2): greedy or top-k/top-p sampling");
  g->add_option("--params", a.params, "YAML config whose trainer.init.model is the model")
      ->required();
  g->add_option("--checkpoint", a.checkpoint, "Checkpoint with the trained weights")->required();
  g->add_option("--prompt", a.prompt, "Prompt text (needs --tokenizer)");
  g->add_option("--prompt_ids", a.prompt_ids, "Prompt token ids, comma-separated: 1,2,3");
  g->add_option("--tokenizer", a.tokenizer, "Byte-level BPE files: vocab.json,merges.txt");
  g->add_option("--max_new_tokens", a.max_new_tokens, "Tokens to generate (default 20)")
      ->transform(cli::whole_number<int64_t>());
  auto* top_k = g->add_option("--top_k", a.top_k_in, "Sample from the k most likely tokens")
                    ->transform(cli::whole_number<int64_t>());
  auto* top_p = g->add_option("--top_p", a.top_p_in, "Sample from the nucleus of mass p");
  auto* temp =
      g->add_option("--temperature", a.temperature_in, "Sampling temperature (0 = greedy)");
  g->add_option("--seed", a.seed, "Sampling seed (default 0)")
      ->transform(cli::whole_number<uint64_t>());
  auto* eos = g->add_option("--eos_token_id", a.eos_in, "Stop after generating this token")
                  ->transform(cli::whole_number<int64_t>());
  g->callback([&status, top_k, top_p, temp, eos] {
    if (top_k->count()) a.top_k = a.top_k_in;
    if (top_p->count()) a.top_p = a.top_p_in;
    if (temp->count()) a.temperature = a.temperature_in;
    if (eos->count()) a.eos_token_id = a.eos_in;
    run_generate(a);
    status = 0;
  });
}

}  // namespace modelzoo
