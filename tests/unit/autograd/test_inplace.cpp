// In-place writes into tensors that require grad, eagerly: a parameter set under NoGradGuard
// (copy_, as when loading or tying weights) stays its own leaf, as in PyTorch. The expected
// gradients are PyTorch's for the same code:
//   w = zeros(3, requires_grad=True); v = ones(3, requires_grad=True)
//   with no_grad(): w.copy_(v)
//   ((w * 2).sum() + (v * 3).sum()).backward()   ->  w.grad = 2, v.grad = 3
#include <gtest/gtest.h>

#include <cstorch/cstorch.h>

namespace cs = cstorch;
using cs::Tensor;

namespace {

Tensor param(std::vector<float> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor t = cs::from_vector(v, {n});
  t.set_requires_grad(true);
  return t;
}

}  // namespace

TEST(InPlace, CopyFromAnotherParameterUnderNoGradKeepsEachGradientItsOwn) {
  Tensor w = param({0, 0, 0});
  Tensor v = param({1, 2, 3});
  {
    cs::NoGradGuard ng;
    w.copy_(v);
  }
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{1, 2, 3}));
  (cs::sum(w * 2.0) + cs::sum(v * 3.0)).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 2, 2}));
  EXPECT_EQ(v.grad().to_vector<float>(), (std::vector<float>{3, 3, 3}));  // was 5: w's went here
}

// The same after an optimizer step of the source: the step had given it a fresh node that did
// not yet look like a leaf's, and the copy shared it, so the copy's gradient went to the
// source once the source was used again.
TEST(InPlace, CopyFromAParameterAnOptimizerHasUpdatedKeepsEachGradientItsOwn) {
  Tensor v = param({1, 2, 3});
  cs::optim::SGD opt({v}, 0.5, 0.9);
  cs::sum(v * 3.0).backward();
  opt.step();
  opt.zero_grad();
  Tensor w = param({0, 0, 0});
  {
    cs::NoGradGuard ng;
    w.copy_(v);
  }
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{-0.5f, 0.5f, 1.5f}));
  cs::sum(v * 3.0).backward();  // v used again: its node becomes a leaf's
  opt.zero_grad();
  cs::sum(w * 2.0).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 2, 2}));
  EXPECT_FALSE(v.grad().defined());  // was 2, 2, 2: w's gradient went here
}

TEST(InPlace, CopyFromAResultWithHistoryUnderNoGradDoesNotReachTheHistory) {
  Tensor a = param({1, 1, 1});
  Tensor h = a * 5.0;
  Tensor w = param({0, 0, 0});
  {
    cs::NoGradGuard ng;
    w.copy_(h);
  }
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{5, 5, 5}));
  cs::sum(w * 2.0).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 2, 2}));
  EXPECT_FALSE(a.grad().defined());  // the loss does not depend on a
}

TEST(InPlace, CopyFromPlainValuesUnderNoGradThenTrain) {
  // The common case (loading weights) and a broadcast source; then an optimizer step, which
  // updates the parameter under NoGradGuard too.
  Tensor w = param({0, 0, 0});
  Tensor m = cs::zeros({2, 3});
  m.set_requires_grad(true);
  {
    cs::NoGradGuard ng;
    w.copy_(cs::from_vector(std::vector<float>{1, 2, 3}, {3}));
    m.copy_(cs::from_vector(std::vector<float>{4, 5, 6}, {3}));
  }
  cs::optim::SGD opt({w, m}, 0.5);
  (cs::sum(w * w) + cs::sum(m)).backward();
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{2, 4, 6}));
  EXPECT_EQ(m.grad().to_vector<float>(), (std::vector<float>(6, 1.f)));
  opt.step();
  EXPECT_EQ(w.to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(m.to_vector<float>(), (std::vector<float>{3.5f, 4.5f, 5.5f, 3.5f, 4.5f, 5.5f}));
}

// A model loaded from another's state dict (or two models from one loaded state) keeps its own
// storage: the copy had taken the source's, so a traced step's in-place update of one model
// changed the other (found by a new-user trial: a loaded checkpoint's tensors changed too).
TEST(InPlace, LoadedParametersDoNotShareTheSourcesStorage) {
  cs::manual_seed(0);
  cs::nn::Linear a(4, 3), b(4, 3);
  b->load_state_dict(a->state_dict());
  const std::vector<float> before = b->weight.to_vector<float>();
  EXPECT_EQ(before, a->weight.to_vector<float>());
  cs::optim::SGD opt(a->parameters(), 0.5);
  Tensor x = cs::ones({8, 4});
  auto step = cs::trace([&](const Tensor& xb) {
    opt.zero_grad();
    Tensor l = cs::sum(a(xb));
    l.backward();
    opt.step();
    return l;
  });
  step(x);
  step(x);
  cs::synchronize();
  EXPECT_NE(a->weight.to_vector<float>(), before);  // a trained
  EXPECT_EQ(b->weight.to_vector<float>(), before);  // b did not
}
