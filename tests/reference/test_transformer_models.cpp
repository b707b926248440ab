// GPT-2 and BERT (tiny) against plain-torch.nn implementations (transformer_models.py) with the
// same weights, moved through a .pt file written by cstorch: the first batch's loss and every
// parameter gradient agree within 1e-4 relative (per element, |d| <= 1e-4 * max|ref| of that
// gradient plus 1e-4 * |ref|), and a 20-step AdamW run (traced steps) within 1e-3 relative at
// every step. Batches have padding (GPT-2: loss mask zeros; BERT: padded keys, -100 labels);
// dropout is off in both.
#include <gtest/gtest.h>

#include <map>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "modelzoo/models/bert/bert.h"
#include "modelzoo/models/gpt2/gpt2.h"
#include "ref_util.h"

namespace cstorch::reftest {
namespace {

constexpr int kSteps = 20, kBatches = 4, kB = 3, kT = 12;
constexpr double kLr = 1e-3, kWd = 0.01;

struct Result {
  double loss0 = 0;
  std::map<std::string, std::vector<double>> grads;
  std::vector<double> losses;
  std::string error;
};

// Token batches: ids in [0, vocab), the last `pad` positions of row r padded (r = 0 none).
std::vector<Batch> make_batches(bool bert, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<Batch> out;
  for (int s = 0; s < kBatches; ++s) {
    std::vector<int64_t> ids(kB * kT), mask(kB * kT), labels(kB * kT), types(kB * kT), nsl(kB);
    for (int b = 0; b < kB; ++b) {
      const int len = kT - 3 * b;  // rows of 12, 9, 6 real tokens
      for (int t = 0; t < kT; ++t) {
        const int i = b * kT + t;
        const bool real = t < len;
        ids[i] = real ? rng.integer(1, vocab) : 0;
        mask[i] = real;
        types[i] = real && t >= len / 2;
        if (bert)
          labels[i] = real && rng.uniform() < 0.3 ? rng.integer(0, vocab) : -100;
        else
          labels[i] = rng.integer(0, vocab);
      }
      if (bert) labels[b * kT + 1] = rng.integer(0, vocab);  // at least one per row
      nsl[b] = rng.integer(0, 2);
    }
    Batch batch{{"input_ids", from_vector(ids, {kB, kT}).to(DType::i32)},
                {"attention_mask", from_vector(mask, {kB, kT}).to(DType::i32)},
                {"labels", from_vector(labels, {kB, kT}).to(DType::i32)}};
    if (bert) {
      batch.erase("labels");
      batch["mlm_labels"] = from_vector(labels, {kB, kT}).to(DType::i32);
      batch["token_type_ids"] = from_vector(types, {kB, kT}).to(DType::i32);
      batch["next_sentence_label"] = from_vector(nsl, {kB}).to(DType::i32);
    }
    out.push_back(batch);
  }
  return out;
}

Result run_torch(const std::string& name, const json& config, modelzoo::Model& model,
                 const std::vector<Batch>& batches) {
  Result r;
  auto dir = make_temp_dir("ref_" + name);
  auto weights = dir / "weights.pt";
  save(State::map({{"model", model.state_dict().to_state()}}), weights.string());
  json bj = json::array();
  for (const auto& b : batches) {
    json e = json::object();
    for (const auto& [k, t] : b) e[k] = json{{"shape", t.shape()}, {"data", host_values(t)}};
    bj.push_back(e);
  }
  json j{{"model", name},  {"config", config}, {"weights", weights.string()},
         {"batches", bj},  {"lr", kLr},        {"weight_decay", kWd},
         {"steps", kSteps}};
  auto in = dir / "in.json", out = dir / "out.json";
  write_json(in, j);
  std::string log;
  int rc = run_reference_script("transformer_models.py", {in.string(), out.string()}, &log);
  if (rc != 0) {
    r.error = torch_unavailable_reason();
    if (r.error.empty())
      r.error = "transformer_models.py failed (exit " + std::to_string(rc) + ") on " + in.string() +
                ":\n" + log;
    return r;
  }
  json o = read_json(out);
  r.loss0 = o["loss0"].get<double>();
  for (auto& [k, v] : o["grads"].items()) r.grads[k] = v.get<std::vector<double>>();
  r.losses = o["losses"].get<std::vector<double>>();
  if (!std::getenv("CSTORCH_REF_KEEP")) std::filesystem::remove_all(dir);
  return r;
}

void compare(const std::string& name, const json& config, modelzoo::Model& model,
             const std::vector<Batch>& batches) {
  // torch first: it reads the initial weights.
  Result ref = run_torch(name, config, model, batches);
  // No torch, or a script that failed: the comparison cannot be made, which is a failure.
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  Tensor loss0 = model.loss(batches[0]);
  loss0.backward();
  EXPECT_NEAR(loss0.item<double>(), ref.loss0, 1e-4 * std::fabs(ref.loss0)) << "loss";
  size_t checked = 0;
  for (auto& [k, p] : model.named_parameters()) {
    SCOPED_TRACE(k);
    ASSERT_TRUE(ref.grads.count(k)) << "torch has no parameter " << k;
    ASSERT_TRUE(p.grad().defined()) << "no gradient";
    auto g = p.grad().to_vector<double>();
    const auto& want = ref.grads.at(k);
    ASSERT_EQ(g.size(), want.size());
    double scale = 0;
    for (double w : want) scale = std::max(scale, std::fabs(w));
    size_t bad = 0;
    for (size_t i = 0; i < g.size(); ++i)
      if (std::fabs(g[i] - want[i]) > 1e-4 * scale + 1e-4 * std::fabs(want[i]) + 1e-12) {
        if (bad++ < 3) ADD_FAILURE() << "element " << i << ": " << g[i] << " vs " << want[i];
      }
    EXPECT_EQ(bad, 0u) << "of " << g.size();
    ++checked;
  }
  EXPECT_EQ(checked, ref.grads.size());
  for (auto& p : model.parameters()) p.set_grad(Tensor());
  optim::AdamW opt(model.parameters(), kLr, 0.9, 0.999, 1e-8, kWd);
  auto step = trace([&](const Batch& b) {
    Tensor l = model.loss(b);
    l.backward();
    opt.step();
    opt.zero_grad();
    return l;
  });
  std::vector<Tensor> losses;
  for (int s = 0; s < kSteps; ++s) losses.push_back(step(batches[s % kBatches]));
  for (int s = 0; s < kSteps; ++s) {
    const double got = losses[s].item<double>(), want = ref.losses[s];
    EXPECT_NEAR(got, want, 1e-3 * std::fabs(want)) << "step " << s;
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front());  // the run actually trains
}

}  // namespace

TEST(TransformerModels, Gpt2TinyMatchesTorch) {
  manual_seed(11);
  modelzoo::gpt2::GPT2Config c = modelzoo::gpt2::GPT2Config::tiny();
  c.vocab_size = 97;
  c.num_hidden_layers = 2;
  c.max_position_embeddings = 16;
  c.dropout_rate = c.attention_dropout_rate = c.embedding_dropout_rate = 0;
  modelzoo::gpt2::GPT2Model model(c);
  json cj{{"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_heads", c.num_heads},
          {"max_position_embeddings", c.max_position_embeddings},
          {"filter_size", c.filter_size},
          {"layer_norm_epsilon", c.layer_norm_epsilon}};
  compare("gpt2", cj, model, make_batches(false, c.vocab_size, 5));
}

TEST(TransformerModels, BertTinyMatchesTorch) {
  manual_seed(12);
  modelzoo::bert::BertConfig c = modelzoo::bert::BertConfig::tiny();
  c.vocab_size = 101;
  c.max_position_embeddings = 16;
  c.dropout_rate = c.attention_dropout_rate = 0;
  modelzoo::bert::BertModel model(c);
  json cj{{"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_heads", c.num_heads},
          {"max_position_embeddings", c.max_position_embeddings},
          {"filter_size", c.filter_size},
          {"num_segments", c.num_segments},
          {"layer_norm_epsilon", c.layer_norm_epsilon}};
  compare("bert", cj, model, make_batches(true, c.vocab_size, 6));
}

}  // namespace cstorch::reftest
