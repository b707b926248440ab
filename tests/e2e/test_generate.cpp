// `cszoo generate`: text generation from a GPT-2 checkpoint on the command line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "e2e/e2e_util.h"
#include "modelzoo/generation/generation.h"

namespace cstorch {
namespace {

namespace gen = modelzoo::generation;
using modelzoo::gpt2::GPT2Config;
using modelzoo::gpt2::GPT2Model;

int run(const std::string& cmd, std::string* out) {
  int status = 0;
  *out = e2e::run(cmd, &status);
  return status;
}

// cszoo generate on a checkpoint written the way the Trainer writes them ({"model": ...}):
// greedy and seeded sampled ids equal the library's, errors are clear.
TEST(CszooGenerate, GreedySampledAndErrors) {
  namespace fs = std::filesystem;
  const fs::path dir = e2e::temp_dir("cstorch", "generate");
  const std::string cfg = (dir / "gpt2.yaml").string(), ckpt = (dir / "ckpt.mdl").string();
  {
    std::ofstream f(cfg);
    f << "trainer:\n  init:\n    model:\n      name: gpt2\n      vocab_size: 97\n"
         "      hidden_size: 64\n      num_hidden_layers: 2\n      num_heads: 4\n"
         "      max_position_embeddings: 48\n      filter_size: 256\n";
  }
  manual_seed(11);
  auto c = GPT2Config::tiny();
  c.vocab_size = 97;
  c.max_position_embeddings = 48;
  GPT2Model m(c);
  save(State::map({{"model", m.state_dict().to_state()}}), ckpt);
  const std::string cszoo = std::string(CSTORCH_BINARY_DIR) + "/cszoo";
  const std::string base = cszoo + " generate --params " + cfg + " --checkpoint " + ckpt;
  std::string out;
  ASSERT_EQ(run(base + " --prompt_ids 1,2,3 --max_new_tokens 10", &out), 0) << out;
  gen::GenerationOptions o;
  o.max_new_tokens = 10;
  auto greedy = gen::generate(m, {1, 2, 3}, o);
  std::string ids;
  for (size_t i = 0; i < greedy.tokens.size(); ++i)
    ids += (i ? "," : "") + std::to_string(greedy.tokens[i]);
  EXPECT_NE(out.find("generated_ids: " + ids + "\n"), std::string::npos) << out;
  // Sampling with a seed repeats and matches the library.
  std::string a, b;
  const std::string sample = base +
                             " --prompt_ids 5,6 --max_new_tokens 8 --top_k 10 --top_p 0.9 "
                             "--temperature 1.3 --seed 9";
  ASSERT_EQ(run(sample, &a), 0) << a;
  ASSERT_EQ(run(sample, &b), 0) << b;
  EXPECT_EQ(a, b);
  o = {};
  o.max_new_tokens = 8;
  o.do_sample = true;
  o.top_k = 10;
  o.top_p = 0.9;
  o.temperature = 1.3;
  o.seed = 9;
  auto s = gen::generate(m, {5, 6}, o);
  ids.clear();
  for (size_t i = 0; i < s.tokens.size(); ++i) ids += (i ? "," : "") + std::to_string(s.tokens[i]);
  EXPECT_NE(a.find("generated_ids: " + ids + "\n"), std::string::npos) << a;
  // Errors.
  EXPECT_EQ(run(base + " --prompt \"hello\"", &out), 1);
  EXPECT_NE(out.find("text prompts need a tokenizer"), std::string::npos) << out;
  {
    std::ofstream(dir / "vocab.json") << "{}";
    std::ofstream(dir / "merges.txt") << "";
  }
  EXPECT_EQ(run(base + " --prompt hi --tokenizer " + (dir / "vocab.json").string() + "," +
                    (dir / "merges.txt").string(),
                &out),
            1);
  // An empty vocabulary is a malformed tokenizer file, named in the error.
  EXPECT_NE(out.find("vocab.json"), std::string::npos) << out;
  EXPECT_NE(out.find("error:"), std::string::npos) << out;
  EXPECT_EQ(run(base + " --prompt_ids 1,x,3", &out), 1);
  EXPECT_NE(out.find("'x' is not an integer"), std::string::npos) << out;
  EXPECT_EQ(run(base + " --prompt_ids 1,2 --max_new_tokens 50", &out), 1);
  EXPECT_NE(out.find("max_position_embeddings 48"), std::string::npos) << out;
  {
    std::ofstream f(dir / "t5.yaml");
    f << "trainer:\n  init:\n    model:\n      name: t5\n      vocab_size: 97\n";
  }
  EXPECT_EQ(run(cszoo + " generate --params " + (dir / "t5.yaml").string() + " --checkpoint " +
                    ckpt + " --prompt_ids 1",
                &out),
            1);
  EXPECT_NE(out.find("not a causal language model"), std::string::npos) << out;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cstorch
