// Transformer building blocks and the GPT-2 / BERT models: known answers, shapes, caches,
// parameter counts and errors. Agreement with torch is in tests/reference (op_table rows for
// the attention kernel, test_transformer_models.cpp for the models).
#include <gtest/gtest.h>

#include <cmath>

#include "cstorch/cstorch.h"
#include "cstorch/nn/transformer.h"
#include "modelzoo/config_view.h"
#include "modelzoo/models/bert/bert.h"
#include "modelzoo/models/gpt2/gpt2.h"
#include "modelzoo/models/transformer/transformer.h"
#include "unit/test_util.h"

using namespace cstorch;
using namespace cstorch::testing;
namespace nn = cstorch::nn;

namespace {
int64_t count_params(const nn::Module& m) {
  int64_t n = 0;
  for (auto& p : m.parameters()) n += p.numel();
  return n;
}
}  // namespace

// HF T5Attention._relative_position_bucket, evaluated by hand for 32 buckets, distance 128.
TEST(Transformer, RelativePositionBucketKnownAnswers) {
  // Bidirectional: 16 buckets per sign, 8 exact; positive distances from bucket 16.
  EXPECT_EQ(nn::relative_position_bucket(0, true), 0);
  EXPECT_EQ(nn::relative_position_bucket(-3, true), 3);
  EXPECT_EQ(nn::relative_position_bucket(3, true), 19);
  EXPECT_EQ(nn::relative_position_bucket(-7, true), 7);
  // 8 + int(log(8/8)/log(16) * 8) = 8; 8 + int(log(20/8)/log(16)*8) = 8 + int(2.643) = 10
  EXPECT_EQ(nn::relative_position_bucket(-8, true), 8);
  EXPECT_EQ(nn::relative_position_bucket(-20, true), 10);
  EXPECT_EQ(nn::relative_position_bucket(20, true), 26);
  EXPECT_EQ(nn::relative_position_bucket(-127, true), 15);
  EXPECT_EQ(nn::relative_position_bucket(-1000, true), 15);
  // Causal: positive distances (future keys) -> 0; 32 buckets, 16 exact.
  EXPECT_EQ(nn::relative_position_bucket(5, false), 0);
  EXPECT_EQ(nn::relative_position_bucket(-5, false), 5);
  // 16 + int(log(40/16)/log(8) * 16) = 16 + int(7.049) = 23
  EXPECT_EQ(nn::relative_position_bucket(-40, false), 23);
  EXPECT_EQ(nn::relative_position_bucket(-500, false), 31);
  EXPECT_ERROR(nn::relative_position_bucket(0, true, 2), "num_buckets");
}

TEST(Transformer, RelativePositionBiasShapeAndValues) {
  nn::RelativePositionBias rb(3, true, 8, 16);
  Tensor b = rb(4, 5);
  EXPECT_EQ(b.shape(), (Shape{1, 3, 4, 5}));
  auto w = rb->relative_attention_bias->weight.to_vector<float>();
  auto v = b.to_vector<float>();
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        int64_t bucket = nn::relative_position_bucket(j - i, true, 8, 16);
        EXPECT_EQ(v[static_cast<size_t>((h * 4 + i) * 5 + j)],
                  w[static_cast<size_t>(bucket * 3 + h)]);
      }
  EXPECT_EQ(rb->state_dict().keys(), std::vector<std::string>{"relative_attention_bias.weight"});
}

TEST(Transformer, SinusoidalPositions) {
  nn::SinusoidalPositionEmbedding pe(50, 6);
  Tensor t = pe(3, 10);  // positions 10, 11, 12
  auto v = t.to_vector<double>();
  for (int p = 0; p < 3; ++p)
    for (int i = 0; i < 3; ++i) {
      double a = (10 + p) / std::pow(10000.0, 2.0 * i / 6);
      EXPECT_NEAR(v[p * 6 + 2 * i], std::sin(a), 1e-7);
      EXPECT_NEAR(v[p * 6 + 2 * i + 1], std::cos(a), 1e-7);
    }
  EXPECT_EQ(pe->state_dict().size(), 0u);
  EXPECT_ERROR(pe(45, 10), "exceed max_position_embeddings 50", "sequence length 45");
  EXPECT_ERROR(nn::SinusoidalPositionEmbedding(10, 5), "even");
}

TEST(Transformer, LearnedPositionsAndErrors) {
  nn::LearnedPositionEmbedding pe(8, 4);
  EXPECT_EQ(pe(3, 2).shape(), (Shape{3, 4}));
  EXPECT_EQ(pe(3, 2).to_vector<float>(), slice(pe->weight, 0, 2, 5).to_vector<float>());
  EXPECT_ERROR(pe(9), "sequence length 9", "max_position_embeddings 8");
}

TEST(Transformer, RMSNorm) {
  nn::RMSNorm n(4, 1e-6);
  nn::init::uniform_(n->weight, 0.5, 1.5);
  Tensor x = rt({2, 4}, 3);
  auto xv = x.to_vector<double>();
  auto w = n->weight.to_vector<double>();
  auto y = n(x).to_vector<double>();
  for (int r = 0; r < 2; ++r) {
    double ms = 0;
    for (int j = 0; j < 4; ++j) ms += xv[r * 4 + j] * xv[r * 4 + j] / 4;
    for (int j = 0; j < 4; ++j)
      EXPECT_NEAR(y[r * 4 + j], w[j] * xv[r * 4 + j] / std::sqrt(ms + 1e-6), 1e-6);
  }
  check_grad([&](const std::vector<Tensor>& a) { return n(a[0]); }, {x});
  EXPECT_EQ(n(x.to(DType::bf16)).dtype(), DType::f32);  // weight f32 * bf16 -> f32
  EXPECT_ERROR(n(rt({2, 3})), "RMSNorm(4)", "[2, 3]");
}

TEST(Transformer, MultiheadAttentionNamesAndShapes) {
  nn::MultiheadAttention a(8, 2);
  EXPECT_EQ(a->state_dict().keys(), (std::vector<std::string>{"in_proj_weight", "in_proj_bias",
                                                              "out_proj.weight", "out_proj.bias"}));
  Tensor x = rt({2, 5, 8}), mem = rt({2, 7, 8}, 2);
  EXPECT_EQ(a(x).shape(), (Shape{2, 5, 8}));
  EXPECT_EQ(a->forward(x, mem, mem).shape(), (Shape{2, 5, 8}));
  nn::MultiheadAttentionOptions o;
  o.embed_dim = 8;
  o.num_heads = 2;
  o.kdim = 3;
  o.vdim = 5;
  nn::MultiheadAttention c(o);
  EXPECT_EQ(c->state_dict().keys(),
            (std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight",
                                      "in_proj_bias", "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(c->forward(x, rt({2, 7, 3}), rt({2, 7, 5})).shape(), (Shape{2, 5, 8}));
  EXPECT_ERROR(c->forward(x, rt({2, 7, 4}), rt({2, 7, 5})), "kdim=3", "[2, 7, 4]");
  EXPECT_ERROR(nn::MultiheadAttention(10, 3), "multiple of num_heads");
  nn::AttentionMasks m;
  m.key_mask = iv({1, 1, 0}, {1, 3});
  EXPECT_ERROR(a->forward(x, mem, mem, m), "key_mask", "[1, 3]");
}

// Cross-attention with a key mask equals attention over the unmasked keys only.
TEST(Transformer, KeyMaskEqualsDroppingKeys) {
  nn::MultiheadAttention a(8, 2);
  Tensor x = rt({1, 3, 8}), mem = rt({1, 5, 8}, 2);
  nn::AttentionMasks m;
  m.key_mask = iv({1, 0, 1, 1, 0}, {1, 5});
  Tensor y = a->forward(x, mem, mem, m);
  Tensor kept = cat({slice(mem, 1, 0, 1), slice(mem, 1, 2, 4)}, 1);
  Tensor want = a->forward(x, kept, kept);
  expect_close(y.to_vector<double>(), want.to_vector<double>(), 1e-5);
}

TEST(Transformer, DecoderLayerRunsAndRecomputeIsAnError) {
  nn::TransformerLayerOptions o;
  o.d_model = 8;
  o.nhead = 2;
  o.dim_feedforward = 16;
  o.dropout = 0;
  for (bool pre : {false, true}) {
    o.norm_first = pre;
    nn::TransformerDecoderLayer d(o);
    nn::AttentionMasks self;
    self.causal = true;
    Tensor y = d->forward(rt({2, 4, 8}), rt({2, 6, 8}, 2), self, nn::AttentionMasks{});
    EXPECT_EQ(y.shape(), (Shape{2, 4, 8}));
    // Causal: changing the last target position leaves earlier outputs unchanged.
    Tensor x = rt({1, 4, 8}, 3), mem = rt({1, 6, 8}, 4);
    Tensor x2 = cat({slice(x, 1, 0, 3), rt({1, 1, 8}, 9)}, 1);
    auto a = slice(d->forward(x, mem, self, nn::AttentionMasks{}), 1, 0, 3).to_vector<double>();
    auto b = slice(d->forward(x2, mem, self, nn::AttentionMasks{}), 1, 0, 3).to_vector<double>();
    expect_close(a, b, 1e-6);
  }
  o.activation = "swish";
  EXPECT_ERROR(nn::TransformerEncoderLayer{o}, "unknown activation 'swish'");
}

TEST(Gpt2, ParameterCounts) {
  // GPT-2 small with a tied head and 1024 positions: the published 124,439,808.
  EXPECT_EQ(modelzoo::gpt2::GPT2Config::small().num_parameters(), 124439808);
  // The formula against a built model.
  auto c = modelzoo::gpt2::GPT2Config::tiny();
  c.num_hidden_layers = 3;
  modelzoo::gpt2::GPT2Model m(c);
  EXPECT_EQ(count_params(m), c.num_parameters());
}

TEST(Gpt2, KvCacheMatchesFullForward) {
  manual_seed(3);
  auto c = modelzoo::gpt2::GPT2Config::tiny();
  c.dropout_rate = c.attention_dropout_rate = c.embedding_dropout_rate = 0;
  modelzoo::gpt2::GPT2Model m(c);
  m.eval();
  NoGradGuard ng;
  Tensor ids = from_vector(std::vector<int32_t>{5, 17, 2, 99, 43, 7, 8, 250}, {2, 4});
  Tensor full = m.logits(ids);
  modelzoo::gpt2::KVCache cache;
  Tensor a = m.logits(slice(ids, 1, 0, 3), &cache);
  EXPECT_EQ(cache.length(), 3);
  Tensor b = m.logits(slice(ids, 1, 3, 4), &cache);
  EXPECT_EQ(cache.length(), 4);
  expect_close(cat({a, b}, 1).to_vector<double>(), full.to_vector<double>(), 1e-5);
}

TEST(Gpt2, Errors) {
  auto c = modelzoo::gpt2::GPT2Config::tiny();
  c.max_position_embeddings = 8;
  modelzoo::gpt2::GPT2Model m(c);
  EXPECT_ERROR(m.logits(from_vector(std::vector<int32_t>(18, 1), {2, 9})), "gpt2",
               "sequence length 9", "max_position_embeddings is 8");
  EXPECT_ERROR(m.logits(from_vector(std::vector<int32_t>{1, 2, 3, 300}, {2, 2})),
               "input_ids[1, 1] = 300", "vocabulary [0, 256)");
  // Inside a traced step the embedding's index check names the value and its position.
  auto step = trace([&](const Batch& b) { return m.logits(b.at("ids")); });
  EXPECT_ERROR(step(Batch{{"ids", from_vector(std::vector<int32_t>{1, 2, 3, 300}, {2, 2})}})
                   .to_vector<float>(),
               "index 300", "position 3");
  EXPECT_ERROR(m.loss(Batch{{"input_ids", from_vector(std::vector<int32_t>{1, 2}, {1, 2})}}),
               "no \"attention_mask\"");
  auto cfg = cstorch::parse_config("hidden_size: 30\nnum_heads: 4\n");
  EXPECT_ERROR(modelzoo::models().create("gpt2", modelzoo::ConfigView(cfg, "model"), "model.name"),
               "model.num_heads", "do not divide hidden_size 30");
}

// Model::check_batch_values, which the Trainer runs on each host batch before its traced step
// (where a bad value could be reported only as a failed op): each model names the key, the
// position and the value; a good batch passes; keys a model does not read, or that are missing,
// are left alone (loss() names a missing key).
TEST(Transformer, HostBatchValueChecks) {
  auto i2 = [](std::vector<int32_t> v) { return from_vector(v, {2, 2}); };
  modelzoo::gpt2::GPT2Model gpt(modelzoo::gpt2::GPT2Config::tiny());  // vocab 256
  Batch g{{"input_ids", i2({1, 2, 3, 4})},
          {"attention_mask", i2({1, 1, 1, 0})},
          {"labels", i2({2, 3, 4, -100})}};
  gpt.check_batch_values(g);
  gpt.check_batch_values(Batch{{"input_ids", i2({1, 2, 3, 4})}});
  auto with = [](Batch b, const char* k, Tensor t) {
    b[k] = t;
    return b;
  };
  EXPECT_ERROR(gpt.check_batch_values(with(g, "attention_mask", i2({1, 1, 2, 0}))),
               "gpt2: attention_mask[1, 0] = 2 is not 0 or 1");
  EXPECT_ERROR(gpt.check_batch_values(with(g, "labels", i2({2, 3, 256, 0}))),
               "gpt2: labels[1, 0] = 256 is outside the vocabulary [0, 256)",
               "not the ignore index");
  EXPECT_ERROR(gpt.check_batch_values(with(g, "input_ids", i2({1, -100, 3, 4}))),
               "gpt2: input_ids[0, 1] = -100 is outside the vocabulary [0, 256)");
  EXPECT_ERROR(gpt.loss(with(g, "attention_mask", i2({1, 1, 2, 0}))), "attention_mask[1, 0] = 2");

  modelzoo::bert::BertModel bert(modelzoo::bert::BertConfig::tiny());  // vocab 512, NSP on
  Batch b{{"input_ids", i2({1, 2, 3, 4})},
          {"attention_mask", i2({1, 1, 1, 0})},
          {"token_type_ids", i2({0, 1, 0, 1})},
          {"mlm_labels", i2({-100, 7, -100, -100})},
          {"next_sentence_label", from_vector(std::vector<int32_t>{0, 1}, {2})}};
  bert.check_batch_values(b);
  EXPECT_ERROR(bert.check_batch_values(with(b, "attention_mask", i2({1, 3, 1, 0}))),
               "bert: attention_mask[0, 1] = 3 is not 0 or 1");
  EXPECT_ERROR(bert.check_batch_values(with(b, "token_type_ids", i2({0, 2, 0, 1}))),
               "bert: token_type_ids[0, 1] = 2 is outside the vocabulary [0, 2)");
  EXPECT_ERROR(bert.check_batch_values(with(b, "mlm_labels", i2({-1, 7, -100, -100}))),
               "bert: mlm_labels[0, 0] = -1");
  EXPECT_ERROR(bert.check_batch_values(
                   with(b, "next_sentence_label", from_vector(std::vector<int32_t>{0, 2}, {2}))),
               "bert: next_sentence_label[1] = 2 is not 0 or 1");
  // The eager loss reports the same (inside a traced step only shapes are known).
  EXPECT_ERROR(bert.loss(with(b, "attention_mask", i2({1, 3, 1, 0}))), "attention_mask[0, 1] = 3");

  modelzoo::transformer::TransformerModel tr(
      modelzoo::transformer::TransformerConfig::tiny());  // vocab 128
  Batch t{{"input_ids", i2({1, 2, 3, 4})},
          {"attention_mask", i2({1, 1, 1, 1})},
          {"decoder_input_ids", i2({1, 2, 3, 4})},
          {"decoder_attention_mask", i2({1, 1, 1, 0})},
          {"labels", i2({2, 3, 4, -100})}};
  tr.check_batch_values(t);
  EXPECT_ERROR(tr.check_batch_values(with(t, "decoder_attention_mask", i2({1, 1, -1, 0}))),
               "decoder_attention_mask[1, 0] = -1 is not 0 or 1");
  EXPECT_ERROR(tr.check_batch_values(with(t, "decoder_input_ids", i2({1, 2, 3, 128}))),
               "decoder_input_ids[1, 1] = 128 is outside the vocabulary [0, 128)");
  EXPECT_ERROR(tr.loss(with(t, "attention_mask", i2({1, 1, 5, 1}))), "attention_mask[1, 0] = 5");
}

TEST(Bert, ParameterCounts) {
  auto base = modelzoo::bert::BertConfig::base();
  // BertModel (encoder + pooler), the "110M" of the paper: 109,482,240.
  EXPECT_EQ(base.num_backbone_parameters(), 109482240);
  // With the MLM transform + decoder bias (decoder tied) and the NSP head: 110,106,428.
  EXPECT_EQ(base.num_parameters(), 110106428);
  auto c = modelzoo::bert::BertConfig::tiny();
  modelzoo::bert::BertModel m(c);
  EXPECT_EQ(count_params(m), c.num_parameters());
  c.disable_nsp = true;
  modelzoo::bert::BertModel m2(c);
  EXPECT_EQ(count_params(m2), c.num_parameters());
}

// Both models are registered and train inside cstorch::trace (the loss falls on a fixed batch).
TEST(Transformer, RegisteredModelsTrainTraced) {
  for (std::string name : {"gpt2", "bert"}) {
    SCOPED_TRACE(name);
    manual_seed(1);
    auto cfg = cstorch::parse_config(
        "vocab_size: 64\nhidden_size: 32\nnum_hidden_layers: 2\nnum_heads: 2\n"
        "max_position_embeddings: 16\nfilter_size: 64\n");
    auto model = modelzoo::models().create(name, modelzoo::ConfigView(cfg, "model"), "model.name");
    std::vector<int32_t> ids(2 * 8), mask(2 * 8, 1), labels(2 * 8), types(2 * 8, 0);
    for (size_t i = 0; i < ids.size(); ++i) {
      ids[i] = static_cast<int32_t>((i * 7 + 3) % 64);
      labels[i] = static_cast<int32_t>((i * 5 + 1) % 64);
    }
    mask[15] = 0;
    Batch b{{"input_ids", from_vector(ids, {2, 8})}, {"attention_mask", from_vector(mask, {2, 8})}};
    if (name == "gpt2") {
      b["labels"] = from_vector(labels, {2, 8});
    } else {
      b["token_type_ids"] = from_vector(types, {2, 8});
      b["mlm_labels"] = from_vector(labels, {2, 8});
      b["next_sentence_label"] = from_vector(std::vector<int32_t>{0, 1}, {2});
    }
    optim::AdamW opt(model->parameters(), 3e-3);
    auto step = trace([&](const Batch& x) {
      Tensor l = model->loss(x);
      l.backward();
      opt.step();
      opt.zero_grad();
      return l;
    });
    std::vector<Tensor> losses;
    for (int s = 0; s < 30; ++s) losses.push_back(step(b));
    EXPECT_LT(losses.back().item<double>(), 0.5 * losses.front().item<double>());
  }
}
