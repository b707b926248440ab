// Each compiler pass on small graphs: node counts before and after, and values unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>

#include <cstorch/cstorch.h>

#include "compiler/graph.h"
#include "compiler/program.h"
#include "runtime/trace_context.h"
#include "unit/compiler/record_step.h"

namespace cs = cstorch;
using cs::Tensor;
namespace cc = cstorch::compiler;
using cs::testing::count_nodes;

namespace {
// Records `body` on f32 placeholders of the given shapes (cs::testing::record).
template <class F>
cc::Graph record(const std::vector<cs::Shape>& shapes, F body) {
  std::vector<cs::testing::RecordInput> ins;
  for (auto& s : shapes) ins.push_back({s});
  return cs::testing::record(ins, body);
}
}  // namespace

TEST(Passes, DceRemovesUnusedNodes) {
  auto g = record({{4}}, [](auto& in) {
    auto unused = cs::exp(in[0]) * 3.0;
    (void)unused;
    return std::vector<Tensor>{in[0] + 1.0};
  });
  size_t before = g.count_ops();
  EXPECT_TRUE(cc::make_dce_pass()->run(g));
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Exp), 0u);
  EXPECT_LT(g.count_ops(), before);
  cc::verify(g, "test");
}

TEST(Passes, CseMergesStructurallyEqualNodes) {
  auto g = record({{4}}, [](auto& in) {
    auto a = cs::exp(in[0]) + in[0];
    auto b = cs::exp(in[0]) + in[0];
    return std::vector<Tensor>{a * b};
  });
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Exp), 2u);
  EXPECT_TRUE(cc::make_cse_pass()->run(g));
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Exp), 1u);
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Add), 1u);
  cc::verify(g, "test");
}

TEST(Passes, CseNeverMergesRandomDraws) {
  auto g = record(
      {{4}}, [](auto& in) { return std::vector<Tensor>{cs::rand({4}) + cs::rand({4}) + in[0]}; });
  cc::make_cse_pass()->run(g);
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::RandUniform), 2u);
}

TEST(Passes, ConstantFoldingEvaluatesConstantSubgraphs) {
  auto g = record({{3}}, [](auto& in) {
    auto c = cs::exp(cs::full({3}, 0.0)) * 2.0;  // = 2, known at compile time
    return std::vector<Tensor>{in[0] * c};
  });
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Exp), 1u);
  EXPECT_TRUE(cc::make_constant_fold_pass()->run(g));
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Exp), 0u);
  EXPECT_EQ(g.count_ops(), 1u);  // only the multiply by the folded constant is left
  cc::verify(g, "test");
}

TEST(Passes, TransposesFoldIntoGemmFlags) {
  auto g = record({{5, 3}, {4, 5}}, [](auto& in) {
    return std::vector<Tensor>{cs::matmul(in[0].t(), in[1].t())};  // [3,5] @ [5,4]
  });
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Permute), 2u);
  EXPECT_TRUE(cc::make_simplify_pass()->run(g));
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Permute), 0u);
  for (auto& n : g.nodes)
    if (n->op == cs::ir::OpCode::Matmul) {
      EXPECT_TRUE(n->attr<cs::ir::MatmulAttrs>().trans_a);
      EXPECT_TRUE(n->attr<cs::ir::MatmulAttrs>().trans_b);
    }
  cc::verify(g, "test");
  // And the folded program computes the same values.
  Tensor a = cs::randn({5, 3}), b = cs::randn({4, 5});
  auto expect = cs::matmul(a.t(), b.t()).to_vector<float>();
  cc::Program p(std::move(g), cs::Device{}, {});
  std::vector<float> out(12);
  const void* ins[] = {a.data_ptr(), b.data_ptr()};
  void* outs[] = {out.data()};
  p.run(ins, outs);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], expect[i], 1e-5);
}

TEST(Passes, SimplifyRemovesIdentityPermutesAndReshapes) {
  auto g = record({{2, 3}}, [](auto& in) {
    auto x = in[0].t().t().reshape({6}).reshape({2, 3});
    return std::vector<Tensor>{x * 2.0};
  });
  std::string before = g.dump();
  cc::make_constant_fold_pass()->run(g);  // the scalar 2.0 becomes a constant
  cc::make_simplify_pass()->run(g);
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Permute), 0u) << before << "\n" << g.dump();
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Reshape), 0u) << before << "\n" << g.dump();
  EXPECT_EQ(g.count_ops(), 1u);
}

TEST(Passes, VerifierRejectsABrokenGraph) {
  auto g = record({{2}}, [](auto& in) { return std::vector<Tensor>{cs::exp(in[0])}; });
  std::swap(g.nodes.front(), g.nodes.back());  // use before definition
  EXPECT_THROW(cc::verify(g, "test"), cs::Error);
}

TEST(MemoryPlan, ArenaReusesMemoryAndStateUpdatesInPlace) {
  cs::manual_seed(1);
  cs::nn::Sequential m(cs::nn::Linear(32, 64), cs::nn::ReLU(), cs::nn::Linear(64, 64),
                       cs::nn::ReLU(), cs::nn::Linear(64, 64), cs::nn::ReLU(),
                       cs::nn::Linear(64, 10));
  cs::optim::SGD opt(m->parameters(), 0.01, 0.9);
  cc::Graph g = cs::testing::record_step({16, 32}, [&](const Tensor& x) {
    auto loss = cs::cross_entropy(m(x), cs::from_vector(std::vector<int64_t>(16, 3), {16}));
    loss.backward();
    opt.step();
    opt.zero_grad();
    return loss;
  });
  // The planner on the plain ops (fusion leaves fewer intermediates to reuse memory between;
  // tests/unit/compiler/test_fusion.cpp checks the fused step's in-place writes).
  setenv("CSTORCH_FUSION", "0", 1);
  cc::optimize(g, "test");
  unsetenv("CSTORCH_FUSION");
  cc::Program p(std::move(g), cs::Device{}, {});
  EXPECT_GT(p.stats().naive_bytes, 0u);
  EXPECT_LT(p.stats().arena_bytes * 4, p.stats().naive_bytes * 3) << p.summary();  // reuse
  EXPECT_EQ(p.stats().inplace_state_writes, 16u) << p.summary();  // 8 params + 8 momentum buffers
  EXPECT_EQ(p.stats().copied_state_writes, 0u) << p.summary();
}

TEST(Passes, GraphDumpsWhenTheSettingIsOn) {
  auto dir = std::filesystem::temp_directory_path() / "cstorch_dump_test";
  std::filesystem::remove_all(dir);
  setenv("CSTORCH_DUMP_GRAPHS", dir.c_str(), 1);
  auto step = cs::trace([](const Tensor& x) { return cs::exp(x) * 2.0; }, "dumped");
  step(cs::ones({3}));
  cs::synchronize();
  unsetenv("CSTORCH_DUMP_GRAPHS");
  EXPECT_TRUE(std::filesystem::exists(dir / "dumped-00-traced.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir / "dumped-00-traced.dot"));
  // One text and one Graphviz file after every pass of the pipeline.
  std::set<std::string> passes;
  size_t txt = 0, dot = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    auto name = e.path().stem().string();  // dumped-NN-<pass>
    passes.insert(name.substr(name.rfind('-') + 1));
    (e.path().extension() == ".txt" ? txt : dot)++;
  }
  EXPECT_EQ(txt, dot);
  for (const char* p : {"traced", "dce", "cse", "constant_fold", "simplify"})
    EXPECT_TRUE(passes.count(p)) << p;
}

TEST(Passes, SumOfZeroPaddedCatsBecomesOneCat) {
  // The gradients of slices of one tensor: each is the slice's gradient padded with zeros.
  auto g = record({{2, 2}, {2, 1}, {2, 3}}, [](auto& in) {
    auto a = cs::cat({in[0], cs::zeros({2, 4})}, 1);
    auto b = cs::cat({cs::zeros({2, 3}), in[1], cs::zeros({2, 2})}, 1);
    auto c = cs::cat({cs::zeros({2, 2}), in[2], cs::zeros({2, 1})}, 1);  // overlaps b: a sum
    return std::vector<Tensor>{a + b, (a + b) + c};
  });
  EXPECT_TRUE(cc::make_simplify_pass()->run(g));
  cc::verify(g, "test");
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Add), 1u) << g.dump();
  // a + b = cat(in0, zeros[2, 1] (the gap), in1, zeros[2, 2]).
  const auto& ab = *g.outputs[0];
  ASSERT_EQ(ab.op, cs::ir::OpCode::Cat) << g.dump();
  ASSERT_EQ(ab.inputs.size(), 4u);
  EXPECT_EQ(ab.inputs[1]->op, cs::ir::OpCode::Full);
  EXPECT_EQ(ab.inputs[1]->shape, (cs::Shape{2, 1}));
  EXPECT_EQ(ab.inputs[2]->op, cs::ir::OpCode::Input);
  // Values: run the simplified program.
  cc::Program p(std::move(g), cs::Device{}, {});
  std::vector<float> x0{1, 2, 3, 4}, x1{5, 6}, x2{7, 8, 9, 10, 11, 12}, o0(12), o1(12);
  const void* b[] = {x0.data(), x1.data(), x2.data()};
  void* o[] = {o0.data(), o1.data()};
  p.run(b, o);
  EXPECT_EQ(o0, (std::vector<float>{1, 2, 0, 5, 0, 0, 3, 4, 0, 6, 0, 0}));
  EXPECT_EQ(o1, (std::vector<float>{1, 2, 7, 13, 9, 0, 3, 4, 10, 17, 12, 0}));
}

TEST(Passes, ScatterIntoZerosAddedToATensorScattersIntoIt) {
  // A tied embedding's gradient: index_add into zeros (the embedding's backward) plus the
  // head's gradient. Distinct indices (the sums are then exact) and a repeated one.
  const std::vector<int64_t> ids{4, 1, 4};
  auto g = record({{6, 3}, {3, 3}}, [&](auto& in) {
    auto idx = cs::from_vector(ids, {3});
    auto scatter = cs::index_add(cs::zeros({6, 3}), 0, idx, in[1]);
    return std::vector<Tensor>{in[0] + scatter, (scatter + in[0] * 2.f) - in[0]};
  });
  EXPECT_TRUE(cc::make_simplify_pass()->run(g));
  cc::verify(g, "test");
  EXPECT_EQ(count_nodes(g, cs::ir::OpCode::Add), 0u) << g.dump();
  // No zero fill of the full shape is left (the scalar 2 of the mul stays).
  for (const auto& n : g.nodes) EXPECT_FALSE(n->op == cs::ir::OpCode::Full && !n->shape.empty());
  ASSERT_EQ(g.outputs[0]->op, cs::ir::OpCode::IndexAdd) << g.dump();
  EXPECT_EQ(g.outputs[0]->inputs[0]->op, cs::ir::OpCode::Input);
  const auto& second = g.outputs[1]->inputs[0];  // (scatter + x * 2) - x
  ASSERT_EQ(second->op, cs::ir::OpCode::IndexAdd) << g.dump();
  EXPECT_EQ(second->inputs[0]->op, cs::ir::OpCode::Mul);
  // The mul's result is read last by the index_add: the scatter runs in its bytes.
  cc::Program p(std::move(g), cs::Device{}, {});
  EXPECT_EQ(p.stats().inplace_results, 1u) << p.summary();
  std::vector<float> a(18), s(9), o0(18), o1(18);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i);
  for (size_t i = 0; i < s.size(); ++i) s[i] = 10.f + static_cast<float>(i);
  const void* b[] = {a.data(), s.data()};
  void* o[] = {o0.data(), o1.data()};
  p.run(b, o);
  std::vector<float> w0 = a, w1(18);
  for (size_t i = 0; i < a.size(); ++i) w1[i] = a[i] * 2.f;
  for (size_t j = 0; j < ids.size(); ++j)
    for (size_t c = 0; c < 3; ++c) {
      w0[ids[j] * 3 + c] += s[j * 3 + c];
      w1[ids[j] * 3 + c] += s[j * 3 + c];
    }
  for (size_t i = 0; i < a.size(); ++i) w1[i] -= a[i];
  EXPECT_EQ(o0, w0);
  EXPECT_EQ(o1, w1);
  EXPECT_EQ(a[0], 0.f);  // the batch input was not written over
  EXPECT_EQ(a[13], 6.5f);
}

TEST(MemoryPlan, AResultIsWrittenOverItsInputOnlyWhenNothingReadsTheInputLater) {
  // index_add(x * 2, ...) twice from the same product: the first may not write over it (the
  // second reads it later), the second may.
  auto g = record({{4, 2}, {1, 2}}, [](auto& in) {
    auto idx = cs::from_vector(std::vector<int64_t>{2}, {1});
    auto m = in[0] * 2.f;
    auto first = cs::index_add(m, 0, idx, in[1]);
    auto second = cs::index_add(m, 0, idx, in[1] * 3.f);
    return std::vector<Tensor>{first + second};
  });
  cc::Program p(std::move(g), cs::Device{}, {});
  EXPECT_EQ(p.stats().inplace_results, 1u) << p.summary();
  std::vector<float> x{1, 2, 3, 4, 5, 6, 7, 8}, s{1, 1}, out(8);
  const void* b[] = {x.data(), s.data()};
  void* o[] = {out.data()};
  p.run(b, o);
  EXPECT_EQ(out, (std::vector<float>{4, 8, 12, 16, 24, 28, 28, 32}));
}

TEST(Passes, CrossEntropyBackwardIsOneOpBitwiseTheTwoItReplaces) {
  // Rows with a target in the vector loop, at the last class, and ignored (index 2); 37
  // classes leave a vector tail. Every reduction; 'none' weighted per row so each row's
  // gradient differs. The targets are batch inputs, as in training (constant targets fold
  // nll_loss_grad into a constant).
  const int64_t N = 9, C = 37;
  const std::vector<int64_t> tv{0, 36, 2, 5, 2, 17, 36, 1, 30};
  std::vector<float> lv(N * C), wv(N);
  for (size_t i = 0; i < lv.size(); ++i) lv[i] = std::sin(0.37f * static_cast<float>(i)) * 4.f;
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = 0.25f * static_cast<float>(i) - 1.f;
  for (auto red : {cs::Reduction::Mean, cs::Reduction::Sum, cs::Reduction::None}) {
    auto loss_of = [&](const Tensor& logits, const Tensor& target) {
      auto l = cs::cross_entropy(logits, target, 2, 0.0, red);
      return red == cs::Reduction::None ? cs::sum(l * cs::from_vector(wv, {N})) : l;
    };
    // The compiled step: one cross_entropy_grad, written over the log-probs.
    cs::nn::Linear lin(5, C);
    cs::optim::SGD opt(lin->parameters(), 0.1);
    cc::Graph g = cs::testing::record({{{N, 5}}, {{N}, cs::DType::i64}}, [&](auto& in) {
      auto loss = loss_of(lin(in[0]), in[1]);
      loss.backward();
      opt.step();
      opt.zero_grad();
      return std::vector<Tensor>{loss};
    });
    cc::optimize(g, "test");
    EXPECT_EQ(count_nodes(g, cs::ir::OpCode::CrossEntropyGrad), 1u) << g.dump();
    EXPECT_EQ(count_nodes(g, cs::ir::OpCode::NllLossGrad), 0u) << g.dump();
    EXPECT_EQ(count_nodes(g, cs::ir::OpCode::LogSoftmaxGrad), 0u) << g.dump();
    // log_softmax written over the logits (the product's result, read by nothing after it) and
    // cross_entropy_grad over the log-probs.
    cc::Program p(std::move(g), cs::Device{}, {});
    EXPECT_EQ(p.stats().inplace_results, 2u) << p.summary();

    // Traced against eager (log_softmax_grad of nll_loss_grad): bitwise equal.
    const Tensor t = cs::from_vector(tv, {N});
    Tensor z = cs::from_vector(lv, {N, C});
    z.set_requires_grad(true);
    const Tensor eager_loss = loss_of(z, t);
    eager_loss.backward();
    Tensor w = cs::from_vector(lv, {N, C});
    w.set_requires_grad(true);
    auto step = cs::trace([&](const Tensor& x, const Tensor& target) {
      auto l = loss_of(w + x, target);
      l.backward();
      return l;
    });
    const Tensor traced_loss = step(cs::zeros({N, C}), t);
    cs::synchronize();
    EXPECT_EQ(traced_loss.to_vector<float>(), eager_loss.to_vector<float>());
    const auto want = z.grad().to_vector<float>(), got = w.grad().to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
        << "reduction " << static_cast<int>(red);
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(got[2 * C + c], 0.f);  // the ignored row
  }
}
