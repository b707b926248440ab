// Training gives the same bits on any number of threads: work may be split across the pool,
// but no sum's order may follow the thread count. Sizes are large enough for the products,
// reductions and attention to split across threads (a product of 2^20 multiply-adds or more
// runs on the whole team).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include <cstorch/cstorch.h>

#include "support/fc_steps.h"
#include "support/lm_steps.h"

namespace cs = cstorch;

namespace {

// The pool's thread count for one scope.
struct Threads {
  explicit Threads(int n) : saved(cs::get_num_threads()) { cs::set_num_threads(n); }
  ~Threads() { cs::set_num_threads(saved); }
  int saved;
};

bool same_bits(const std::vector<cs::Tensor>& a, const std::vector<cs::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto x = a[i].to_vector<float>(), y = b[i].to_vector<float>();
    if (x.size() != y.size() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// A GPT-2 of width 128 (2 layers, 4 heads, MLP 512, vocabulary 512) on B = 8 sequences of
// T = 64 tokens: its products have 512 rows.
cs::Batch gpt2_batch(int shift) {
  const int64_t B = 8, T = 64;
  std::vector<int32_t> ids(B * T), mask(B * T, 1), labels(B * T);
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<int32_t>((i * 37 + 11 + shift) % 512);
    labels[i] = static_cast<int32_t>((i * 53 + 5 + shift) % 512);
  }
  return {{"input_ids", cs::from_vector(ids, {B, T})},
          {"attention_mask", cs::from_vector(mask, {B, T})},
          {"labels", cs::from_vector(labels, {B, T})}};
}

cs::testing::LmRun gpt2_run(int threads) {
  Threads scope(threads);
  const std::string yaml =
      "vocab_size: 512\nhidden_size: 128\nnum_hidden_layers: 2\nnum_heads: 4\n"
      "max_position_embeddings: 64\nfilter_size: 512\ndropout_rate: 0.0\n";
  return cs::testing::lm_run(
      cs::Device{}, "gpt2", yaml,
      [](cs::nn::Module& m) {
        return std::make_unique<cs::optim::AdamW>(m.parameters(), 1e-3, 0.9, 0.999, 1e-8, 0.01);
      },
      {gpt2_batch(0), gpt2_batch(1), gpt2_batch(2)}, 3);
}

}  // namespace

TEST(ThreadCount, Gpt2TrainingIsBitwiseTheSameOnOneTwoAndThreeThreads) {
  const auto one = gpt2_run(1);
  for (int t : {2, 3}) {
    const auto got = gpt2_run(t);
    EXPECT_EQ(got.losses, one.losses) << t << " threads";
    EXPECT_TRUE(same_bits(got.params, one.params)) << t << " threads";
  }
}

TEST(ThreadCount, FcMnistTrainingIsBitwiseTheSameOnOneTwoAndThreeThreads) {
  auto run = [](int threads) {
    Threads scope(threads);
    return cs::testing::fc_mnist_run(cs::Device{}, "adamw", 3, 256, "[512, 256]");
  };
  const auto one = run(1);
  for (int t : {2, 3}) {
    const auto got = run(t);
    EXPECT_EQ(got.train_losses, one.train_losses) << t << " threads";
    EXPECT_EQ(got.eval_losses, one.eval_losses) << t << " threads";
    EXPECT_TRUE(same_bits(got.params, one.params)) << t << " threads";
  }
}
