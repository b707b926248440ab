// Transformer (AIAYN) and T5 against plain-PyTorch implementations written in
// seq2seq_reference.py (torch.nn only): the same weights travel through a .pt file; the loss
// of one padded batch must agree within 1e-4 relative, every parameter gradient within 1e-4
// (max |g - g_torch| / max |g_torch| per parameter), and a 20-step AdamW run (traced, as the
// Trainer runs it) within 1e-3 relative at every step. Dropout is 0 and the models are in
// training mode (the dropout-off training path); every batch has right padding on both sides.
#include <gtest/gtest.h>

#include <cstdio>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "modelzoo/models/t5/t5.h"
#include "modelzoo/models/transformer/transformer.h"
#include "ref_util.h"

namespace cstorch::reftest {
namespace {

constexpr int kSteps = 20;
constexpr double kLossTol = 1e-4, kGradTol = 1e-4, kCurveTol = 1e-3;
constexpr double kLr = 2e-3, kWeightDecay = 0.01;

struct Variant {
  std::string name, model;
  int64_t src_vocab, tgt_vocab;
  State config;  // the model's YAML arguments (and what the Python side reads)
};
// gtest names a failing parameter by this (instead of its bytes).
void PrintTo(const Variant& v, std::ostream* os) {
  *os << v.name;
}

State transformer_config(bool shared, int64_t sv, int64_t tv, double ls) {
  auto c = modelzoo::transformer::TransformerConfig::tiny();
  return State::map({{"src_vocab_size", sv},
                     {"tgt_vocab_size", tv},
                     {"d_model", c.d_model},
                     {"num_heads", c.num_heads},
                     {"encoder_num_hidden_layers", c.encoder_num_hidden_layers},
                     {"decoder_num_hidden_layers", c.decoder_num_hidden_layers},
                     {"d_ff", c.d_ff},
                     {"src_max_position_embeddings", c.src_max_position_embeddings},
                     {"tgt_max_position_embeddings", c.tgt_max_position_embeddings},
                     {"dropout_rate", 0.0},
                     {"attention_dropout_rate", 0.0},
                     {"layer_norm_epsilon", c.layer_norm_epsilon},
                     {"label_smoothing", ls},
                     {"share_encoder_decoder_embedding", shared},
                     {"share_embedding_weights", shared}});
}

State t5_config(bool shared, int64_t sv, int64_t tv, double ls) {
  auto c = modelzoo::t5::T5Config::tiny();
  return State::map({{"src_vocab_size", sv},
                     {"tgt_vocab_size", tv},
                     {"d_model", c.d_model},
                     {"d_kv", c.d_kv},
                     {"d_ff", c.d_ff},
                     {"num_heads", c.num_heads},
                     {"encoder_num_hidden_layers", c.encoder_num_hidden_layers},
                     {"decoder_num_hidden_layers", c.decoder_num_hidden_layers},
                     {"relative_attention_num_buckets", c.relative_attention_num_buckets},
                     {"relative_attention_max_distance", c.relative_attention_max_distance},
                     {"src_max_position_embeddings", c.src_max_position_embeddings},
                     {"tgt_max_position_embeddings", c.tgt_max_position_embeddings},
                     {"dropout_rate", 0.0},
                     {"layer_norm_epsilon", c.layer_norm_epsilon},
                     {"label_smoothing", ls},
                     {"share_encoder_decoder_embedding", shared},
                     {"share_embedding_weights", shared}});
}

// The tiny configurations as shipped (shared, tied, no smoothing) and an untied variant with
// separate vocabularies and label smoothing 0.1.
std::vector<Variant> variants() {
  return {{"transformer_tiny", "transformer", 128, 128, transformer_config(true, 128, 128, 0.0)},
          {"transformer_untied_smoothed", "transformer", 96, 80,
           transformer_config(false, 96, 80, 0.1)},
          {"t5_tiny", "t5", 128, 128, t5_config(true, 128, 128, 0.0)},
          {"t5_untied_smoothed", "t5", 96, 80, t5_config(false, 96, 80, 0.1)}};
}

Config to_config(const State& s) {
  Config c = Config::object();
  for (const auto& k : s.keys()) {
    const State& v = s.at(k);
    if (v.is_bool())
      c[k] = v.as_bool();
    else if (v.is_int())
      c[k] = v.as_int();
    else
      c[k] = v.as_double();
  }
  return c;
}

modelzoo::ModelPtr build(const Variant& v) {
  Config c = to_config(v.config);
  return modelzoo::models().create(v.model, modelzoo::ConfigView(c, "model"), "model.name");
}

// kSteps batches of 4: source length 24 (past T5's 16 exact encoder buckets, so the
// logarithmic buckets are used), target 20; row r is padded by 3r (source) and 2r (target).
std::vector<Batch> make_batches(const Variant& v) {
  Rng rng(hash_name(v.name));
  const int64_t B = 4, S = 24, T = 20;
  std::vector<Batch> out;
  for (int s = 0; s < kSteps; ++s) {
    std::vector<int32_t> ids(B * S), am(B * S), dids(B * T), dam(B * T), labels(B * T);
    for (int64_t r = 0; r < B; ++r) {
      for (int64_t i = 0; i < S; ++i) {
        const bool real = i < S - 3 * r;
        ids[r * S + i] = real ? static_cast<int32_t>(rng.integer(1, v.src_vocab)) : 0;
        am[r * S + i] = real;
      }
      // A learnable target: labels are the next decoder input; both follow the source ids.
      for (int64_t i = 0; i < T; ++i) {
        const bool real = i < T - 2 * r;
        const int32_t t = static_cast<int32_t>((ids[r * S + i] * 7 + 3) % v.tgt_vocab);
        labels[r * T + i] = real ? t : -100;
        dids[r * T + i] = i == 0 ? 0 : real ? labels[r * T + i - 1] : 0;
        dam[r * T + i] = real;
      }
    }
    out.push_back({{"input_ids", from_vector(ids, {B, S})},
                   {"attention_mask", from_vector(am, {B, S})},
                   {"decoder_input_ids", from_vector(dids, {B, T})},
                   {"decoder_attention_mask", from_vector(dam, {B, T})},
                   {"labels", from_vector(labels, {B, T})}});
  }
  return out;
}

struct Reference {
  double loss = 0;
  std::map<std::string, Tensor> grads;
  std::vector<double> losses;
  std::string error;
};

Reference run_torch(const Variant& v, const nn::StateDict& weights,
                    const std::vector<Batch>& batches) {
  Reference r;
  auto dir = make_temp_dir("ref_seq2seq_" + v.name);
  auto in = (dir / "in.pt").string(), out = (dir / "out.pt").string();
  State bl = State::list();
  for (const auto& b : batches) {
    State m = State::map();
    for (const auto& [k, t] : b) m.set(k, t);
    bl.push_back(m);
  }
  save(State::map({{"model", v.model},
                   {"config", v.config},
                   {"weights", weights.to_state()},
                   {"batches", bl},
                   {"lr", kLr},
                   {"weight_decay", kWeightDecay}}),
       in);
  std::string log;
  int rc = run_reference_script("seq2seq_reference.py", {in, out}, &log);
  if (rc != 0) {
    r.error = torch_unavailable_reason();
    if (r.error.empty())
      r.error = "seq2seq_reference.py failed (exit " + std::to_string(rc) + "):\n" + log;
    return r;
  }
  State o = load(out);
  r.loss = o.at("loss").as_double();
  for (const auto& k : o.at("grads").keys()) r.grads[k] = o.at("grads").at(k).as_tensor();
  for (const auto& x : o.at("losses").items()) r.losses.push_back(x.as_double());
  if (!std::getenv("CSTORCH_REF_KEEP")) std::filesystem::remove_all(dir);
  return r;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

class Seq2SeqReference : public ::testing::TestWithParam<Variant> {};

TEST_P(Seq2SeqReference, LossGradientsAndAdamWCurve) {
  const Variant& v = GetParam();
  manual_seed(hash_name(v.name) & 0xffff);
  auto model = build(v);
  const nn::StateDict initial = [&] {
    // A deep copy: the training run below updates the parameters in place.
    nn::StateDict sd;
    for (const auto& [k, t] : model->state_dict())
      sd.insert(k, from_vector(t.to_vector<float>(), t.shape()));
    return sd;
  }();
  const auto batches = make_batches(v);
  const Reference ref = run_torch(v, initial, batches);
  ASSERT_TRUE(ref.error.empty()) << ref.error;

  // Forward loss and every gradient (eager).
  Tensor loss = model->loss(batches[0]);
  loss.backward();
  const double l = loss.item<double>();
  EXPECT_NEAR(l, ref.loss, kLossTol * std::abs(ref.loss)) << v.name << ": loss";
  size_t checked = 0;
  double worst = 0;
  for (const auto& [name, p] : model->named_parameters()) {
    auto it = ref.grads.find(name);
    ASSERT_NE(it, ref.grads.end()) << v.name << ": torch has no gradient for " << name;
    ASSERT_TRUE(p.grad().defined()) << v.name << ": no gradient for " << name;
    ASSERT_EQ(p.grad().shape(), it->second.shape()) << name;
    const auto got = p.grad().to_vector<double>(), want = it->second.to_vector<double>();
    double diff = 0;
    for (size_t i = 0; i < got.size(); ++i) diff = std::max(diff, std::abs(got[i] - want[i]));
    const double scale = max_abs(want);
    ASSERT_GT(scale, 0) << v.name << ": torch's gradient of " << name << " is zero";
    const double rel = diff / scale;
    worst = std::max(worst, rel);
    EXPECT_LE(rel, kGradTol) << v.name << ": gradient of " << name << " (max |diff| " << diff
                             << ", max |torch| " << scale << ")";
    ++checked;
  }
  EXPECT_EQ(checked, ref.grads.size()) << v.name << ": parameter sets differ";

  // 20 AdamW steps in a traced step, from the same initial weights.
  model->load_state_dict(initial);
  optim::AdamW opt(model->parameters(), kLr, 0.9, 0.999, 1e-8, kWeightDecay);
  opt.zero_grad();
  auto step = trace(
      [&](const Batch& b) {
        Tensor x = model->loss(b);
        x.backward();
        opt.step();
        opt.zero_grad();
        return x;
      },
      "train_" + v.name);
  std::vector<Tensor> pending;
  for (const auto& b : batches) pending.push_back(step(b));
  ASSERT_EQ(ref.losses.size(), pending.size());
  double worst_curve = 0;
  for (size_t s = 0; s < pending.size(); ++s) {
    const double got = pending[s].item<double>(), want = ref.losses[s];
    const double rel = std::abs(got - want) / std::abs(want);
    worst_curve = std::max(worst_curve, rel);
    EXPECT_LE(rel, kCurveTol) << v.name << ": step " << s << " loss " << got << ", torch " << want;
  }
  std::printf(
      "[seq2seq] %s: loss %.6f (torch %.6f); %zu gradients, worst relative %.3g; AdamW %.4f -> "
      "%.4f (torch %.4f -> %.4f), worst step relative %.3g\n",
      v.name.c_str(), l, ref.loss, checked, worst, pending.front().item<double>(),
      pending.back().item<double>(), ref.losses.front(), ref.losses.back(), worst_curve);
}

INSTANTIATE_TEST_SUITE_P(Models, Seq2SeqReference, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cstorch::reftest
