// End to end: every transformer model's demo config (configs/{gpt2,bert,transformer,t5}_tiny.yaml)
// trains with `cszoo fit` on the embedded synthetic corpus, which the data processors write on
// first use, and its training loss falls well below the initial value.
//
// The run is the shipped config with fewer steps (max_steps and eval_frequency replaced; every
// other key as shipped), started in an empty folder so that data/ and model_dir/ land there.
// "Initial value" is the loss of an untrained model: ln(vocab) for the language models, plus
// ln(2) for BERT's next-sentence head. The thresholds below were set from measured runs with a
// margin (see the table in each case) and are far below what a model that does not learn gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

#include "e2e/e2e_util.h"

namespace fs = std::filesystem;

namespace {

struct Case {
  std::string config;   // configs/<config>.yaml
  int steps;            // max_steps of the shortened run
  double initial;       // loss of an untrained model
  double max_fraction;  // mean of the last three logged losses must be below this x initial
};

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs the shortened config in a fresh folder and checks the loss; returns the folder (kept for
// follow-up commands; the caller removes it).
fs::path fit_and_check(const Case& c) {
  const fs::path dir = e2e::temp_dir("cstorch_e2e_fit", c.config);
  std::string yaml = read_text(fs::path(CSTORCH_SOURCE_DIR) / "configs" / (c.config + ".yaml"));
  const std::string steps = std::to_string(c.steps);
  yaml = std::regex_replace(yaml, std::regex(R"(max_steps: \d+)"), "max_steps: " + steps);
  yaml = std::regex_replace(yaml, std::regex(R"(eval_frequency: \d+)"), "eval_frequency: " + steps);
  yaml = std::regex_replace(yaml, std::regex(R"(log_steps: \d+)"), "log_steps: 5");
  yaml = std::regex_replace(yaml, std::regex(R"(\n(\s+)steps: \d+)"), "\n$1steps: " + steps);
  std::ofstream(dir / "config.yaml") << yaml;

  int status = 0;
  const std::string out = e2e::run(
      "cd " + dir.string() + " && " + CSTORCH_BINARY_DIR + "/cszoo fit config.yaml", &status);
  EXPECT_EQ(status, 0) << out;
  if (status != 0) return dir;

  // Logged training losses, in step order.
  std::vector<double> losses;
  fs::path metrics;
  for (auto& e : fs::recursive_directory_iterator(dir / "model_dir"))
    if (e.path().filename() == "metrics.jsonl") metrics = e.path();
  EXPECT_FALSE(metrics.empty()) << out;
  if (metrics.empty()) return dir;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss") && !j.contains("phase")) losses.push_back(j["loss"].get<double>());
  }
  EXPECT_GE(losses.size(), 6u) << read_text(metrics);
  if (losses.size() < 6) return dir;
  // The first logged loss (step 5) is still near the untrained value: the model did start there.
  EXPECT_GT(losses.front(), 0.6 * c.initial) << read_text(metrics);
  double tail =
      (losses[losses.size() - 1] + losses[losses.size() - 2] + losses[losses.size() - 3]) / 3;
  std::printf(
      "%s: initial %.3f, step-5 loss %.3f, mean of the last three logged %.3f (%.2f x "
      "initial; limit %.2f)\n",
      c.config.c_str(), c.initial, losses.front(), tail, tail / c.initial, c.max_fraction);
  EXPECT_LT(tail, c.max_fraction * c.initial)
      << c.config << ": mean of the last three logged losses " << tail << ", initial " << c.initial
      << "\n"
      << read_text(metrics);
  EXPECT_NE(out.find("validation at step " + steps), std::string::npos) << out;
  return dir;
}

}  // namespace

// Measured: step-5 loss 5.59, mean of steps 140-150 1.62 = 0.26 x ln(512).
// Then `cszoo generate` continues a text prompt from the trained checkpoint with the corpus'
// BPE files.
TEST(TransformerFit, Gpt2TinyLossFallsAndGenerates) {
  const fs::path dir = fit_and_check({"gpt2_tiny", 150, std::log(512.0), 0.45});
  int status = 0;
  const std::string out = e2e::run(
      "cd " + dir.string() + " && " + CSTORCH_BINARY_DIR +
          "/cszoo generate --params config.yaml --checkpoint model_dir/gpt2_tiny/checkpoint_150.mdl"
          " --tokenizer data/gpt2/vocab.json,data/gpt2/merges.txt --prompt 'the cat' "
          "--max_new_tokens 12",
      &status);
  EXPECT_EQ(status, 0) << out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(generated_ids: ([0-9,]+)\n)"))) << out;
  EXPECT_EQ(std::count(m[1].first, m[1].second, ','), 11) << out;  // 12 new tokens
  EXPECT_NE(out.find("text: the cat"), std::string::npos) << out;
  fs::remove_all(dir);
}

// MLM (15% of tokens) + NSP learns slower than the causal LM: the shipped 300 steps.
// Measured: step-5 loss 6.66, mean of steps 290-300 about 0.65 x (ln(512) + ln(2)).
TEST(TransformerFit, BertTinyLossFalls) {
  fs::remove_all(fit_and_check({"bert_tiny", 300, std::log(512.0) + std::log(2.0), 0.72}));
}

// Measured: step-5 loss 5.47, steps 140-150 1.19 = 0.19 x ln(512) (the synthetic translation
// task is easy).
TEST(TransformerFit, TransformerTinyLossFalls) {
  fs::remove_all(fit_and_check({"transformer_tiny", 150, std::log(512.0), 0.45}));
}

// Measured: span-corruption targets; step-5 loss 5.97, steps 140-150 3.25 = 0.51 x ln(612).
TEST(TransformerFit, T5TinyLossFalls) {
  fs::remove_all(fit_and_check({"t5_tiny", 150, std::log(612.0), 0.65}));
}
