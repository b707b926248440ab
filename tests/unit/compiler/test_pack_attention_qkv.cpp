// The pack_attention_qkv pass: attention over the three thirds of a packed QKV projection reads
// them in place and writes their gradient as the projection's, with no slice or cat left, and
// training steps are bitwise those of the unrewritten graph.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <cstorch/cstorch.h>

#include "compiler/graph.h"
#include "ir/node.h"
#include "unit/compiler/record_step.h"

namespace cs = cstorch;
namespace F = cstorch::nn::functional;
using cs::Tensor;
namespace cc = cstorch::compiler;
using cs::ir::OpCode;
using cs::testing::count_nodes;

namespace {

constexpr int64_t kB = 2, kT = 6, kE = 16, kH = 2, kD = 8, kClasses = 5;

struct QkvNet {
  cs::nn::Linear qkv{kE, 3 * kE}, out{kE, kClasses};
  std::vector<Tensor> parameters() {
    std::vector<Tensor> p = qkv->parameters();
    for (auto& t : out->parameters()) p.push_back(t);
    return p;
  }
};

QkvNet make_net() {
  cs::manual_seed(7);
  return QkvNet{};
}

// One AdamW step of a single attention layer on rows x [B T, E]: q, k, v the three thirds of
// one projection (in `order`: which third each of q, k, v is), heads last. With `bf16`, the
// forward runs under bf16 autocast: the projection is bf16, and the attention casts its thirds
// to f32 (and its gradient goes back to bf16 through casts before the concatenation).
Tensor qkv_step(QkvNet& m, cs::optim::Optimizer& o, const Tensor& x, const Tensor& y, bool causal,
                const int (&order)[3] = {0, 1, 2}, bool bf16 = false) {
  Tensor logits;
  {
    std::optional<cs::amp::autocast> ac;
    if (bf16) ac.emplace(cs::DType::bf16);
    const Tensor h = m.qkv(x.reshape({kB, kT, kE}));
    Tensor part[3];
    for (int i = 0; i < 3; ++i)
      part[i] = cs::slice(h, 2, order[i] * kE, (order[i] + 1) * kE).reshape({kB, kT, kH, kD});
    F::AttentionOptions a;
    a.heads_last = true;
    a.is_causal = causal;
    const Tensor att = F::scaled_dot_product_attention(part[0], part[1], part[2], a);
    logits = m.out(att.reshape({kB * kT, kE}));
  }
  auto loss = cs::cross_entropy(logits, y);
  loss.backward();
  o.step();
  o.zero_grad();
  return loss;
}

Tensor labels() {
  std::vector<int64_t> v(kB * kT);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i) % kClasses;
  return cs::from_vector(v, {kB * kT});
}

// The views the attention nodes of `g` read after the pass: each node packed (qkv), reading one
// [B, T, 3H, D] reshape three times; and no slice or cat left around them.
std::vector<cs::ir::NodePtr> packed_views(const cc::Graph& g) {
  std::vector<cs::ir::NodePtr> views;
  for (auto& n : g.nodes) {
    if (n->op != OpCode::Attention && n->op != OpCode::AttentionGrad) continue;
    EXPECT_TRUE(n->attr<cs::ir::AttentionAttrs>().qkv) << g.dump();
    EXPECT_EQ(n->inputs[0], n->inputs[1]);
    EXPECT_EQ(n->inputs[0], n->inputs[2]);
    EXPECT_EQ(n->inputs[0]->op, OpCode::Reshape);
    EXPECT_EQ(n->inputs[0]->shape, (cs::Shape{kB, kT, 3 * kH, kD}));
    views.push_back(n->inputs[0]);
  }
  EXPECT_EQ(count_nodes(g, OpCode::Slice), 0u) << g.dump();
  EXPECT_EQ(count_nodes(g, OpCode::Cat), 0u) << g.dump();
  return views;
}

}  // namespace

TEST(PackAttentionQkv, AttentionReadsTheProjectionAndWritesItsGradient) {
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    auto m = make_net();
    cs::optim::AdamW opt(m.parameters(), 1e-2);
    const Tensor y = labels();
    cc::Graph g = cs::testing::record_step(
        {kB * kT, kE}, [&](const Tensor& x) { return qkv_step(m, opt, x, y, causal); });
    cc::optimize(g, "pack_attention_qkv");
    EXPECT_EQ(packed_views(g).size(), 2u) << g.dump();
  }
}

TEST(PackAttentionQkv, UnderAutocastTheProjectionIsCastOnceEachWay) {
  // The bf16 projection's thirds, each cast to f32 for the attention: the projection is cast
  // once and viewed, and the gradient, in its layout, cast back once (no slice, cat or per-third
  // cast left).
  auto m = make_net();
  cs::optim::AdamW opt(m.parameters(), 1e-2);
  const Tensor y = labels();
  cc::Graph g = cs::testing::record_step({kB * kT, kE}, [&](const Tensor& x) {
    return qkv_step(m, opt, x, y, true, {0, 1, 2}, true);
  });
  cc::optimize(g, "pack_attention_qkv_autocast");
  const auto views = packed_views(g);
  EXPECT_EQ(views.size(), 2u) << g.dump();
  for (const auto& view : views) {  // a view of the projection cast to f32
    ASSERT_EQ(view->op, OpCode::Reshape) << g.dump();
    EXPECT_EQ(view->inputs[0]->op, OpCode::Cast) << g.dump();
    EXPECT_EQ(view->inputs[0]->dtype, cs::DType::f32);
    EXPECT_EQ(view->inputs[0]->inputs[0]->dtype, cs::DType::bf16);
  }
  // The gradient, in the projection's layout, cast back to bf16 once: the only casts of
  // [B, T, 3E] values are that one and the view's.
  size_t wide = 0;
  for (auto& n : g.nodes) {
    if (n->op != OpCode::Cast || n->shape != (cs::Shape{kB, kT, 3 * kE})) continue;
    ++wide;
    if (n->dtype == cs::DType::bf16) {
      ASSERT_EQ(n->inputs[0]->op, OpCode::Reshape) << g.dump();
      EXPECT_EQ(n->inputs[0]->inputs[0]->op, OpCode::AttentionGrad) << g.dump();
    }
  }
  EXPECT_EQ(wide, 2u) << g.dump();
}

TEST(PackAttentionQkv, ThirdsInAnotherOrderAreLeftAlone) {
  // k from the first third and q from the second: heads [0, H) of the view are not q.
  auto m = make_net();
  cs::optim::AdamW opt(m.parameters(), 1e-2);
  const Tensor y = labels();
  cc::Graph g = cs::testing::record_step({kB * kT, kE}, [&](const Tensor& x) {
    return qkv_step(m, opt, x, y, true, {1, 0, 2});
  });
  cc::optimize(g, "pack_attention_qkv_order");
  for (auto& n : g.nodes) {
    if (n->op == OpCode::Attention || n->op == OpCode::AttentionGrad) {
      EXPECT_FALSE(n->attr<cs::ir::AttentionAttrs>().qkv) << g.dump();
    }
  }
  EXPECT_EQ(count_nodes(g, OpCode::Slice), 6u) << g.dump();  // three forward, three of the gradient
  EXPECT_EQ(count_nodes(g, OpCode::Cat), 1u) << g.dump();
}

TEST(PackAttentionQkv, StepsAreBitwiseEqualWithThePassOnAndOff) {
  for (int variant = 0; variant < 3; ++variant) {
    const bool causal = variant != 0, bf16 = variant == 2;
    SCOPED_TRACE(bf16 ? "causal, bf16 autocast" : causal ? "causal" : "full");
    auto m1 = make_net();
    auto m2 = make_net();
    cs::optim::AdamW o1(m1.parameters(), 1e-2);
    cs::optim::AdamW o2(m2.parameters(), 1e-2);
    auto packed = cs::trace([&](const Tensor& x, const Tensor& y) {
      return qkv_step(m1, o1, x, y, causal, {0, 1, 2}, bf16);
    });
    auto plain = cs::trace([&](const Tensor& x, const Tensor& y) {
      return qkv_step(m2, o2, x, y, causal, {0, 1, 2}, bf16);
    });
    const Tensor y = labels();
    cs::manual_seed(11);
    for (int i = 0; i < 4; ++i) {
      const Tensor x = cs::randn({kB * kT, kE});
      const Tensor lp = packed(x, y);  // compiled at the first call: the pass on
      setenv("CSTORCH_FUSION", "0", 1);
      const Tensor lq = plain(x, y);  // compiled here: fusion passes, this one too, off
      unsetenv("CSTORCH_FUSION");
      EXPECT_EQ(lp.item<float>(), lq.item<float>()) << "step " << i;
    }
    const auto p1 = m1.parameters(), p2 = m2.parameters();
    for (size_t i = 0; i < p1.size(); ++i)
      EXPECT_EQ(p1[i].to_vector<float>(), p2[i].to_vector<float>()) << "param " << i;
  }
}

TEST(PackAttentionQkv, APackedNodeMustReadOneTensorThreeTimes) {
  auto leaf = [](cs::Shape s) {
    auto n = std::make_shared<cs::ir::Node>();
    n->op = OpCode::Input;
    n->shape = std::move(s);
    n->dtype = cs::DType::f32;
    return n;
  };
  cs::ir::AttentionAttrs at;
  at.bthd = at.qkv = true;
  auto x = leaf({kB, kT, 3 * kH, kD}), other = leaf({kB, kT, 3 * kH, kD});
  auto n = cs::ir::Node::make(OpCode::Attention, at, {x, x, x});
  cs::ir::op_info(OpCode::Attention).infer(*n);
  EXPECT_EQ(n->shape, (cs::Shape{kB, kT, kH, kD}));
  n->inputs[2] = other;
  try {
    cs::ir::op_info(OpCode::Attention).infer(*n);
    ADD_FAILURE() << "no error";
  } catch (const cs::Error& e) {
    EXPECT_NE(std::string(e.what()).find("one tensor given three times"), std::string::npos)
        << e.what();
  }
  // A width that is not three heads' worth.
  auto odd = leaf({kB, kT, 3 * kH + 1, kD});
  n->inputs = {odd, odd, odd};
  EXPECT_THROW(cs::ir::op_info(OpCode::Attention).infer(*n), cs::Error);
}
