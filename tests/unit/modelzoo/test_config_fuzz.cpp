// Fuzzing the config loader: random mutations of a valid trainer config (character flips,
// deletions, duplications, swapped values) go through the YAML parser, the Trainer's
// configuration and the legacy converter. Every outcome must be success or a cstorch::Error;
// anything else (another exception type, a crash, a hang) fails the test. Bounded time:
// CSTORCH_FUZZ_SECONDS (default 3).
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "cstorch/cstorch.h"
#include "modelzoo/legacy.h"
#include "modelzoo/trainer.h"

namespace cs = cstorch;
using modelzoo::Config;
using modelzoo::ConfigView;

namespace {

// A model that validates its arguments like a real one but allocates one small parameter, so
// mutated sizes cannot ask for gigabytes.
class FuzzModel : public modelzoo::Model {
 public:
  FuzzModel() : Model("FuzzModel") { register_parameter("w", cs::zeros({2, 2})); }
  cs::Tensor loss(const cs::Batch&) override { return cs::sum(parameters()[0]); }
};
MODELZOO_REGISTER(models, "fuzz_model", [](const ConfigView& a) -> modelzoo::ModelPtr {
  a.check_keys({"depth", "hidden_size"});
  a.get_int("depth", 1);
  a.get_int("hidden_size", 1);
  return std::make_shared<FuzzModel>();
});

const char* kSeed = R"(trainer:
  init:
    device: CPU
    model_dir: fuzz_model_dir
    seed: 1
    model: {name: fuzz_model, depth: 2, hidden_size: 8}
    optimizer: {AdamW: {lr: 0.001, weight_decay: 0.01, betas: [0.9, 0.99]}}
    schedulers: [{CosineDecayLR: {initial_learning_rate: 0.001, end_learning_rate: 0.0, total_iters: 100}}]
    precision: {enabled: true, dtype: f16, loss_scaling_factor: dynamic, max_gradient_norm: 1.0}
    loop: {max_steps: 100, eval_frequency: 10, eval_steps: 2, grad_accum_steps: 1}
    checkpoint: {steps: 10, keep_last: 2, autoload_last_checkpoint: false}
    logging: {log_steps: 5, progress: false, plot: false}
    loggers: [JSONLines, {CSV: {file: fuzz.csv}}]
)";

const char* kLegacy = R"(train_input: {data_processor: MNISTDataProcessor, batch_size: 8}
eval_input: {data_processor: MNISTDataProcessor, batch_size: 8, split: test}
model: {name: fuzz_model, depth: 2}
optimizer: {optimizer_type: SGD, learning_rate: 0.1, momentum: 0.9}
runconfig: {max_steps: 10, save_checkpoints_steps: 5, model_dir: fuzz_legacy, mode: train}
)";

std::string mutate(std::string s, std::mt19937_64& rng) {
  static const char* kTokens[] = {"",      "-1",   "0",    "1e9",          "ten",    "[]",
                                  "{}",    "null", "true", "{a: 1}",       "[1, 2]", ":",
                                  "\"x\"", "\n  ", "- ",   "9999999999999"};
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < n && !s.empty(); ++i) {
    size_t pos = rng() % s.size();
    switch (rng() % 5) {
      case 0:
        s[pos] = static_cast<char>(32 + rng() % 95);
        break;  // flip a character
      case 1:
        s.erase(pos, 1 + rng() % 8);
        break;  // delete a run
      case 2:
        s.insert(pos, s.substr(rng() % s.size(), rng() % 12));
        break;   // duplicate
      case 3: {  // replace a value
        size_t colon = s.find(": ", pos);
        if (colon == std::string::npos) break;
        size_t end = s.find_first_of(",}\n]", colon + 2);
        if (end == std::string::npos) break;
        s.replace(colon + 2, end - colon - 2, kTokens[rng() % std::size(kTokens)]);
        break;
      }
      default:
        s.insert(pos, kTokens[rng() % std::size(kTokens)]);  // insert a token
    }
  }
  return s;
}

}  // namespace

TEST(ConfigFuzz, MutatedConfigsGiveClearErrorsOnly) {
  auto dir = std::filesystem::temp_directory_path() /
             ("cstorch_config_fuzz_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::current_path(dir);  // mutated model_dir / file paths land here
  const char* env = std::getenv("CSTORCH_FUZZ_SECONDS");
  const double seconds = env ? std::atof(env) : 3.0;
  std::mt19937_64 rng(20261121);
  int cases = 0, accepted = 0, errors = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    const bool legacy = rng() % 4 == 0;
    std::string text = mutate(legacy ? kLegacy : kSeed, rng);
    ++cases;
    try {
      Config root = cs::parse_config(text);
      if (legacy) {
        root = modelzoo::convert_legacy_params(root, "");
      }
      ConfigView r(root, "");
      ConfigView init = r.at("trainer").at("init");
      modelzoo::Trainer t(init);
      ++accepted;
    } catch (const cs::Error& e) {
      ++errors;
      ASSERT_GT(std::string(e.what()).size(), 5u) << text;
    } catch (const std::exception& e) {
      FAIL() << "not a cstorch::Error: " << e.what() << "\nconfig:\n" << text;
    }
  }
  std::filesystem::current_path(std::filesystem::temp_directory_path());
  std::filesystem::remove_all(dir);
  EXPECT_GT(cases, 50);
  EXPECT_GT(accepted, 0);  // the mutations are not all fatal: the loader gets exercised deeply
  EXPECT_GT(errors, 0);
  std::printf("%d configs: %d accepted, %d clear errors\n", cases, accepted, errors);
}
