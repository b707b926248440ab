// Activation recomputation (cstorch::checkpoint): gradients bitwise equal to no recomputation,
// eager and traced, with dropout; the traced graph keeps the re-run separate (CSE) and the
// memory planner's arena shrinks for GPT-2 tiny; errors.
#include <gtest/gtest.h>

#include <cstring>

#include "compiler/graph.h"
#include "compiler/program.h"
#include "cstorch/cstorch.h"
#include "cstorch/nn/transformer.h"
#include "modelzoo/config_view.h"
#include "modelzoo/models/bert/bert.h"
#include "modelzoo/models/gpt2/gpt2.h"
#include "runtime/trace_context.h"
#include "unit/compiler/record_step.h"
#include "unit/test_util.h"

using namespace cstorch;
using namespace cstorch::testing;
namespace nn = cstorch::nn;
namespace cc = cstorch::compiler;

namespace {

// Bitwise equality of two f32 tensors, with the first differing element in the message.
void expect_bitwise(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.shape(), b.shape()) << what;
  auto va = a.to_vector<float>(), vb = b.to_vector<float>();
  for (size_t i = 0; i < va.size(); ++i)
    if (std::memcmp(&va[i], &vb[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " differs: " << va[i] << " vs " << vb[i];
      return;
    }
}

// Two pre-norm layers with dropout everywhere (residual, FFN, attention), a causal and a key
// mask and a trainable relative position bias computed outside the layers (a captured
// non-leaf tensor that requires grad), then a tied-style readout.
struct Stack {
  nn::TransformerEncoderLayer l1{nullptr}, l2{nullptr};
  nn::RelativePositionBias rb{nullptr};
  explicit Stack(bool recompute, bool norm_first = true) {
    manual_seed(11);
    nn::TransformerLayerOptions o;
    o.d_model = 16;
    o.nhead = 2;
    o.dim_feedforward = 32;
    o.dropout = 0.2;
    o.attention_dropout = 0.3;
    o.activation = "gelu_tanh";
    o.norm_first = norm_first;
    o.recompute = recompute;
    l1 = nn::TransformerEncoderLayer(o);
    l2 = nn::TransformerEncoderLayer(o);
    rb = nn::RelativePositionBias(2, false, 8, 16);
  }
  std::vector<Tensor> params() {
    std::vector<Tensor> p = l1->parameters();
    for (auto& t : l2->parameters()) p.push_back(t);
    for (auto& t : rb->parameters()) p.push_back(t);
    return p;
  }
  Tensor loss(const Tensor& x, const Tensor& key_mask) {
    nn::AttentionMasks m;
    m.causal = true;
    m.key_mask = key_mask;
    m.position_bias = rb(6, 6);
    Tensor h = l2->forward(l1->forward(x, m), m);
    return sum(mul(h, rt({2, 6, 16}, 7)));
  }
};

Tensor key_mask() {
  return iv({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, {2, 6});
}

// Records one GPT-2 tiny AdamW training step into a compiled Program (as cstorch::trace does).
cc::ProgramStats gpt2_step_stats(bool recompute, std::string* summary) {
  manual_seed(3);
  auto cfg = parse_config(std::string("dropout_rate: 0.1\nrecompute: ") +
                          (recompute ? "true" : "false") + "\n");
  auto c = modelzoo::gpt2::GPT2Config::tiny();
  auto from = modelzoo::gpt2::GPT2Config::from(modelzoo::ConfigView(cfg, "model"));
  c.dropout_rate = c.attention_dropout_rate = c.embedding_dropout_rate = from.dropout_rate;
  c.recompute = from.recompute;
  EXPECT_EQ(c.recompute, recompute);
  modelzoo::gpt2::GPT2Model m(c);
  optim::AdamW opt(m.parameters(), 1e-3);
  cc::Graph g;
  {
    runtime::TraceContext ctx;
    Batch b{{"input_ids", ctx.add_batch_input({4, 128}, DType::i32)},
            {"attention_mask", ctx.add_batch_input({4, 128}, DType::i32)},
            {"labels", ctx.add_batch_input({4, 128}, DType::i32)}};
    Tensor loss = m.loss(b);
    loss.backward();
    opt.step();
    opt.zero_grad();
    g.outputs.push_back(ctx.resolve(loss.impl_ptr()));
    for (auto& cap : ctx.captures()) {
      cc::StateSlot s{cap.impl, cap.input_node, nullptr, cap.original->shape, cap.original->dtype};
      if (cap.impl->node != cap.original && cap.impl->node != cap.input_node)
        s.write = cap.impl->node;
      g.state.push_back(s);
      cap.impl->node = cap.original;
    }
    g.nodes = ctx.nodes();
    g.batch_inputs = ctx.batch_inputs();
  }
  cc::optimize(g, "test");
  cc::Program p(std::move(g), Device{}, {});
  *summary = p.summary();
  return p.stats();
}

}  // namespace

TEST(Recompute, EagerGradientsAreBitwiseEqual) {
  for (bool norm_first : {true, false}) {
    SCOPED_TRACE(norm_first ? "pre-norm" : "post-norm");
    std::vector<std::vector<Tensor>> grads;
    std::vector<Tensor> rng_after;
    for (bool recompute : {false, true}) {
      Stack s(recompute, norm_first);
      Tensor x = rt({2, 6, 16}, 3);
      x.set_requires_grad(true);
      manual_seed(5);
      s.loss(x, key_mask()).backward();
      rng_after.push_back(rng_state());
      std::vector<Tensor> g{x.grad()};
      for (auto& p : s.params()) g.push_back(p.grad());
      grads.push_back(g);
    }
    ASSERT_EQ(grads[0].size(), grads[1].size());
    for (size_t i = 0; i < grads[0].size(); ++i)
      expect_bitwise(grads[0][i], grads[1][i], "gradient " + std::to_string(i));
    // The generator ends where it ends without recomputation (the re-run puts it back).
    EXPECT_EQ(rng_after[0].to_vector<int64_t>(), rng_after[1].to_vector<int64_t>());
  }
}

TEST(Recompute, DecoderLayerGradientsAreBitwiseEqual) {
  // The memory (encoder output) is an input of the scope and gets its gradient.
  std::vector<std::vector<Tensor>> grads;
  for (bool recompute : {false, true}) {
    manual_seed(4);
    nn::TransformerLayerOptions o;
    o.d_model = 16;
    o.nhead = 2;
    o.dim_feedforward = 32;
    o.dropout = 0.25;
    o.recompute = recompute;
    nn::TransformerDecoderLayer d(o);
    Tensor x = rt({2, 5, 16}, 1), mem = rt({2, 7, 16}, 2);
    x.set_requires_grad(true);
    mem.set_requires_grad(true);
    nn::AttentionMasks self, cross;
    self.causal = true;
    cross.key_mask = iv({1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0}, {2, 7});
    manual_seed(8);
    sum(mul(d->forward(x, mem * 1.0, self, cross), rt({2, 5, 16}, 3))).backward();
    std::vector<Tensor> g{x.grad(), mem.grad()};
    for (auto& p : d->parameters()) g.push_back(p.grad());
    grads.push_back(g);
  }
  for (size_t i = 0; i < grads[0].size(); ++i)
    expect_bitwise(grads[0][i], grads[1][i], "gradient " + std::to_string(i));
}

TEST(Recompute, BertConfigKey) {
  // `recompute: true` in the model's YAML reaches the layers; the loss gradients are the same.
  std::vector<std::vector<Tensor>> grads;
  for (const char* flag : {"false", "true"}) {
    auto cfg = parse_config(std::string("recompute: ") + flag + "\n");
    auto c = modelzoo::bert::BertConfig::tiny();
    c.recompute = modelzoo::bert::BertConfig::from(modelzoo::ConfigView(cfg, "model")).recompute;
    EXPECT_EQ(c.recompute, std::string(flag) == "true");
    c.max_position_embeddings = 16;
    manual_seed(6);
    modelzoo::bert::BertModel m(c);
    std::vector<int32_t> ids(16), labels(16, -100);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 5) % 512);
    labels[3] = 7;
    labels[12] = 100;
    Batch b{{"input_ids", from_vector(ids, {2, 8})},
            {"attention_mask", from_vector(std::vector<int32_t>(16, 1), {2, 8})},
            {"token_type_ids", from_vector(std::vector<int32_t>(16, 0), {2, 8})},
            {"mlm_labels", from_vector(labels, {2, 8})},
            {"next_sentence_label", from_vector(std::vector<int32_t>{0, 1}, {2})}};
    manual_seed(7);
    m.loss(b).backward();
    std::vector<Tensor> g;
    for (auto& p : m.parameters()) g.push_back(p.grad());
    grads.push_back(g);
  }
  for (size_t i = 0; i < grads[0].size(); ++i)
    expect_bitwise(grads[0][i], grads[1][i], "gradient " + std::to_string(i));
}

TEST(Recompute, TracedStepsAreBitwiseEqual) {
  // Gradients of three traced steps (fresh dropout each replay) and the parameters after
  // three SGD updates, with and without recomputation; also against the eager gradients.
  std::vector<std::vector<Tensor>> results;
  size_t per_step = 0;
  for (bool recompute : {false, true}) {
    Stack s(recompute);
    auto params = s.params();
    optim::SGD opt(params, 0.1);
    auto step = trace([&](const Batch& b) {
      Tensor l = s.loss(b.at("x"), b.at("mask"));
      l.backward();
      std::vector<Tensor> out{l};
      for (auto& p : params) out.push_back(p.grad() * 1.0);
      opt.step();
      opt.zero_grad();
      return out;
    });
    manual_seed(5);
    Batch b{{"x", rt({2, 6, 16}, 3)}, {"mask", key_mask()}};
    std::vector<Tensor> all;
    per_step = params.size() + 1;
    for (int i = 0; i < 3; ++i)
      for (auto& t : step(b)) all.push_back(t);
    for (auto& p : params) all.push_back(p);
    results.push_back(all);
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i)
    expect_bitwise(results[0][i], results[1][i], "traced value " + std::to_string(i));
  // Dropout was really on: the three steps' losses differ.
  EXPECT_NE(results[0][0].item<float>(), results[0][per_step].item<float>());
}

TEST(Recompute, SeveralOutputsAndInputsWithoutGrad) {
  std::vector<std::vector<Tensor>> grads;
  for (bool ckpt : {false, true}) {
    manual_seed(2);
    nn::Linear lin(8, 8);
    Tensor x = rt({4, 8}, 1), scale = rt({4, 8}, 2);  // scale does not require grad
    x.set_requires_grad(true);
    auto fn = [&](const std::vector<Tensor>& in) {
      Tensor h = gelu(lin(in[0]), true);
      Tensor d = nn::functional::dropout(h, 0.5, true);
      return std::vector<Tensor>{mul(d, in[1]), tanh(h)};
    };
    manual_seed(9);
    auto outs = ckpt ? checkpoint(fn, {x, scale}) : fn({x, scale});
    add(sum(mul(outs[0], rt({4, 8}, 4))), sum(mul(outs[1], rt({4, 8}, 5)))).backward();
    grads.push_back({x.grad(), lin->weight.grad(), lin->bias.grad()});
  }
  // Both outputs are back-propagated through one re-run together, so the two paths meet at h
  // as in the plain backward pass.
  for (size_t i = 0; i < 3; ++i)
    expect_bitwise(grads[0][i], grads[1][i], "gradient " + std::to_string(i));
}

TEST(Recompute, RerunUsesTheForwardAutocastMode) {
  // Forward under bf16 autocast, backward outside it: the re-run casts like the first run.
  std::vector<std::vector<Tensor>> grads;
  for (bool ckpt : {false, true}) {
    manual_seed(2);
    nn::Linear l1(8, 16), l2(16, 8);
    Tensor x = rt({4, 8}, 1);
    x.set_requires_grad(true);
    auto fn = [&](const Tensor& h) { return l2(gelu(l1(h), false)); };
    Tensor y;
    {
      amp::autocast ac(DType::bf16);
      y = ckpt ? checkpoint(fn, x) : fn(x);
    }
    EXPECT_EQ(y.dtype(), DType::bf16);
    sum(mul(cast(y, DType::f32), rt({4, 8}, 4))).backward();
    grads.push_back({x.grad(), l1->weight.grad(), l2->weight.grad(), l2->bias.grad()});
  }
  for (size_t i = 0; i < grads[0].size(); ++i)
    expect_bitwise(grads[0][i], grads[1][i], "gradient " + std::to_string(i));
}

TEST(Recompute, TracedRerunIsNotMergedByCse) {
  // linear -> gelu -> linear under checkpoint, then backward: after optimisation the graph
  // holds the forward gelu, the recomputed gelu and the gelu gradient.
  manual_seed(1);
  nn::Linear a(8, 16), b(16, 8);
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt ? "checkpoint" : "plain");
    cc::Graph g;
    {
      runtime::TraceContext ctx;
      Tensor x = ctx.add_batch_input({4, 8}, DType::f32);
      auto fn = [&](const Tensor& h) { return b(gelu(a(h), false)); };
      Tensor y = ckpt ? checkpoint(fn, x) : fn(x);
      Tensor l = sum(mul(y, y));
      l.backward();
      g.outputs.push_back(ctx.resolve(l.impl_ptr()));
      for (auto& p : {a->weight, b->weight}) g.outputs.push_back(ctx.resolve(p.grad().impl_ptr()));
      for (auto& cap : ctx.captures()) {
        g.state.push_back(
            {cap.impl, cap.input_node, nullptr, cap.original->shape, cap.original->dtype});
        cap.impl->node = cap.original;
      }
      g.nodes = ctx.nodes();
      g.batch_inputs = ctx.batch_inputs();
      for (auto* p : {&a->weight, &b->weight, &a->bias, &b->bias}) p->set_grad(Tensor());
    }
    cc::optimize(g, "test");
    EXPECT_EQ(count_nodes(g, ir::OpCode::Gelu), ckpt ? 2u : 1u) << g.dump();
    EXPECT_EQ(count_nodes(g, ir::OpCode::RecomputeBarrier), ckpt ? 1u : 0u) << g.dump();
    // The forward's first linear and its re-run: two, not one.
    EXPECT_GE(count_nodes(g, ir::OpCode::Linear) + count_nodes(g, ir::OpCode::Matmul),
              ckpt ? 5u : 4u)
        << g.dump();
  }
}

TEST(Recompute, Gpt2TinyArenaIsSmaller) {
  std::string s0, s1;
  auto plain = gpt2_step_stats(false, &s0);
  auto recomputed = gpt2_step_stats(true, &s1);
  std::printf("GPT-2 tiny step arena bytes: %zu without recomputation, %zu with\n",
              plain.arena_bytes, recomputed.arena_bytes);
  EXPECT_LT(recomputed.arena_bytes * 10, plain.arena_bytes * 9) << s0 << "\n" << s1;
}

TEST(Recompute, UnderNoGradTheFunctionSimplyRuns) {
  manual_seed(1);
  nn::Linear lin(4, 4);
  NoGradGuard ng;
  Tensor y = checkpoint([&](const Tensor& h) { return lin(h); }, rt({2, 4}));
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.node()->op, ir::OpCode::Linear);
}

TEST(Recompute, Errors) {
  EXPECT_ERROR(checkpoint(CheckpointFn(), {rt({2})}), "checkpoint", "function is empty");
  EXPECT_ERROR(checkpoint([](const Tensor& t) { return t; }, Tensor()), "checkpoint: input 0",
               "undefined");
  manual_seed(1);
  nn::Linear lin(4, 4);
  Tensor other = rt({4}, 3);
  other.set_requires_grad(true);
  {
    // The re-run reads a tensor requiring grad that the first run did not.
    int calls = 0;
    Tensor y = checkpoint(
        [&](const Tensor& h) { return ++calls == 1 ? lin(h) : add(lin(h), other); }, rt({2, 4}));
    EXPECT_ERROR(sum(y).backward(), "checkpoint: the recomputed function read a tensor",
                 "requires grad", "shape [4]");
  }
  {
    int calls = 0;
    auto y = checkpoint(
        [&](const std::vector<Tensor>& in) {
          std::vector<Tensor> r{lin(in[0])};
          if (++calls > 1) r.push_back(lin(in[0]));
          return r;
        },
        {rt({2, 4})});
    EXPECT_ERROR(sum(y[0]).backward(), "checkpoint: the recomputed function returned 2 outputs",
                 "first run 1");
  }
  {
    int calls = 0;
    Tensor y =
        checkpoint([&](const Tensor& h) { return ++calls == 1 ? lin(h) : slice(lin(h), 0, 0, 1); },
                   rt({2, 4}));
    EXPECT_ERROR(sum(y).backward(), "output 0 of the recomputed function is f32 [1, 4]",
                 "first run gave f32 [2, 4]");
  }
}
