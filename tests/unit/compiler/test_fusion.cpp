// The elementwise fusion pass (which groups form and which do not) and the Fused kernel (its
// results are bitwise equal to the unfused kernels', for every broadcast form it reads).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>

#include <cstorch/amp.h>
#include <cstorch/cstorch.h>

#include "backend/cpu/variant.h"
#include "compiler/graph.h"
#include "compiler/program.h"
#include "ir/device.h"
#include "ir/fused.h"
#include "runtime/trace_context.h"
#include "unit/compiler/record_step.h"

namespace cs = cstorch;
using cs::Tensor;
namespace cc = cstorch::compiler;
using cs::ir::OpCode;
using cs::testing::count_nodes;

namespace {

using In = cs::testing::RecordInput;
using cs::testing::record;

const cs::ir::Node* first(const cc::Graph& g, OpCode op) {
  for (auto& n : g.nodes)
    if (n->op == op) return n.get();
  return nullptr;
}

// Runs `body` compiled with and without fusion on the same random inputs; expects at least
// `min_fused` Fused nodes and bitwise-equal outputs.
template <class F>
void expect_bitwise_equal(const std::vector<In>& ins, F body, size_t min_fused, uint32_t seed = 1) {
  cc::Graph plain = record(ins, body);
  cc::Graph fused = record(ins, body);
  cc::optimize(plain, "plain");  // the standard pipeline fuses...
  ASSERT_GE(count_nodes(plain, OpCode::Fused), min_fused) << plain.dump();
  setenv("CSTORCH_FUSION", "0", 1);  // ...unless turned off
  cc::optimize(fused, "unfused");
  unsetenv("CSTORCH_FUSION");
  ASSERT_EQ(count_nodes(fused, OpCode::Fused), 0u);
  std::swap(plain, fused);  // names: `fused` has Fused nodes, `plain` has none
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<std::vector<uint8_t>> data;
  for (auto& s : ins) {
    int64_t n = cs::numel(s.shape);
    std::vector<uint8_t> d(static_cast<size_t>(n) * cs::itemsize(s.dtype));
    for (int64_t i = 0; i < n; ++i) {
      if (s.dtype == cs::DType::boolean)
        d[i] = rng() & 1;
      else if (s.dtype == cs::DType::bf16)
        reinterpret_cast<cs::bf16_t*>(d.data())[i] = cs::bf16_t(normal(rng));
      else
        reinterpret_cast<float*>(d.data())[i] = normal(rng);
    }
    data.push_back(std::move(d));
  }
  auto run = [&](cc::Graph g) {
    std::vector<std::vector<uint8_t>> outs;
    for (auto& o : g.outputs) outs.emplace_back(o->nbytes());
    cc::Program p(std::move(g), cs::Device{}, {});
    std::vector<const void*> b;
    for (auto& d : data) b.push_back(d.data());
    std::vector<void*> o;
    for (auto& x : outs) o.push_back(x.data());
    p.run(b.data(), o.data());
    return outs;
  };
  auto a = run(std::move(plain));
  auto f = run(std::move(fused));
  ASSERT_EQ(a.size(), f.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].data(), f[i].data(), a[i].size()), 0) << "output " << i;
}

}  // namespace

TEST(Fusion, ChainBecomesOneNode) {
  auto g = record({{{4, 8}}, {{4, 8}}}, [](auto& in) {
    return std::vector<Tensor>{cs::exp(in[0] * 2.0) + cs::tanh(in[1]) - in[0]};
  });
  EXPECT_TRUE(cc::make_fuse_elementwise_pass()->run(g));
  cc::verify(g, "test");
  EXPECT_EQ(g.count_ops() - count_nodes(g, OpCode::Full), 1u) << g.dump();
  const auto* f = first(g, OpCode::Fused);
  ASSERT_NE(f, nullptr);
  EXPECT_EQ(f->attr<cs::ir::FusedAttrs>().code.size(), 5u);  // mul exp tanh add sub
  EXPECT_NE(g.dump().find("fused{"), std::string::npos) << g.dump();
}

TEST(Fusion, SharedValueEndsAGroup) {
  // a = exp(x * 2) feeds two outputs: {mul, exp} fuse; each consumer is alone and stays plain.
  auto g = record({{{16}}, {{16}}}, [](auto& in) {
    auto a = cs::exp(in[0] * 2.0);
    return std::vector<Tensor>{a + 1.0, a * in[1]};
  });
  cc::make_fuse_elementwise_pass()->run(g);
  cc::verify(g, "test");
  EXPECT_EQ(count_nodes(g, OpCode::Fused), 1u) << g.dump();
  EXPECT_EQ(count_nodes(g, OpCode::Add), 1u);
  EXPECT_EQ(count_nodes(g, OpCode::Exp), 0u);
  EXPECT_EQ(first(g, OpCode::Fused)->attr<cs::ir::FusedAttrs>().code.size(), 2u);
}

TEST(Fusion, OutputsAreNotAbsorbed) {
  // The step output b is also an input of c: b ends its own group.
  auto g = record({{{8}}}, [](auto& in) {
    auto b = cs::exp(in[0]) * 3.0;
    auto c = cs::sqrt(cs::abs(b)) + 1.0;
    return std::vector<Tensor>{b, c};
  });
  cc::make_fuse_elementwise_pass()->run(g);
  EXPECT_EQ(count_nodes(g, OpCode::Fused), 2u) << g.dump();
  EXPECT_EQ(g.count_ops() - count_nodes(g, OpCode::Full), 2u) << g.dump();
}

TEST(Fusion, NonElementwiseOpsAndOtherShapesBreakGroups) {
  // Layer-norm-like: the reductions stay; the chain after them fuses with the [N, 1]
  // statistics as column operands and the [D] weight as a row operand.
  auto g = record({{{6, 10}}, {{10}}}, [](auto& in) {
    auto m = cs::mean(in[0], {-1}, true);
    auto v = cs::var(in[0], {-1}, 0, true);
    return std::vector<Tensor>{(in[0] - m) * cs::rsqrt(v + 1e-5) * in[1]};
  });
  cc::make_fuse_elementwise_pass()->run(g);
  cc::verify(g, "test");
  EXPECT_EQ(count_nodes(g, OpCode::Mean), 1u);
  EXPECT_EQ(count_nodes(g, OpCode::Var), 1u);
  // [N, 1] ops (add eps, rsqrt) form their own group; the [N, D] chain another.
  EXPECT_EQ(count_nodes(g, OpCode::Fused), 2u) << g.dump();
  EXPECT_EQ(count_nodes(g, OpCode::Sub), 0u);
}

TEST(Fusion, UnsupportedBroadcastIsNotFused) {
  // [4, 1, 8] against [4, 3, 8]: the broadcast dim sits between full dims.
  auto g = record({{{4, 3, 8}}, {{4, 1, 8}}},
                  [](auto& in) { return std::vector<Tensor>{cs::exp(in[0]) * in[1]}; });
  cc::make_fuse_elementwise_pass()->run(g);
  EXPECT_EQ(count_nodes(g, OpCode::Fused), 0u) << g.dump();
  cs::ir::FusedOperand op;
  EXPECT_FALSE(cs::ir::fused_operand({4, 1, 8}, {4, 3, 8}, op));
  ASSERT_TRUE(cs::ir::fused_operand({3, 1}, {2, 3, 5}, op));
  EXPECT_EQ(op.div, 5);
  EXPECT_EQ(op.mod, 3);
}

TEST(Fusion, BoolIntermediatesFuseButBoolRootsDoNot) {
  auto g = record({{{32}}, {{32}}}, [](auto& in) {
    auto mask = in[0] > in[1];
    return std::vector<Tensor>{cs::where(mask, in[0] * 2.0, in[1]), mask};
  });
  cc::make_fuse_elementwise_pass()->run(g);
  // The mask is an output (so not absorbed), and bool: it stays a plain comparison.
  EXPECT_EQ(count_nodes(g, OpCode::Gt), 1u);
  EXPECT_EQ(count_nodes(g, OpCode::Fused), 1u) << g.dump();
}

TEST(Fusion, SettingTurnsThePassOff) {
  auto body = [](auto& in) { return std::vector<Tensor>{cs::exp(in[0]) * 2.0 + 1.0}; };
  auto g = record({{{8}}}, body);
  setenv("CSTORCH_FUSION", "0", 1);
  cc::optimize(g, "off");
  unsetenv("CSTORCH_FUSION");
  EXPECT_EQ(count_nodes(g, OpCode::Fused), 0u);
  auto h = record({{{8}}}, body);
  cc::optimize(h, "on");
  EXPECT_EQ(count_nodes(h, OpCode::Fused), 1u);
}

TEST(FusedKernel, BitwiseEqualSameShapeChainsAcrossBlocksAndThreads) {
  // 70001 elements: many 512-element blocks, a ragged last block, several parallel chunks.
  expect_bitwise_equal(
      {{{70001}}, {{70001}}, {{70001}}},
      [](auto& in) {
        auto a = cs::sigmoid(in[0]) * cs::tanh(in[1]) + cs::exp(in[2] * 0.25);
        auto b = cs::gelu(a, true) - cs::gelu(in[1]) / (cs::abs(in[2]) + 1.0);
        auto c = cs::maximum(b, cs::relu(in[0])) + cs::minimum(cs::silu(in[1]), cs::erf(in[2]));
        return std::vector<Tensor>{cs::addcmul(c, in[0], in[1], 0.5) + cs::log(cs::abs(a) + 1.0) -
                                   cs::sqrt(cs::abs(in[2]))};
      },
      1);
}

TEST(FusedKernel, BitwiseEqualForScalarRowAndColumnOperands) {
  expect_bitwise_equal(
      {{{37, 700}}, {{700}}, {{37, 1}}, {{}}},
      [](auto& in) {
        auto y = (in[0] - in[2]) * cs::rsqrt(in[2] * in[2] + 1e-5) * in[1] + in[3];
        return std::vector<Tensor>{cs::pow(y, 2.0) + cs::pow(cs::abs(y), in[3])};
      },
      1);
}

TEST(FusedKernel, BitwiseEqualWithBoolOperandsAndComparisons) {
  expect_bitwise_equal(
      {{{3, 1000}}, {{3, 1000}}, {{3, 1000}, cs::DType::boolean}},
      [](auto& in) {
        auto m = cs::logical_and(in[0] > in[1], in[2]);
        auto w = cs::where(m, in[0] * in[1], -in[1]) + cs::where(in[2], in[0], cs::full({}, 3.0));
        return std::vector<Tensor>{w * in[2].to(cs::DType::f32)};
      },
      1);
}

TEST(FusedKernel, BitwiseEqualWithBf16OperandsWidenedInTheProgram) {
  // Casts of bf16 to f32 join the program; the kernel widens the bf16 inputs itself, of every
  // broadcast form it reads: same shape (70001 elements: ragged last block, several chunks),
  // rows, columns and a single element. Bitwise the Cast kernel and the ops one by one.
  const auto bf16 = cs::DType::bf16;
  auto f32 = [](const Tensor& t) { return t.to(cs::DType::f32); };
  expect_bitwise_equal(
      {{{70001}, bf16}, {{70001}}},
      [&](auto& in) { return std::vector<Tensor>{cs::exp(f32(in[0]) * 0.5) * in[1] - f32(in[0])}; },
      1);
  // Rows, columns and single elements of bf16 (as a product narrowed by fused_bf16_operands may
  // be read): the program on the bf16 inputs against the same program on their f32 values.
  const std::vector<cs::Shape> shapes = {{37, 700}, {700}, {37, 1}, {}};
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<std::vector<cs::bf16_t>> h(shapes.size());
  std::vector<std::vector<float>> w(shapes.size());
  std::vector<cs::ir::NodePtr> in16, in32;
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (int64_t k = 0; k < cs::numel(shapes[i]); ++k) {
      h[i].push_back(cs::bf16_t(normal(rng)));
      w[i].push_back(static_cast<float>(h[i].back()));
    }
    for (auto [v, t] : {std::pair{&in16, bf16}, std::pair{&in32, cs::DType::f32}}) {
      auto x = cs::ir::Node::make(OpCode::Constant, cs::ir::NoAttrs{}, {});
      x->shape = shapes[i];
      x->dtype = t;
      v->push_back(x);
    }
  }
  cs::ir::FusedAttrs a;
  a.shape = {37, 700};
  auto instr = [&](OpCode op, std::vector<uint16_t> args) {
    cs::ir::FusedInstr ins;
    ins.op = static_cast<uint16_t>(op);
    ins.nargs = static_cast<uint8_t>(args.size());
    for (size_t k = 0; k < args.size(); ++k) ins.args[k] = args[k];
    a.code.push_back(ins);
  };
  instr(OpCode::Sub, {0, 2});  // r4 = x - column
  instr(OpCode::Mul, {4, 1});  // r5 = r4 * row
  instr(OpCode::Add, {5, 3});  // r6 = r5 + scalar
  instr(OpCode::Tanh, {6});    // r7
  auto f16 = cs::ir::Node::make(OpCode::Fused, a, in16);
  auto f32n = cs::ir::Node::make(OpCode::Fused, a, in32);
  for (auto& f : {f16, f32n}) {
    f->device = cs::Device{};
    cs::ir::op_info(OpCode::Fused).infer(*f);
  }
  std::vector<float> o16(37 * 700), o32(37 * 700);
  const void* p16[] = {h[0].data(), h[1].data(), h[2].data(), h[3].data()};
  const void* p32[] = {w[0].data(), w[1].data(), w[2].data(), w[3].data()};
  cs::ir::KernelContext ctx;
  const cs::ir::Kernel fused_kernel = cs::ir::kernel_for(*f16);
  fused_kernel(ctx, *f16, p16, o16.data());
  fused_kernel(ctx, *f32n, p32, o32.data());
  EXPECT_EQ(std::memcmp(o16.data(), o32.data(), o16.size() * sizeof(float)), 0);
  EXPECT_NE(o32[0], 0.0f);
  // The casts are gone: the Fused program reads the bf16 tensors. (A cast joins a program of its
  // own shape only: a row's cast would stay, and the program read its f32 result.)
  auto g = record({{{37, 700}, bf16}, {{37, 700}, bf16}, {{37, 700}}},
                  [&](auto& in) { return std::vector<Tensor>{(f32(in[0]) + f32(in[1])) * in[2]}; });
  cc::optimize(g, "bf16_operands");
  EXPECT_EQ(count_nodes(g, OpCode::Cast), 0u) << g.dump();
  const auto* f = first(g, OpCode::Fused);
  ASSERT_NE(f, nullptr) << g.dump();
  EXPECT_EQ(f->inputs[0]->dtype, bf16);
  EXPECT_EQ(f->inputs[1]->dtype, bf16);
}

TEST(FusedKernel, MalformedProgramIsRejected) {
  auto x = cs::ir::Node::make(OpCode::Constant, cs::ir::NoAttrs{}, {});
  x->shape = {4};
  cs::ir::FusedAttrs a;
  a.shape = {4};
  cs::ir::FusedInstr ins;
  ins.op = static_cast<uint16_t>(OpCode::Exp);
  ins.nargs = 1;
  ins.args[0] = 1;  // register 1 is this instruction's own output
  a.code.push_back(ins);
  auto f = cs::ir::Node::make(OpCode::Fused, a, {x});
  try {
    cs::ir::op_info(OpCode::Fused).infer(*f);
    FAIL() << "expected an error";
  } catch (const cs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("reads register 1 before it is written"),
              std::string::npos)
        << e.what();
  }
  a.code[0].op = static_cast<uint16_t>(OpCode::Sum);
  a.code[0].args[0] = 0;
  auto g = cs::ir::Node::make(OpCode::Fused, a, {x});
  EXPECT_THROW(cs::ir::op_info(OpCode::Fused).infer(*g), cs::Error);
}

namespace {

// Trains with `fused` (compiled at its first call, fusion on) and `plain` (compiled with
// CSTORCH_FUSION=0) on the same random batches of shape `x_shape` and labels i % classes, for
// `steps` steps: every loss, then every parameter (p1 of fused, p2 of plain) is bitwise equal.
template <class F, class P>
void expect_training_bitwise(F fused_body, P plain_body, const cs::Shape& x_shape, int64_t classes,
                             int steps, const std::vector<Tensor>& p1,
                             const std::vector<Tensor>& p2) {
  auto fused = cs::trace(fused_body);
  auto plain = cs::trace(plain_body);
  std::vector<int64_t> labels(static_cast<size_t>(x_shape[0]));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i) % classes;
  Tensor y = cs::from_vector(labels, {x_shape[0]});
  for (int i = 0; i < steps; ++i) {
    Tensor x = cs::randn(x_shape);
    Tensor lf = fused(x, y);  // compiled at the first call: fusion on
    setenv("CSTORCH_FUSION", "0", 1);
    Tensor lp = plain(x, y);  // compiled here: fusion off
    unsetenv("CSTORCH_FUSION");
    EXPECT_EQ(lf.item<float>(), lp.item<float>()) << "step " << i;
  }
  for (size_t i = 0; i < p1.size(); ++i)
    EXPECT_EQ(p1[i].to_vector<float>(), p2[i].to_vector<float>()) << "param " << i;
}

}  // namespace

TEST(FusedKernel, TracedAdamWStepsAreBitwiseEqualWithFusionOnAndOff) {
  // A whole training step (layer norm, gelu, cross entropy, AdamW updating its state in place)
  // compiled with and without fusion: losses and parameters stay bitwise equal.
  auto make = [] {
    cs::manual_seed(5);
    return cs::nn::Sequential(cs::nn::Linear(12, 32), cs::nn::LayerNorm(std::vector<int64_t>{32}),
                              cs::nn::GELU("tanh"), cs::nn::Linear(32, 5));
  };
  auto m1 = make();
  auto m2 = make();
  cs::optim::AdamW o1(m1->parameters(), 1e-2);
  cs::optim::AdamW o2(m2->parameters(), 1e-2);
  auto body = [](cs::nn::Sequential& m, cs::optim::Optimizer& o, const Tensor& x, const Tensor& y) {
    auto loss = cs::cross_entropy(m(x), y);
    loss.backward();
    o.step();
    o.zero_grad();
    return loss;
  };
  cs::manual_seed(11);
  expect_training_bitwise([&](const Tensor& x, const Tensor& y) { return body(m1, o1, x, y); },
                          [&](const Tensor& x, const Tensor& y) { return body(m2, o2, x, y); },
                          {8, 12}, 5, 4, m1->parameters(), m2->parameters());
}

namespace {

cs::nn::Sequential fc_net() {
  cs::manual_seed(3);
  return cs::nn::Sequential(cs::nn::Linear(40, 24), cs::nn::ReLU(), cs::nn::Linear(24, 24),
                            cs::nn::ReLU(), cs::nn::Linear(24, 10));
}
Tensor fc_step(cs::nn::Sequential& m, cs::optim::Optimizer& o, const Tensor& x, const Tensor& y) {
  auto loss = cs::cross_entropy(m(x), y);
  loss.backward();
  o.step();
  o.zero_grad();
  return loss;
}

// An FC network trained with SGD + momentum, traced twice: with fusion on (relu into the linear
// GEMMs, relu's gradient into an input-gradient GEMM, the momentum update or the weight decay
// into the weight-gradient GEMMs) and off.
// Losses and parameters must stay bitwise equal.
void expect_fc_sgd_bitwise(double weight_decay) {
  auto m1 = fc_net();
  auto m2 = fc_net();
  cs::optim::SGD o1(m1->parameters(), 0.05, 0.9, 0.0, weight_decay);
  cs::optim::SGD o2(m2->parameters(), 0.05, 0.9, 0.0, weight_decay);
  cs::manual_seed(12);
  expect_training_bitwise([&](const Tensor& x, const Tensor& y) { return fc_step(m1, o1, x, y); },
                          [&](const Tensor& x, const Tensor& y) { return fc_step(m2, o2, x, y); },
                          {32, 40}, 10, 6, m1->parameters(), m2->parameters());
}

}  // namespace

TEST(GemmEpilogue, ReluReluGradMomentumAndUpdateJoinTheProductsInPlace) {
  if (!cs::cpu::kernels().own_gemm_applies(32, 24, 40, true))
    GTEST_SKIP() << "no own GEMM in this variant (no AVX-512): products run on OpenBLAS, "
                    "epilogues are not fused";
  auto m = fc_net();
  cs::optim::SGD opt(m->parameters(), 0.05, 0.9);
  cc::Graph g = cs::testing::record_step({32, 40}, [&](const Tensor& x) {
    return fc_step(m, opt, x, cs::from_vector(std::vector<int64_t>(32, 1), {32}));
  });
  cc::optimize(g, "gemm_epilogue");
  size_t relu = 0, addend = 0, relu_grad = 0, update = 0;
  for (auto& n : g.nodes) {
    if (n->op != OpCode::Gemm) continue;
    relu += n->attr<cs::ir::GemmAttrs>().relu;
    addend += n->attr<cs::ir::GemmAttrs>().addend;
    relu_grad += n->attr<cs::ir::GemmAttrs>().relu_grad;
    update += n->attr<cs::ir::GemmAttrs>().update;
  }
  // Each weight's update p + m * (-lr) is written by its momentum GEMM (After nodes hold the new
  // values); the biases' updates stay addcmuls.
  EXPECT_EQ(update, 3u) << g.dump();
  EXPECT_EQ(count_nodes(g, OpCode::After), 3u) << g.dump();
  EXPECT_EQ(count_nodes(g, OpCode::Addcmul), 6u) << g.dump();  // 3 bias momenta + 3 bias updates
  // Both hidden layers' input gradients carry the relu mask (the classifier's too, K = 10: the
  // own GEMM takes every K).
  EXPECT_EQ(relu_grad, 2u) << g.dump();
  EXPECT_EQ(count_nodes(g, OpCode::ReluGrad), 0u) << g.dump();
  EXPECT_EQ(relu, 2u) << g.dump();    // both hidden layers
  EXPECT_EQ(addend, 3u) << g.dump();  // each weight's momentum (the biases' grads are sums)
  // The classifier's 10 x 24 weight gradient is fused as well.
  EXPECT_EQ(count_nodes(g, OpCode::Relu), 0u) << g.dump();
  cc::Program p(std::move(g), cs::Device{}, {});
  EXPECT_EQ(p.stats().inplace_state_writes, 12u) << p.summary();  // 6 params + 6 buffers
  EXPECT_EQ(p.stats().copied_state_writes, 0u) << p.summary();
}

TEST(GemmEpilogue, FcSgdMomentumStepsAreBitwiseEqualWithFusionOnAndOff) {
  expect_fc_sgd_bitwise(0.0);
}

TEST(GemmEpilogue, WeightDecayJoinsTheProductAndStaysBitwiseEqual) {
  // grad + p * weight_decay: the addend is a parameter still read afterwards (not in place).
  expect_fc_sgd_bitwise(1e-2);
}

// ---- gelu's gradient applied by its input-gradient product (GemmAttrs::gelu_grad) ------------

namespace {

// Two gelu layers, the tanh form and the erf form.
cs::nn::Sequential gelu_net() {
  cs::manual_seed(6);
  return cs::nn::Sequential(cs::nn::Linear(12, 32), cs::nn::GELU("tanh"), cs::nn::Linear(32, 32),
                            cs::nn::GELU(), cs::nn::Linear(32, 5));
}
// One optimizer step, the forward under bf16 autocast when `bf16`. With `tokens`, the batch goes
// through the net reshaped to it ([batch, tokens, features], a transformer MLP's layout: the
// input gradients come back through reshapes) and the logits come back flattened to one row per
// label.
Tensor net_step(cs::nn::Sequential& m, cs::optim::Optimizer& o, const Tensor& x, const Tensor& y,
                const cs::Shape& tokens, bool bf16) {
  Tensor logits;
  {
    std::optional<cs::amp::autocast> ac;
    if (bf16) ac.emplace(cs::DType::bf16);
    logits = m(tokens.empty() ? x : x.reshape(tokens));
  }
  if (!tokens.empty()) logits = logits.reshape({y.numel(), logits.shape().back()});
  auto loss = cs::cross_entropy(logits, y);
  loss.backward();
  o.step();
  o.zero_grad();
  return loss;
}

}  // namespace

TEST(GemmEpilogue, GeluGradientsJoinTheirInputGradientProducts) {
  if (!cs::cpu::kernels().own_gemm_applies(24, 32, 32, false))
    GTEST_SKIP() << "no own GEMM in this variant (no AVX-512): products run on OpenBLAS, "
                    "epilogues are not fused";
  for (const cs::Shape& tokens : {cs::Shape{}, cs::Shape{4, 6, 12}}) {
    SCOPED_TRACE(tokens.empty() ? "rows" : "tokens");
    auto m = gelu_net();
    cs::optim::AdamW opt(m->parameters(), 1e-2);
    const Tensor y = cs::from_vector(std::vector<int64_t>(24, 1), {24});
    cc::Graph g = cs::testing::record_step(
        {24, 12}, [&](const Tensor& x) { return net_step(m, opt, x, y, tokens, false); });
    cc::optimize(g, "gemm_epilogue");
    size_t fused = 0, tanh_form = 0;
    for (auto& n : g.nodes) {
      if (n->op != OpCode::Gemm || !n->attr<cs::ir::GemmAttrs>().gelu_grad) continue;
      ++fused;
      tanh_form += n->attr<cs::ir::GemmAttrs>().gelu_tanh;
      // With tokens the product keeps the incoming gradient's leading dims.
      EXPECT_EQ(n->shape, n->inputs[2]->shape) << g.dump();
      EXPECT_EQ(n->inputs[0]->shape.size(), tokens.empty() ? 2u : 3u) << g.dump();
    }
    EXPECT_EQ(fused, 2u) << g.dump();
    EXPECT_EQ(tanh_form, 1u) << g.dump();
    EXPECT_EQ(count_nodes(g, OpCode::GeluGrad), 0u) << g.dump();
  }
}

TEST(GemmEpilogue, GeluStepsAreBitwiseEqualWithFusionOnAndOff) {
  for (const cs::Shape& tokens : {cs::Shape{}, cs::Shape{4, 6, 12}}) {
    SCOPED_TRACE(tokens.empty() ? "rows" : "tokens");
    auto m1 = gelu_net();
    auto m2 = gelu_net();
    cs::optim::AdamW o1(m1->parameters(), 1e-2);
    cs::optim::AdamW o2(m2->parameters(), 1e-2);
    cs::manual_seed(13);
    expect_training_bitwise(
        [&](const Tensor& x, const Tensor& y) { return net_step(m1, o1, x, y, tokens, false); },
        [&](const Tensor& x, const Tensor& y) { return net_step(m2, o2, x, y, tokens, false); },
        {24, 12}, 5, 5, m1->parameters(), m2->parameters());
  }
}

// ---- a bf16 product's cast to f32 stored by the product (MatmulAttrs::f32_out) ---------------

namespace {

cs::nn::Sequential autocast_net() {
  cs::manual_seed(4);
  return cs::nn::Sequential(cs::nn::Linear(40, 48), cs::nn::GELU(), cs::nn::Linear(48, 10));
}
// One step under bf16 autocast (net_step).
Tensor autocast_step(cs::nn::Sequential& m, cs::optim::Optimizer& o, const Tensor& x,
                     const Tensor& y, const cs::Shape& tokens = {}) {
  return net_step(m, o, x, y, tokens, true);
}

// Casts a graph computes: Cast nodes, and Fused programs that end in one (stored as bf16).
// The cached state casts keep this number: each replaces a cast of a state's old value by one
// of its new value.
size_t casts(const cc::Graph& g) {
  size_t c = count_nodes(g, OpCode::Cast);
  for (auto& n : g.nodes)
    if (n->op == OpCode::Fused && n->attr<cs::ir::FusedAttrs>().out == cs::DType::bf16) ++c;
  return c;
}

// The step recorded and optimized, and how many casts it had before optimizing.
struct Optimized {
  cc::Graph g;
  size_t casts_before = 0;
};
template <class F>
Optimized optimized_step(const cs::Shape& shape, F body, const char* what) {
  Optimized o;
  o.casts_before = count_nodes(cs::testing::record_step(shape, body), OpCode::Cast);
  o.g = cs::testing::record_step(shape, body);
  cc::optimize(o.g, what);
  return o;
}

// Two copies of a net train 5 AdamW steps under bf16 autocast (batches of x_shape, reshaped to
// `tokens` when given), one compiled with fusion and the casts folded, one without: losses and
// parameters stay bitwise equal.
void expect_autocast_steps_bitwise(cs::nn::Sequential (*make)(), const cs::Shape& x_shape,
                                   const cs::Shape& tokens, uint64_t seed) {
  auto m1 = make();
  auto m2 = make();
  cs::optim::AdamW o1(m1->parameters(), 1e-2);
  cs::optim::AdamW o2(m2->parameters(), 1e-2);
  cs::manual_seed(seed);
  expect_training_bitwise(
      [&](const Tensor& x, const Tensor& y) { return autocast_step(m1, o1, x, y, tokens); },
      [&](const Tensor& x, const Tensor& y) { return autocast_step(m2, o2, x, y, tokens); },
      x_shape, 10, 5, m1->parameters(), m2->parameters());
}

}  // namespace

// Every reader of `v` is a Fused program.
bool read_by_fused_only(const cc::Graph& g, const cs::ir::Node* v) {
  size_t readers = 0;
  for (auto& n : g.nodes)
    for (auto& in : n->inputs)
      if (in.get() == v) {
        if (n->op != OpCode::Fused) return false;
        ++readers;
      }
  return readers > 0;
}

TEST(GemmEpilogue, Bf16WeightGradientsReachTheirUpdatesWithoutACast) {
  // Epilogue fusion stores each weight gradient's cast to f32 in its bf16 product
  // (MatmulAttrs::f32_out); as AdamW's Fused updates are its only readers, and the CPU's Fused
  // kernel widens bf16 itself, the fused_bf16_operands pass then stores the product as bf16.
  auto m = autocast_net();
  cs::optim::AdamW opt(m->parameters(), 1e-2);
  auto body = [&](const Tensor& x) {
    return autocast_step(m, opt, x, cs::from_vector(std::vector<int64_t>(16, 1), {16}));
  };
  auto [g, casts_before] = optimized_step({16, 40}, body, "bf16_products");
  size_t f32_out = 0, narrowed = 0;
  for (auto& n : g.nodes) {
    if (n->op != OpCode::Matmul || n->inputs[0]->dtype != cs::DType::bf16) continue;
    f32_out += n->attr<cs::ir::MatmulAttrs>().f32_out;
    if (n->dtype == cs::DType::bf16 && read_by_fused_only(g, n.get())) ++narrowed;
  }
  // Both weights' gradients: bf16 products, cast back to the f32 master weights' dtype by the
  // updates that read them.
  EXPECT_EQ(f32_out, 0u) << g.dump();
  EXPECT_EQ(narrowed, 2u) << g.dump();
  EXPECT_EQ(casts(g), casts_before - 2) << g.dump();
  // Without the last pass, the same products are stored as f32 by themselves.
  auto g2 = cs::testing::record_step({16, 40}, body);
  std::unique_ptr<cc::Pass> before[] = {
      cc::make_dce_pass(), cc::make_cse_pass(), cc::make_cache_state_casts_pass(),
      cc::make_fuse_gemm_epilogue_pass(), cc::make_fuse_elementwise_pass()};
  for (auto& p : before) p->run(g2);
  f32_out = 0;
  for (auto& n : g2.nodes)
    if (n->op == OpCode::Matmul && n->attr<cs::ir::MatmulAttrs>().f32_out) {
      EXPECT_EQ(n->dtype, cs::DType::f32);
      EXPECT_TRUE(read_by_fused_only(g2, n.get())) << g2.dump();
      ++f32_out;
    }
  EXPECT_EQ(f32_out, 2u) << g2.dump();
  EXPECT_TRUE(cc::make_fused_bf16_operands_pass()->run(g2));
  cc::verify(g2, "fused_bf16_operands");
  EXPECT_FALSE(cc::make_fused_bf16_operands_pass()->run(g2));  // nothing left to narrow
}

TEST(GemmEpilogue, Bf16AutocastStepsAreBitwiseEqualWithTheCastsFoldedAndNot) {
  expect_autocast_steps_bitwise(autocast_net, {16, 40}, {}, 13);
}

// Through a reshape: a Linear on [batch, tokens, features] multiplies the rows flattened, so its
// input gradient is reshape(matmul) in bf16, cast to f32 for the layer norm's backward.
namespace {

cs::nn::Sequential autocast_token_net() {
  cs::manual_seed(6);
  return cs::nn::Sequential(cs::nn::Linear(40, 48), cs::nn::LayerNorm(std::vector<int64_t>{48}),
                            cs::nn::Linear(48, 10));
}

// One AdamW step of the token net under bf16 autocast, recorded and optimized (the graph keeps
// the net's and the optimizer's tensors alive).
Optimized optimized_token_step(const char* what) {
  auto m = autocast_token_net();
  cs::optim::AdamW opt(m->parameters(), 1e-2);
  auto body = [&](const Tensor& x) {
    return autocast_step(m, opt, x, cs::from_vector(std::vector<int64_t>(32, 1), {32}), {4, 8, 40});
  };
  return optimized_step({32, 40}, body, what);
}

}  // namespace

TEST(GemmEpilogue, Bf16InputGradientsThroughAReshapeAreStoredAsF32ByTheirProducts) {
  auto [g, casts_before] = optimized_token_step("f32_out_reshape");
  size_t f32_out = 0, through = 0, narrowed = 0;
  for (auto& n : g.nodes) {
    if (n->op == OpCode::Matmul && n->attr<cs::ir::MatmulAttrs>().f32_out) {
      EXPECT_EQ(n->dtype, cs::DType::f32);
      EXPECT_EQ(n->inputs[0]->dtype, cs::DType::bf16);
      ++f32_out;
    }
    if (n->op == OpCode::Matmul && n->dtype == cs::DType::bf16 &&
        n->inputs[0]->dtype == cs::DType::bf16 && read_by_fused_only(g, n.get()))
      ++narrowed;
    if (n->op == OpCode::Reshape && n->dtype == cs::DType::f32 &&
        n->inputs[0]->op == OpCode::Matmul && n->inputs[0]->attr<cs::ir::MatmulAttrs>().f32_out)
      ++through;
  }
  // The second Linear's input gradient (the first's input, the batch, has none) reaches the
  // layer norm's backward through the reshape to [4, 8, 48]: the norm's reductions read it, so
  // it stays stored as f32. The two weights' gradients, read by their updates alone, are bf16.
  EXPECT_EQ(f32_out, 1u) << g.dump();
  EXPECT_EQ(through, 1u) << g.dump();
  EXPECT_EQ(narrowed, 2u) << g.dump();
  EXPECT_EQ(casts(g), casts_before - 3) << g.dump();
}

TEST(GemmEpilogue, Bf16StepsOnTokensAreBitwiseEqualWithTheCastsFoldedAndNot) {
  expect_autocast_steps_bitwise(autocast_token_net, {32, 40}, {4, 8, 40}, 14);
}

// A head without bias (a language model's, tied to its embedding): under autocast its bf16
// logits are cast to f32 for the loss. The Linear and the cast become one product of the rows,
// Matmul{trans_b, f32_out}, read by the loss through a reshape: the logits are written once, as
// f32, and no cast runs. The loss's gradient, cast to bf16 for the head's products, is stored as
// bf16 by cross_entropy_grad itself.
namespace {

cs::nn::Sequential autocast_head_net() {
  cs::manual_seed(8);
  return cs::nn::Sequential(cs::nn::Linear(40, 48), cs::nn::LayerNorm(std::vector<int64_t>{48}),
                            cs::nn::Linear(48, 70, false));
}
// One AdamW step of the head net with the loss inside the autocast region (as GPT-2's): the
// bf16 logits, flattened to one row per token, are cast to f32 for the cross entropy.
Tensor autocast_head_step(cs::nn::Sequential& m, cs::optim::Optimizer& o, const Tensor& x,
                          const Tensor& y) {
  Tensor loss;
  {
    cs::amp::autocast ac(cs::DType::bf16);
    loss = cs::cross_entropy(m(x.reshape({4, 8, 40})).reshape({y.numel(), 70}), y);
  }
  loss.backward();
  o.step();
  o.zero_grad();
  return loss;
}

}  // namespace

TEST(GemmEpilogue, Bf16HeadWithoutBiasStoresItsLogitsAsF32) {
  auto m = autocast_head_net();
  cs::optim::AdamW opt(m->parameters(), 1e-2);
  // Labels computed from the batch (not constants, which would fold the loss's gradient away).
  auto body = [&](const Tensor& x) { return autocast_head_step(m, opt, x, cs::argmax(x, 1)); };
  auto [g, casts_before] = optimized_step({32, 40}, body, "bf16_head");
  size_t heads = 0, bf16_linears_cast = 0;
  for (auto& n : g.nodes) {
    if (n->op == OpCode::Matmul && n->attr<cs::ir::MatmulAttrs>().f32_out &&
        n->attr<cs::ir::MatmulAttrs>().trans_b) {
      EXPECT_EQ(n->shape, (cs::Shape{32, 70})) << g.dump();
      EXPECT_EQ(n->inputs[0]->op, OpCode::Reshape) << g.dump();  // the [4, 8, 48] rows
      EXPECT_EQ(n->inputs[0]->shape, (cs::Shape{32, 48})) << g.dump();
      ++heads;
    }
    // (The first Linear has a bias: its cast for the layer norm stays.)
    if (n->op == OpCode::Cast && n->inputs[0]->op == OpCode::Linear &&
        n->inputs[0]->inputs.size() == 2)
      ++bf16_linears_cast;
  }
  EXPECT_EQ(heads, 1u) << g.dump();
  EXPECT_EQ(bf16_linears_cast, 0u) << g.dump();
  // The head's cast, its gradient's cast back to bf16 (stored so by cross_entropy_grad), the
  // second Linear's input gradient's cast (through a reshape) and the two weight gradients'
  // casts (stored as bf16 for their updates) are gone.
  EXPECT_EQ(casts(g), casts_before - 5) << g.dump();
  size_t ce = 0;
  for (auto& n : g.nodes)
    if (n->op == OpCode::CrossEntropyGrad) {
      EXPECT_TRUE(n->attr<cs::ir::LossAttrs>().bf16_out) << g.dump();
      EXPECT_EQ(n->dtype, cs::DType::bf16) << g.dump();
      EXPECT_EQ(n->inputs[0]->dtype, cs::DType::f32) << g.dump();
      ++ce;
    }
  EXPECT_EQ(ce, 1u) << g.dump();
  // The loss reads the f32 logits.
  EXPECT_EQ(count_nodes(g, OpCode::LogSoftmax), 1u);
  for (auto& n : g.nodes)
    if (n->op == OpCode::LogSoftmax) {
      EXPECT_EQ(n->dtype, cs::DType::f32) << g.dump();
    }
  // A head with a bias keeps its Linear (the bias is added before the bf16 rounding).
  auto [g2, before2] = optimized_token_step("bf16_head_bias");
  for (auto& n : g2.nodes)
    EXPECT_FALSE(n->op == OpCode::Matmul && n->attr<cs::ir::MatmulAttrs>().trans_b &&
                 n->attr<cs::ir::MatmulAttrs>().f32_out)
        << g2.dump();
}

TEST(GemmEpilogue, Bf16StepsWithTheHeadsCastsFoldedAreBitwiseEqualToUnfused) {
  auto m1 = autocast_head_net();
  auto m2 = autocast_head_net();
  cs::optim::AdamW o1(m1->parameters(), 1e-2);
  cs::optim::AdamW o2(m2->parameters(), 1e-2);
  cs::manual_seed(15);
  expect_training_bitwise(
      [&](const Tensor& x, const Tensor& y) { return autocast_head_step(m1, o1, x, y); },
      [&](const Tensor& x, const Tensor& y) { return autocast_head_step(m2, o2, x, y); }, {32, 40},
      70, 5, m1->parameters(), m2->parameters());
}

// ---- one-pass groups of Fused nodes (Program::plan_groups, the hoist_scalars pass) ---------

namespace {

// A net whose first weight is large enough (259 x 300 = 77700 elements) for its optimizer's
// Fused updates to run as one pass; 77700 is no multiple of any block size, so every pass ends
// in a partial block.
cs::nn::Sequential wide_net() {
  cs::manual_seed(4);
  return cs::nn::Sequential(cs::nn::Linear(300, 259), cs::nn::GELU("tanh"), cs::nn::Linear(259, 5));
}
Tensor wide_step(cs::nn::Sequential& m, cs::optim::Optimizer& o, const Tensor& x, const Tensor& y) {
  auto loss = cs::cross_entropy(m(x), y);
  loss.backward();
  o.step();
  o.zero_grad();
  return loss;
}

// Every optimizer, with the options that give it the most state (torch's names and defaults).
const std::vector<std::pair<std::string, cs::Config>>& optimizer_configs() {
  static const std::vector<std::pair<std::string, cs::Config>> configs = {
      {"SGD", {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.1}}},
      {"Adam", {{"lr", 0.01}, {"amsgrad", true}}},
      {"AdamW", {{"lr", 0.01}}},
      {"Adadelta", cs::Config::object()},
      {"Adafactor", cs::Config::object()},
      {"Adagrad", {{"lr", 0.1}}},
      {"Adamax", cs::Config::object()},
      {"ASGD", {{"t0", 3}}},
      {"Lamb", cs::Config::object()},
      {"Lion", cs::Config::object()},
      {"NAdam", cs::Config::object()},
      {"RAdam", cs::Config::object()},
      {"RMSprop", {{"momentum", 0.5}, {"centered", true}}},
      {"Rprop", cs::Config::object()},
  };
  return configs;
}

// The wide net's step with its forward under bf16 autocast: the optimizer's step also keeps the
// large weight's bf16 copy, which joins its one-pass group.
Tensor wide_autocast_step(cs::nn::Sequential& m, cs::optim::Optimizer& o, const Tensor& x,
                          const Tensor& y) {
  Tensor loss;
  {
    cs::amp::autocast ac(cs::DType::bf16);
    loss = cs::cross_entropy(m(x), y);
  }
  loss.backward();
  o.step();
  o.zero_grad();
  return loss;
}

// Traces the step twice, the second compiled with CSTORCH_FUSED_GROUPS=0 (every node on its
// own): losses and parameters bitwise equal after `steps` steps.
void expect_groups_bitwise(const std::string& type, const cs::Config& args, int steps,
                           bool autocast = false) {
  auto m1 = wide_net();
  auto m2 = wide_net();
  auto o1 = cs::optim::configure_optimizer(type, m1->parameters(), args);
  auto o2 = cs::optim::configure_optimizer(type, m2->parameters(), args);
  auto step = autocast ? wide_autocast_step : wide_step;
  auto grouped = cs::trace([&](const Tensor& x, const Tensor& y) { return step(m1, *o1, x, y); });
  auto single = cs::trace([&](const Tensor& x, const Tensor& y) { return step(m2, *o2, x, y); });
  cs::manual_seed(13);
  Tensor y = cs::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2}, {8});
  for (int i = 0; i < steps; ++i) {
    Tensor x = cs::randn({8, 300});
    Tensor lg = grouped(x, y);
    setenv("CSTORCH_FUSED_GROUPS", "0", 1);
    Tensor ls = single(x, y);  // compiled here, at its first call: no groups
    unsetenv("CSTORCH_FUSED_GROUPS");
    EXPECT_EQ(lg.item<float>(), ls.item<float>()) << "step " << i;
  }
  const auto p1 = m1->parameters(), p2 = m2->parameters();
  for (size_t i = 0; i < p1.size(); ++i)
    EXPECT_EQ(p1[i].to_vector<float>(), p2[i].to_vector<float>()) << "param " << i;
}

// One recorded step of the wide net with optimizer `o`, optimized (`what` names the run);
// `step` is wide_step or wide_autocast_step.
cc::Graph wide_graph(cs::optim::Optimizer& o, cs::nn::Sequential& m, const char* what,
                     decltype(&wide_step) step = wide_step) {
  cc::Graph g = cs::testing::record_step({8, 300}, [&](const Tensor& x) {
    return step(m, o, x, cs::from_vector(std::vector<int64_t>(8, 1), {8}));
  });
  cc::optimize(g, what);
  return g;
}

// The program of one recorded step of the wide net with optimizer `o`.
cc::Program wide_program(cs::optim::Optimizer& o, cs::nn::Sequential& m) {
  return cc::Program(wide_graph(o, m, "groups"), cs::Device{}, {});
}

}  // namespace

TEST(FusedGroups, AdamWUpdatesOfALargeParameterRunAsOnePass) {
  // The bias corrections between the moments and the parameter update are hoisted, so the
  // three Fused updates of the 259 x 300 weight are neighbours and form one group; the small
  // parameters' updates (below 65536 elements) run one by one.
  auto m = wide_net();
  cs::optim::AdamW o(m->parameters(), 1e-3);
  cc::Program p = wide_program(o, m);
  EXPECT_EQ(p.stats().fused_groups, 1u) << p.summary();
  EXPECT_EQ(p.stats().fused_grouped, 3u) << p.summary();
  // Off by the setting: the same program without groups.
  auto m2 = wide_net();
  cs::optim::AdamW o2(m2->parameters(), 1e-3);
  setenv("CSTORCH_FUSED_GROUPS", "0", 1);
  cc::Program q = wide_program(o2, m2);
  unsetenv("CSTORCH_FUSED_GROUPS");
  EXPECT_EQ(q.stats().fused_groups, 0u) << q.summary();
}

TEST(FusedGroups, AdamWsUpdateProgramsRunAsStraightLinesInTheAvx512Kernels) {
  // The three Fused updates of the 259 x 300 weight are the programs the CPU kernel runs as
  // straight-line loops (fused.cpp) instead of interpreting them: a change to AdamW's ops that
  // moved them off those loops would be correct but slower, and fail here. Other variants
  // interpret them.
  auto m = wide_net();
  cs::optim::AdamW o(m->parameters(), 1e-3);
  const cc::Graph g = wide_graph(o, m, "groups");
  const auto& v = cs::cpu::kernels();
  std::vector<std::string> lines;
  for (auto& n : g.nodes)
    if (n->op == OpCode::Fused && n->numel() == 259 * 300) {
      const char* l = v.fused_line(*n);
      lines.push_back(l ? l : "interpreted");
    }
  std::sort(lines.begin(), lines.end());
  if (std::string(v.name) == "avx512")
    EXPECT_EQ(lines, (std::vector<std::string>{"adam_param", "moment1", "moment2"})) << g.dump();
  else
    EXPECT_EQ(lines, std::vector<std::string>(3, "interpreted")) << g.dump();
}

TEST(FusedGroups, HoistingScalarsKeepsEveryInputBeforeItsUser) {
  // verify() after the pass checks the order; here, that single-element nodes moved up and the
  // large nodes kept their relative order.
  auto m = wide_net();
  cs::optim::AdamW o(m->parameters(), 1e-3);
  cc::Graph g = wide_graph(o, m, "hoist");
  std::vector<const cs::ir::Node*> large_before;
  for (auto& n : g.nodes)
    if (!has_trait(n->op, cs::ir::kLeaf) && n->numel() > 1) large_before.push_back(n.get());
  EXPECT_FALSE(cc::make_hoist_scalars_pass()->run(g)) << "a second run moves nothing";
  cc::verify(g, "hoist_scalars");
  std::vector<const cs::ir::Node*> large_after;
  for (auto& n : g.nodes)
    if (!has_trait(n->op, cs::ir::kLeaf) && n->numel() > 1) large_after.push_back(n.get());
  EXPECT_EQ(large_before, large_after);
  // No large computed node lies between a single-element one and its last input.
  std::unordered_map<const cs::ir::Node*, size_t> pos;
  for (size_t i = 0; i < g.nodes.size(); ++i) pos[g.nodes[i].get()] = i;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const auto& n = *g.nodes[i];
    if (has_trait(n.op, cs::ir::kLeaf) || !has_trait(n.op, cs::ir::kElementwise) || n.numel() > 1)
      continue;
    size_t last = 0;
    for (auto& in : n.inputs) last = std::max(last, pos.at(in.get()));
    for (size_t k = last + 1; k < i; ++k) {
      if (has_trait(g.nodes[k]->op, cs::ir::kLeaf)) continue;
      EXPECT_LE(g.nodes[k]->numel(), 1) << "%" << n.id << " waits behind %" << g.nodes[k]->id;
    }
  }
}

TEST(FusedGroups, EveryOptimizersLargeUpdateRunsAsOnePass) {
  // The Fused nodes that update the 259 x 300 weight and its states, one group each. Single ops
  // that write a state (Adagrad's sum, amsgrad's maximum) are one-instruction programs so that
  // they can join; an arena result between two state writes (Adadelta's step) joins as well.
  // Not grouped: Adafactor's factored moments (row and column reductions) and Lion's sign (no
  // Fused instruction), which split its update in two.
  const std::map<std::string, size_t> grouped = {
      {"SGD", 2},     {"Adam", 4},   {"AdamW", 3},   {"Adadelta", 4}, {"Adafactor", 0},
      {"Adagrad", 2}, {"Adamax", 3}, {"ASGD", 2},    {"Lamb", 3},     {"Lion", 2},
      {"NAdam", 3},   {"RAdam", 3},  {"RMSprop", 4}, {"Rprop", 2}};
  for (const auto& [type, args] : optimizer_configs()) {
    SCOPED_TRACE(type);
    auto m = wide_net();
    auto o = cs::optim::configure_optimizer(type, m->parameters(), args);
    cc::Program p = wide_program(*o, m);
    EXPECT_EQ(p.stats().fused_groups, grouped.at(type) ? 1u : 0u) << p.summary();
    EXPECT_EQ(p.stats().fused_grouped, grouped.at(type)) << p.summary();
  }
}

TEST(FusedGroups, OptimizerStepsAreBitwiseEqualWithGroupsOnAndOff) {
  for (const auto& [type, args] : optimizer_configs()) {
    SCOPED_TRACE(type);
    expect_groups_bitwise(type, args, 4);
  }
}

TEST(FusedGroups, AutocastAdamWsGroupWithItsBf16CopyIsBitwiseTheNodesOneByOne) {
  // Under autocast AdamW's group of the large weight has four members (both moments, the
  // parameter and its bf16 copy, the gradient a bf16 stream): bitwise the nodes one by one,
  // ragged end included.
  auto m = wide_net();
  cs::optim::AdamW o(m->parameters(), 1e-3);
  cc::Program p(wide_graph(o, m, "groups", wide_autocast_step), cs::Device{}, {});
  EXPECT_EQ(p.stats().fused_groups, 1u) << p.summary();
  EXPECT_EQ(p.stats().fused_grouped, 4u) << p.summary();
  expect_groups_bitwise("AdamW", {{"lr", 0.01}}, 4, /*autocast=*/true);
}

TEST(FusedGroups, InterleavingNeedsWrittenBuffersReadOnlyElementForElement) {
  float a[64], b[64];
  using A = cc::GroupAccess;
  auto safe = [](std::vector<A> v) { return cc::interleave_safe(v.data(), v.size()); };
  // AdamW's shape: each state written in place and read as the same bytes.
  EXPECT_TRUE(safe({{a, 256, true, true}, {a, 256, false, true}, {b, 256, false, true}}));
  EXPECT_TRUE(safe({{a, 256, true, true}, {b, 256, true, true}, {a, 256, false, true}}));
  // A written buffer read at an offset, as a shorter piece, or as another dtype; two members
  // writing overlapping bytes.
  EXPECT_FALSE(safe({{a, 256, true, true}, {a + 1, 252, false, true}}));
  EXPECT_FALSE(safe({{a, 256, true, true}, {a, 128, false, true}}));
  EXPECT_FALSE(safe({{a, 256, true, true}, {a, 256, false, false}}));
  EXPECT_FALSE(safe({{a, 256, true, true}, {a + 32, 128, true, true}}));
  // Reads that overlap each other but no write are fine.
  EXPECT_TRUE(safe({{a, 256, true, true}, {b, 256, false, true}, {b + 1, 4, false, true}}));
}

// ---- cached state casts (passes/cache_state_casts.cpp) --------------------------------------

TEST(FusedKernel, Bf16StoreRoundsAsTheCastKernel) {
  // A chain ending in a cast to bf16 becomes one Fused program stored as bf16: bitwise the
  // unfused chain and Cast kernel, NaNs included (log of the negative inputs).
  expect_bitwise_equal(
      {{{1000}}, {{1000}}},
      [](auto& in) {
        return std::vector<Tensor>{(cs::log(in[0]) * in[1] + 0.5).to(cs::DType::bf16)};
      },
      1);
}

namespace {

// The state slots the compiler added as copies of others.
std::vector<const cc::StateSlot*> cached_casts(const cc::Graph& g) {
  std::vector<const cc::StateSlot*> r;
  for (auto& s : g.state)
    if (s.cast_of >= 0) r.push_back(&s);
  return r;
}

}  // namespace

TEST(CachedStateCasts, AutocastWeightsAreKeptAsBf16StateWrittenAfterTheirUpdate) {
  const cc::Graph g = optimized_token_step("cached_casts").g;
  // Both Linears' weights and biases (the layer norm computes in f32).
  const auto copies = cached_casts(g);
  ASSERT_EQ(copies.size(), 4u) << g.dump();
  for (const auto* c : copies) {
    const cc::StateSlot& src = g.state[static_cast<size_t>(c->cast_of)];
    EXPECT_EQ(c->dtype, cs::DType::bf16);
    EXPECT_EQ(c->shape, src.shape);
    ASSERT_TRUE(c->refresh && c->write && c->input);
    EXPECT_EQ(c->refresh->op, OpCode::Cast);
    EXPECT_EQ(c->refresh->inputs[0], src.input);  // recomputed from the state's current value
    EXPECT_EQ(c->write->inputs[0], src.write);    // written from its new value
  }
  // No cast of a source's old value is left in the step.
  for (auto& n : g.nodes)
    for (const auto* c : copies)
      EXPECT_FALSE(n->op == OpCode::Cast &&
                   n->inputs[0] == g.state[static_cast<size_t>(c->cast_of)].input)
          << g.dump();
}

TEST(CachedStateCasts, ALargeWeightsCopyIsWrittenInItsUpdatesOnePass) {
  // The 259 x 300 weight's bf16 copy is stored by a Fused program that joins AdamW's group:
  // first moment, second moment, parameter, copy.
  auto m = wide_net();
  cs::optim::AdamW o(m->parameters(), 1e-3);
  cc::Graph g = cs::testing::record_step({8, 300}, [&](const Tensor& x) {
    return autocast_step(m, o, x, cs::from_vector(std::vector<int64_t>(8, 1), {8}));
  });
  cc::optimize(g, "cached_group");
  const cc::StateSlot* big = nullptr;
  for (const auto* c : cached_casts(g))
    if (cs::numel(c->shape) == 259 * 300) big = c;
  ASSERT_NE(big, nullptr) << g.dump();
  ASSERT_EQ(big->write->op, OpCode::Fused) << g.dump();
  EXPECT_EQ(big->write->attr<cs::ir::FusedAttrs>().out, cs::DType::bf16);
  cc::Program p(std::move(g), cs::Device{}, {});
  EXPECT_EQ(p.stats().fused_groups, 1u) << p.summary();
  EXPECT_EQ(p.stats().fused_grouped, 4u) << p.summary();
}

TEST(CachedStateCasts, StepsStayBitwiseWhenWeightsAreWrittenBetweenThem) {
  // Two copies of the wide net train under bf16 autocast, one compiled with the cached casts
  // (fusion on), one without. Between steps the weights are written outside the step (an eager
  // in-place op, a copy in, another traced step, a state_dict load): the cached copies must be
  // computed again from the new values, so losses and parameters stay bitwise equal.
  auto m1 = wide_net();
  auto m2 = wide_net();
  cs::optim::AdamW o1(m1->parameters(), 1e-2);
  cs::optim::AdamW o2(m2->parameters(), 1e-2);
  auto cached =
      cs::trace([&](const Tensor& x, const Tensor& y) { return autocast_step(m1, o1, x, y); });
  auto plain =
      cs::trace([&](const Tensor& x, const Tensor& y) { return autocast_step(m2, o2, x, y); });
  std::vector<std::vector<float>> initial;
  for (auto& p : m1->parameters()) initial.push_back(p.to_vector<float>());
  // A second program that writes the first weight: its execution must count as a write.
  auto shrink = [](cs::nn::Sequential& m) {
    return cs::trace([&m](const Tensor& s) {
      cs::NoGradGuard ng;
      m->parameters()[0].mul_(s);
      return s * 2.0;
    });
  };
  auto shrink1 = shrink(m1), shrink2 = shrink(m2);
  Tensor y = cs::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2}, {8});
  cs::manual_seed(21);
  auto write_both = [&](int step) {
    cs::NoGradGuard ng;
    auto p1 = m1->parameters(), p2 = m2->parameters();
    if (step == 2) {
      p1[0].mul_(0.5);
      p2[0].mul_(0.5);
    } else if (step == 4) {
      p1[0].copy_(cs::from_vector(initial[0], p1[0].shape()));
      p2[0].copy_(cs::from_vector(initial[0], p2[0].shape()));
    } else if (step == 5) {
      shrink1(cs::scalar_tensor(0.75)).item<float>();
      shrink2(cs::scalar_tensor(0.75)).item<float>();
    } else if (step == 6) {
      // New tensors, which load_state_dict copies in.
      auto scaled = [](const cs::nn::StateDict& d) {
        cs::nn::StateDict r;
        for (auto& [k, t] : d) r.insert(k, t * 0.25);
        return r;
      };
      m1->load_state_dict(scaled(m1->state_dict()));
      m2->load_state_dict(scaled(m2->state_dict()));
    }
  };
  for (int i = 0; i < 8; ++i) {
    write_both(i);
    Tensor x = cs::randn({8, 300});
    Tensor lc = cached(x, y);  // compiled at its first call: fusion on
    setenv("CSTORCH_FUSION", "0", 1);
    Tensor lp = plain(x, y);  // compiled here: fusion off, no cached casts
    unsetenv("CSTORCH_FUSION");
    EXPECT_EQ(lc.item<float>(), lp.item<float>()) << "step " << i;
  }
  const auto p1 = m1->parameters(), p2 = m2->parameters();
  for (size_t i = 0; i < p1.size(); ++i)
    EXPECT_EQ(p1[i].to_vector<float>(), p2[i].to_vector<float>()) << "param " << i;
}
