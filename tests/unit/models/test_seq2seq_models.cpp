// Transformer (AIAYN) and T5: parameter counts against the published figures, configuration
// and batch errors, masks, dropout on/off, and a traced training run.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "cstorch/cstorch.h"
#include "modelzoo/models/t5/t5.h"
#include "modelzoo/models/transformer/transformer.h"
#include "unit/test_util.h"

namespace cstorch::testing {
namespace {

using modelzoo::t5::T5Config;
using modelzoo::t5::T5Model;
using modelzoo::transformer::TransformerConfig;
using modelzoo::transformer::TransformerModel;

int64_t count_params(const nn::Module& m) {
  int64_t n = 0;
  for (auto& p : m.parameters()) n += p.numel();
  return n;
}

// A seq2seq batch: B rows, source length S, target length T; row r has S - r real source and
// T - r real target tokens (right padding), ids below `vocab`.
Batch make_batch(int64_t B, int64_t S, int64_t T, int64_t vocab, uint32_t seed = 1) {
  std::vector<int32_t> ids(B * S), am(B * S), dids(B * T), dam(B * T), labels(B * T);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  auto next = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(vocab));
  };
  for (int64_t r = 0; r < B; ++r) {
    for (int64_t i = 0; i < S; ++i) {
      const bool real = i < S - r;
      ids[r * S + i] = real ? next() : 0;
      am[r * S + i] = real;
    }
    for (int64_t i = 0; i < T; ++i) {
      const bool real = i < T - r;
      dids[r * T + i] = real ? next() : 0;
      dam[r * T + i] = real;
      labels[r * T + i] = real ? next() : -100;
    }
  }
  return {{"input_ids", from_vector(ids, {B, S})},
          {"attention_mask", from_vector(am, {B, S})},
          {"decoder_input_ids", from_vector(dids, {B, T})},
          {"decoder_attention_mask", from_vector(dam, {B, T})},
          {"labels", from_vector(labels, {B, T})}};
}

// ---------------------------------------------------------------------------------------------
TEST(TransformerModel, BaseParameterCount) {
  // Transformer base (Table 3 of the paper: "65M"): d_model 512, 8 heads, d_ff 2048, 6 + 6
  // post-norm layers, a shared 37000-token BPE vocabulary with source embedding, target
  // embedding and pre-softmax projection all one matrix. Derivation:
  //   embedding          37000 * 512                                  = 18,944,000
  //   encoder layer      attention 4*512*512 + 4*512 = 1,050,624; FFN 512*2048 + 2048 +
  //                      2048*512 + 512 = 2,099,712; 2 LayerNorms 2048  -> 3,152,384 (x6)
  //   decoder layer      2 attentions 2,101,248 + FFN 2,099,712 + 3 LayerNorms 3072
  //                                                                   -> 4,204,032 (x6)
  //   total 18,944,000 + 18,914,304 + 25,224,192 = 63,082,496, the paper's 65M to its two
  //   significant figures (the paper's count is rounded; vocabulary details differ).
  const auto base = TransformerConfig::base();
  EXPECT_EQ(base.num_parameters(), 63082496);
  EXPECT_NEAR(static_cast<double>(base.num_parameters()), 65e6, 0.05 * 65e6);
  // The formula against built models, shared and not.
  auto c = TransformerConfig::tiny();
  c.encoder_num_hidden_layers = 3;
  TransformerModel m(c);
  EXPECT_EQ(count_params(m), c.num_parameters());
  c.share_encoder_decoder_embedding = false;
  c.share_embedding_weights = false;
  c.src_vocab_size = 100;
  TransformerModel m2(c);
  EXPECT_EQ(count_params(m2), c.num_parameters());
  EXPECT_EQ(count_params(m2) - count_params(m), (100 + 128) * 32);
}

TEST(TransformerModel, ParameterNames) {
  TransformerModel m(TransformerConfig::tiny());
  auto keys = m.state_dict().keys();
  std::set<std::string> k(keys.begin(), keys.end());
  for (const char* want :
       {"embedding.weight", "encoder.layers.0.self_attn.in_proj_weight",
        "encoder.layers.1.linear2.bias", "decoder.layers.1.multihead_attn.in_proj_bias",
        "decoder.layers.0.norm3.weight"})
    EXPECT_TRUE(k.count(want)) << want;
  EXPECT_FALSE(k.count("lm_head.weight"));
}

TEST(TransformerModel, ConfigErrors) {
  auto make = [](const std::string& yaml) {
    auto cfg = parse_config(yaml);
    return modelzoo::models().create("transformer", modelzoo::ConfigView(cfg, "model"),
                                     "model.name");
  };
  EXPECT_ERROR(make("d_model: 30\nnum_heads: 4\n"), "model.num_heads", "do not divide d_model 30");
  EXPECT_ERROR(make("src_vocab_size: 10\ntgt_vocab_size: 12\n"),
               "model.share_encoder_decoder_embedding", "10 and 12");
  EXPECT_ERROR(make("d_model: 32\nhidden_size: 32\n"), "hidden_size", "not both");
  EXPECT_ERROR(make("label_smoothing: 1.5\n"), "model.label_smoothing", "[0, 1]");
  EXPECT_ERROR(make("dropout_rate: 1.0\n"), "model.dropout_rate");
  EXPECT_ERROR(make("encoder_num_hidden_layers: 0\n"), "model.encoder_num_hidden_layers",
               "positive");
  EXPECT_ERROR(make("num_layers: 2\n"), "num_layers");
  // The Model Zoo spellings are accepted.
  auto m = make(
      "vocab_size: 64\nhidden_size: 16\nfilter_size: 32\nnum_heads: 2\n"
      "encoder_num_hidden_layers: 1\ndecoder_num_hidden_layers: 1\nmax_position_embeddings: 8\n");
  auto& t = dynamic_cast<TransformerModel&>(*m);
  EXPECT_EQ(t.config().d_model, 16);
  EXPECT_EQ(t.config().d_ff, 32);
  EXPECT_EQ(t.config().tgt_max_position_embeddings, 8);
}

// ---------------------------------------------------------------------------------------------
TEST(T5Model, SmallParameterCount) {
  // t5-small (T5 v1.0) with its tied 32128-token vocabulary: 60,506,624, as
  // T5ForConditionalGeneration.from_pretrained("t5-small").num_parameters() reports.
  // Derivation (d_model 512, 8 heads x d_kv 64, d_ff 2048, 6 + 6 blocks, 32 buckets):
  //   shared embedding   32128 * 512                                   = 16,449,536
  //   encoder block      attention 4*512*512 = 1,048,576 + FFN 2*512*2048 = 2,097,152 + 2 RMS
  //                      norms 1024 -> 3,146,752 (x6 = 18,880,512) + bias table 32*8 = 256 +
  //                      final norm 512                                 = 18,881,280
  //   decoder block      2 attentions 2,097,152 + FFN 2,097,152 + 3 norms 1536 -> 4,195,840
  //                      (x6 = 25,175,040) + 256 + 512                  = 25,175,808
  //   total                                                            = 60,506,624
  EXPECT_EQ(T5Config::small().num_parameters(), 60506624);
  auto c = T5Config::tiny();
  T5Model m(c);
  EXPECT_EQ(count_params(m), c.num_parameters());
  c.share_encoder_decoder_embedding = false;
  c.share_embedding_weights = false;
  c.tgt_vocab_size = 96;
  T5Model m2(c);
  EXPECT_EQ(count_params(m2), c.num_parameters());
}

TEST(T5Model, ParameterNamesFollowHuggingFace) {
  T5Model m(T5Config::tiny());
  auto keys = m.state_dict().keys();
  std::set<std::string> k(keys.begin(), keys.end());
  for (const char* want :
       {"shared.weight", "encoder.block.0.layer.0.SelfAttention.q.weight",
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "encoder.block.1.layer.1.DenseReluDense.wi.weight", "encoder.final_layer_norm.weight",
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "decoder.block.1.layer.1.EncDecAttention.o.weight",
        "decoder.block.1.layer.2.DenseReluDense.wo.weight",
        "decoder.block.1.layer.2.layer_norm.weight", "decoder.final_layer_norm.weight"})
    EXPECT_TRUE(k.count(want)) << want;
  // Only the first block of each stack owns a bias table; nothing has a bias vector.
  EXPECT_FALSE(k.count("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"));
  for (auto& key : keys) EXPECT_EQ(key.find(".bias"), std::string::npos) << key;
  EXPECT_EQ(m.state_dict().at("encoder.block.0.layer.0.SelfAttention.q.weight").shape(),
            (Shape{64, 32}));
}

TEST(T5Model, ConfigErrors) {
  auto make = [](const std::string& yaml) {
    auto cfg = parse_config(yaml);
    return modelzoo::models().create("t5", modelzoo::ConfigView(cfg, "model"), "model.name");
  };
  EXPECT_ERROR(make("encoder_nonlinearity: gelu\n"), "model.encoder_nonlinearity", "relu");
  EXPECT_ERROR(make("position_embedding_type: learned\n"), "model.position_embedding_type");
  EXPECT_ERROR(make("relative_attention_num_buckets: 2\n"), "relative_attention_num_buckets");
  EXPECT_ERROR(make("src_vocab_size: 10\n"), "share_encoder_decoder_embedding");
  EXPECT_ERROR(make("d_kv: 0\n"), "model.d_kv", "positive");
  EXPECT_ERROR(make("hidden_size: 32\n"), "hidden_size");
}

// ---------------------------------------------------------------------------------------------
// Batch errors, the same for both models.
class Seq2SeqErrors : public ::testing::TestWithParam<std::string> {};

TEST_P(Seq2SeqErrors, BadBatches) {
  const std::string name = GetParam();
  auto cfg = parse_config(
      "vocab_size: 50\nd_model: 16\nnum_heads: 2\nd_ff: 32\nencoder_num_hidden_layers: 1\n"
      "decoder_num_hidden_layers: 1\nmax_position_embeddings: 12\ndropout_rate: 0.0\n");
  auto m = modelzoo::models().create(name, modelzoo::ConfigView(cfg, "model"), "model.name");
  Batch ok = make_batch(2, 6, 5, 50);
  EXPECT_NO_THROW(m->loss(ok));
  auto with = [&](const std::string& key, Tensor t) {
    Batch b = ok;
    b[key] = std::move(t);
    return b;
  };
  // Longer than the positions.
  EXPECT_ERROR(m->loss(make_batch(2, 13, 5, 50)), name, "input_ids has sequence length 13",
               "src_max_position_embeddings is 12");
  EXPECT_ERROR(m->loss(make_batch(2, 6, 14, 50)), name, "decoder_input_ids has sequence length 14",
               "tgt_max_position_embeddings is 12");
  // Out of the vocabulary.
  std::vector<int32_t> ids(12, 3);
  ids[7] = 50;
  EXPECT_ERROR(m->loss(with("input_ids", from_vector(ids, {2, 6}))), "input_ids[1, 1] = 50",
               "vocabulary [0, 50)");
  std::vector<int32_t> dids(10, 3);
  dids[4] = -1;
  EXPECT_ERROR(m->loss(with("decoder_input_ids", from_vector(dids, {2, 5}))),
               "decoder_input_ids[0, 4] = -1");
  std::vector<int32_t> labels(10, -100);
  labels[9] = 77;
  EXPECT_ERROR(m->loss(with("labels", from_vector(labels, {2, 5}))), "labels[1, 4] = 77",
               "not the ignore index");
  // Mismatched batch sizes and lengths.
  EXPECT_ERROR(m->loss(with("decoder_input_ids", from_vector(std::vector<int32_t>(15, 1), {3, 5}))),
               "encoder batch size 2", "decoder batch size 3");
  EXPECT_ERROR(m->loss(with("labels", from_vector(std::vector<int32_t>(8, 1), {2, 4}))),
               "labels [2, 4]", "decoder_input_ids [2, 5]");
  EXPECT_ERROR(
      m->loss(with("decoder_attention_mask", from_vector(std::vector<int32_t>(12, 1), {2, 6}))),
      "decoder_attention_mask [2, 6]");
  EXPECT_ERROR(m->loss(with("attention_mask", from_vector(std::vector<int32_t>(10, 1), {2, 5}))),
               "attention_mask [2, 5]", "input_ids [2, 6]");
  EXPECT_ERROR(m->loss(with("input_ids", from_vector(std::vector<float>(12, 1), {2, 6}))),
               "input_ids must be an integer tensor", "f32");
  Batch missing = ok;
  missing.erase("decoder_attention_mask");
  EXPECT_ERROR(m->loss(missing), "no \"decoder_attention_mask\"");
}

// Inside a traced step only sizes are checked on the host; a bad id is still an error, from the
// embedding's index check or cross_entropy's target check.
TEST_P(Seq2SeqErrors, BadIdsInsideATrace) {
  const std::string name = GetParam();
  auto cfg = parse_config(
      "vocab_size: 50\nd_model: 16\nnum_heads: 2\nd_ff: 32\nencoder_num_hidden_layers: 1\n"
      "decoder_num_hidden_layers: 1\nmax_position_embeddings: 12\ndropout_rate: 0.0\n");
  auto m = modelzoo::models().create(name, modelzoo::ConfigView(cfg, "model"), "model.name");
  auto step = trace([&](const Batch& b) { return m->loss(b); });
  Batch ok = make_batch(2, 6, 5, 50);
  EXPECT_NO_THROW(step(ok).item<float>());
  Batch bad = ok;
  std::vector<int32_t> ids(12, 3);
  ids[7] = 60;
  bad["input_ids"] = from_vector(ids, {2, 6});
  EXPECT_ERROR(step(bad).item<float>(), "index 60");
  bad = ok;
  std::vector<int32_t> labels(10, 1);
  labels[3] = 55;
  bad["labels"] = from_vector(labels, {2, 5});
  EXPECT_ERROR(step(bad).item<float>(), "55");
}

// The loss is the mean over the counted target tokens: padded target positions (and what the
// padded ids are) do not matter, nor do padded source tokens.
TEST_P(Seq2SeqErrors, PaddingIsMasked) {
  const std::string name = GetParam();
  manual_seed(5);
  auto cfg = parse_config(
      "vocab_size: 50\nd_model: 16\nnum_heads: 2\nd_ff: 32\nencoder_num_hidden_layers: 1\n"
      "decoder_num_hidden_layers: 1\nmax_position_embeddings: 12\ndropout_rate: 0.0\n");
  auto m = modelzoo::models().create(name, modelzoo::ConfigView(cfg, "model"), "model.name");
  Batch b = make_batch(2, 6, 5, 50);
  const double l0 = m->loss(b).item<double>();
  // Change the padded ids of row 1 (source position 5, target position 4) and its label.
  auto v = b.at("input_ids").to_vector<int32_t>();
  v[11] = 41;
  b["input_ids"] = from_vector(v, {2, 6});
  auto d = b.at("decoder_input_ids").to_vector<int32_t>();
  d[9] = 17;
  b["decoder_input_ids"] = from_vector(d, {2, 5});
  auto l = b.at("labels").to_vector<int32_t>();
  l[9] = 3;
  b["labels"] = from_vector(l, {2, 5});
  EXPECT_NEAR(m->loss(b).item<double>(), l0, 1e-6 * std::abs(l0));
  // A real token does matter.
  v[10] = (v[10] + 1) % 50;
  b["input_ids"] = from_vector(v, {2, 6});
  EXPECT_GT(std::abs(m->loss(b).item<double>() - l0), 1e-6);
}

// Dropout acts only in training mode: eval with dropout 0.3 equals a dropout-free copy.
TEST_P(Seq2SeqErrors, DropoutOnlyInTraining) {
  const std::string name = GetParam();
  const std::string base =
      "vocab_size: 50\nd_model: 16\nnum_heads: 2\nd_ff: 32\nencoder_num_hidden_layers: 1\n"
      "decoder_num_hidden_layers: 1\nmax_position_embeddings: 12\n";
  auto cfg0 = parse_config(base + "dropout_rate: 0.0\n");
  auto cfg1 = parse_config(base + "dropout_rate: 0.3\n" +
                           (name == "transformer" ? "attention_dropout_rate: 0.3\n" : ""));
  auto m0 = modelzoo::models().create(name, modelzoo::ConfigView(cfg0, "model"), "model.name");
  auto m1 = modelzoo::models().create(name, modelzoo::ConfigView(cfg1, "model"), "model.name");
  m1->load_state_dict(m0->state_dict());
  Batch b = make_batch(2, 6, 5, 50);
  const double l0 = m0->loss(b).item<double>();
  m1->eval();
  EXPECT_NEAR(m1->loss(b).item<double>(), l0, 1e-6 * std::abs(l0));
  m1->train();
  EXPECT_GT(std::abs(m1->loss(b).item<double>() - l0), 1e-4);
}

// Registered, traced training (the Trainer's path): the loss falls on a fixed batch and the
// traced losses match eager ones.
TEST_P(Seq2SeqErrors, TrainsTraced) {
  const std::string name = GetParam();
  auto cfg = parse_config(
      "vocab_size: 40\nd_model: 32\nnum_heads: 4\nd_ff: 64\nencoder_num_hidden_layers: 2\n"
      "decoder_num_hidden_layers: 2\nmax_position_embeddings: 16\ndropout_rate: 0.0\n");
  Batch b = make_batch(3, 8, 7, 40);
  auto run = [&](bool traced) {
    manual_seed(1);
    auto m = modelzoo::models().create(name, modelzoo::ConfigView(cfg, "model"), "model.name");
    optim::AdamW opt(m->parameters(), 3e-3);
    auto body = [&](const Batch& x) {
      Tensor l = m->loss(x);
      l.backward();
      opt.step();
      opt.zero_grad();
      return l;
    };
    std::vector<double> out;
    if (traced) {
      auto step = trace(body);
      std::vector<Tensor> ls;
      for (int s = 0; s < 25; ++s) ls.push_back(step(b));
      for (auto& l : ls) out.push_back(l.item<double>());
    } else {
      for (int s = 0; s < 25; ++s) out.push_back(body(b).item<double>());
    }
    return out;
  };
  auto traced = run(true), eager = run(false);
  EXPECT_LT(traced.back(), 0.5 * traced.front());
  for (size_t s = 0; s < traced.size(); ++s)
    EXPECT_NEAR(traced[s], eager[s], 1e-4 * std::abs(eager[s])) << "step " << s;
}

INSTANTIATE_TEST_SUITE_P(Models, Seq2SeqErrors, ::testing::Values("transformer", "t5"));

// Label smoothing follows torch's cross_entropy(label_smoothing=eps): (1 - eps) * nll + eps *
// mean over classes of -log p, averaged over the counted tokens.
TEST(TransformerModel, LabelSmoothingLoss) {
  manual_seed(2);
  auto c = TransformerConfig::tiny();
  c.label_smoothing = 0.1;
  TransformerModel m(c);
  Batch b = make_batch(2, 6, 5, 128);
  NoGradGuard ng;
  Tensor lg = m.logits(b);
  auto lp = log_softmax(lg, -1).to_vector<double>();
  auto labels = b.at("labels").to_vector<int64_t>();
  auto mask = b.at("decoder_attention_mask").to_vector<int64_t>();
  double total = 0, count = 0;
  for (size_t t = 0; t < labels.size(); ++t) {
    if (!mask[t]) continue;
    double mean_neg = 0;
    for (int64_t v = 0; v < 128; ++v) mean_neg -= lp[t * 128 + v] / 128.0;
    total += 0.9 * -lp[t * 128 + labels[t]] + 0.1 * mean_neg;
    count += 1;
  }
  EXPECT_NEAR(m.loss(b).item<double>(), total / count, 1e-5 * total / count);
}

// `recompute: true` in the Transformer's YAML reaches its layers: with dropout on, the gradients
// are bitwise those without recomputation (the re-run draws the same masks).
TEST(TransformerModel, RecomputeKeyGivesTheSameGradients) {
  std::vector<std::vector<std::vector<float>>> grads;
  for (const char* flag : {"false", "true"}) {
    auto cfg = parse_config(std::string("recompute: ") + flag + "\n");
    auto c = modelzoo::transformer::TransformerConfig::tiny();
    c.recompute = modelzoo::transformer::TransformerConfig::from(modelzoo::ConfigView(cfg, "model"))
                      .recompute;
    EXPECT_EQ(c.recompute, std::string(flag) == "true");
    c.dropout_rate = 0.1;
    manual_seed(6);
    modelzoo::transformer::TransformerModel m(c);
    manual_seed(7);
    m.loss(make_batch(2, 6, 5, c.src_vocab_size, 3)).backward();
    std::vector<std::vector<float>> g;
    for (auto& p : m.parameters()) g.push_back(p.grad().to_vector<float>());
    grads.push_back(g);
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_EQ(0, std::memcmp(grads[0][i].data(), grads[1][i].data(), grads[0][i].size() * 4))
        << "gradient " << i;
}

}  // namespace
}  // namespace cstorch::testing
