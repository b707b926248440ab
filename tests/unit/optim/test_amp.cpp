// GradScaler (inf/NaN injected at chosen steps, checked step by step against the dynamic
// loss-scaling rule, in a traced step), gradient clipping, optimizer_step, autocast.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "cstorch/cstorch.h"
#include "unit/test_util.h"

namespace cstorch::testing {
namespace {

namespace ls = optim::lr_scheduler;

struct Expect {
  double scale, lr;
  int64_t steps, overflows, skipped;
  std::vector<double> p;
};

// The rule, on the host: SGD (lr from a StepLR(0.1, 3, 0.5) that advances only on applied
// steps) on loss = sum(p * g).
std::vector<Expect> simulate(const amp::GradScalerOptions& o, const std::set<int>& bad,
                             const std::vector<std::vector<double>>& g, int n) {
  bool dynamic = std::holds_alternative<std::string>(o.loss_scale);
  double scale = dynamic ? o.init_scale : std::get<double>(o.loss_scale);
  int64_t steps = 0, of = 0, skipped = 0, sched = 0;
  std::vector<double> p = {1, -2, 3, 0.5};
  std::vector<Expect> r;
  for (int t = 0; t < n; ++t) {
    bool finite = !bad.count(t);
    double lr = 0.1 * std::pow(0.5, std::floor(sched / 3.0));
    if (finite)
      for (size_t i = 0; i < p.size(); ++i)
        p[i] = static_cast<float>(p[i] - static_cast<float>(lr) * static_cast<float>(g[t][i]));
    else
      ++skipped;
    if (dynamic) {
      ++steps;
      of += !finite;
      if (static_cast<double>(of) / static_cast<double>(steps) > o.overflow_tolerance) {
        scale /= 2;
        steps = of = 0;
      } else if (steps > o.steps_per_increase) {
        scale *= 2;
        steps = of = 0;
      }
      scale = std::clamp(scale, o.min_loss_scale, o.max_loss_scale);
    }
    if (finite) ++sched;
    r.push_back({scale, 0.1 * std::pow(0.5, std::floor(sched / 3.0)), steps, of, skipped, p});
  }
  return r;
}

void run_scaler_case(const amp::GradScalerOptions& o, const std::set<int>& bad, int n) {
  std::vector<std::vector<double>> g;
  for (int t = 0; t < n; ++t) {
    auto v = rvals(4, -1, 1, 50 + t);
    std::vector<double> d(v.begin(), v.end());
    if (bad.count(t)) d[t % 4] = (t % 2) ? INFINITY : NAN;
    g.push_back(d);
  }
  auto want = simulate(o, bad, g, n);
  Tensor p = fv({1, -2, 3, 0.5});
  p.set_requires_grad(true);
  optim::SGD opt({p}, 0.1);
  ls::StepLR sched(opt, 0.1, 3, 0.5);
  amp::GradScaler scaler(o);
  auto step = trace([&](const Tensor& gt) {
    Tensor loss = sum(p * gt);
    amp::optimizer_step(loss, opt, &scaler);
    opt.zero_grad();
    sched.step();
    return std::vector<Tensor>{p * 1.0,
                               scaler.loss_scale() * 1.0,
                               cast(scaler.steps_since_rescale(), DType::f32),
                               cast(scaler.overflows_since_rescale(), DType::f32),
                               cast(scaler.num_skipped_steps(), DType::f32),
                               opt.param_groups()[0].lr * 1.0};
  });
  std::vector<std::vector<Tensor>> outs;
  for (int t = 0; t < n; ++t) {
    std::vector<float> gf(g[t].begin(), g[t].end());
    outs.push_back(step(fv(gf)));
  }
  for (int t = 0; t < n; ++t) {
    SCOPED_TRACE("step " + std::to_string(t) + (bad.count(t) ? " (non-finite)" : ""));
    const auto& w = want[t];
    expect_close(outs[t][0].to_vector<double>(), w.p, 1e-6, "parameters");
    EXPECT_EQ(outs[t][1].item<double>(), w.scale);
    EXPECT_EQ(outs[t][2].item<double>(), static_cast<double>(w.steps));
    EXPECT_EQ(outs[t][3].item<double>(), static_cast<double>(w.overflows));
    EXPECT_EQ(outs[t][4].item<double>(), static_cast<double>(w.skipped));
    EXPECT_NEAR(outs[t][5].item<double>(), w.lr, 1e-8) << "scheduler";
  }
  State sd = scaler.state_dict();
  EXPECT_EQ(sd.keys(), (std::vector<std::string>{"loss_scale", "steps_since_rescale",
                                                 "overflows_since_rescale", "num_skipped_steps"}));
  EXPECT_EQ(sd.at("loss_scale").as_double(), want.back().scale);
  EXPECT_EQ(sd.at("num_skipped_steps").as_int(), want.back().skipped);
}

TEST(GradScaler, DynamicRuleStepByStepWithInjectedInfAndNan) {
  amp::GradScalerOptions o;
  o.loss_scale = "dynamic";
  o.overflow_tolerance = 0;
  o.init_scale = 1024;
  o.steps_per_increase = 5;
  o.min_loss_scale = 256;
  o.max_loss_scale = 4096;
  // Overflows at 3, 4 (twice in a row), 5 (hits the floor of 256), then a long clean run that
  // doubles the scale every 6 steps up to 4096 and is then clamped there, one more overflow.
  run_scaler_case(o, {3, 4, 5, 6, 40}, 44);
}

TEST(GradScaler, OverflowTolerance) {
  amp::GradScalerOptions o;
  o.loss_scale = "dynamic";
  o.init_scale = 64;
  o.steps_per_increase = 4;
  o.overflow_tolerance = 0.3;
  run_scaler_case(o, {1, 2, 9, 15}, 20);
}

// An init_scale outside [min_loss_scale, max_loss_scale] starts at the bound, with a warning
// (it was clamped silently); the defaults say nothing.
TEST(GradScaler, InitScaleOutsideTheBoundsIsClampedWithAWarning) {
  amp::GradScalerOptions o;
  o.loss_scale = "dynamic";
  o.init_scale = 1e6;
  ::testing::internal::CaptureStderr();
  amp::GradScaler high(o);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: GradScaler: init_scale 1e+06 is outside [min_loss_scale, "
                     "max_loss_scale] = [6.10352e-05, 32768]; the scale starts at 32768"),
            std::string::npos)
      << err;
  EXPECT_EQ(high.state_dict().at("loss_scale").as_double(), 32768.0);
  ::testing::internal::CaptureStderr();
  amp::GradScaler plain("dynamic");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(GradScaler, StaticScaleStillSkipsNonFiniteSteps) {
  amp::GradScalerOptions o;
  o.loss_scale = 128.0;
  run_scaler_case(o, {2, 7}, 10);
}

TEST(GradScaler, ResumeFromStateDict) {
  amp::GradScaler a("dynamic");
  amp::GradScaler b("dynamic");
  b.load_state_dict(State::map({{"loss_scale", 512.0},
                                {"steps_since_rescale", 7},
                                {"overflows_since_rescale", 1},
                                {"num_skipped_steps", 3}}));
  EXPECT_EQ(b.state_dict().at("loss_scale").as_double(), 512.0);
  EXPECT_EQ(b.state_dict().at("steps_since_rescale").as_int(), 7);
  expect_error(
      [&] {
        a.load_state_dict(State::map({{"loss_scale", 2.0}}));
      },
      {"missing key 'steps_since_rescale'"});
  expect_error([&] { a.load_state_dict(State::map({{"scale", 2.0}})); }, {"unknown key 'scale'"});
}

TEST(GradScaler, Errors) {
  Tensor p = fv({1, 2});
  p.set_requires_grad(true);
  optim::SGD opt({p}, 0.1);
  amp::GradScaler s("dynamic");
  sum(p * p).backward();
  s.step(opt);
  expect_error([&] { s.step(opt); }, {"step: called twice without update()"});
  s.update();
  expect_error([&] { s.update(); }, {"update: called without step()"});
  expect_error([] { amp::GradScaler("dinamic"); }, {"\"dynamic\" or a positive number", "dinamic"});
  expect_error([] { amp::GradScaler(-2.0); },
               {"static loss_scale must be a positive number, finite as f32 (or 0.0 for no loss "
                "scaling)",
                "-2"});
  expect_error([] { amp::GradScaler(NAN); }, {"static loss_scale must be a positive number"});
  // Finite as a double, infinite as the f32 scale the step multiplies the loss by.
  expect_error([] { amp::GradScaler(1e39); }, {"finite as f32", "1e+39"});
  expect_error(
      [] { amp::GradScaler(amp::GradScalerOptions{.loss_scale = "dynamic", .init_scale = 1e39}); },
      {"init_scale must be > 0 and finite as f32", "1e+39"});
  expect_error(
      [] {
        amp::GradScaler(amp::GradScalerOptions{
            .loss_scale = "dynamic", .max_loss_scale = std::numeric_limits<double>::infinity()});
      },
      {"0 < min_loss_scale <= max_loss_scale, both finite as f32", "inf"});
  expect_error(
      [] {
        amp::GradScaler(amp::GradScalerOptions{.loss_scale = "dynamic", .max_gradient_norm = 0});
      },
      {"max_gradient_norm must be > 0"});
  // A fraction: at 1.5 the scale could never drop, and it was accepted.
  expect_error(
      [] {
        amp::GradScaler(amp::GradScalerOptions{.loss_scale = "dynamic", .overflow_tolerance = 1.5});
      },
      {"overflow_tolerance must be in [0, 1)", "1.5"});
  expect_error([&] { amp::optimizer_step(sum(p * p), opt, nullptr, 1.0, 0.5); },
               {"max_gradient_norm and max_gradient_value are mutually exclusive"});
}

// The defaults: loss_scale 0.0 (no scaling), overflow_tolerance 0.05, max_gradient_norm
// 0.05 (only with dynamic scaling and global gradient clipping on).
TEST(GradScaler, DefaultsAsTheSeed) {
  amp::GradScalerOptions o;
  EXPECT_EQ(std::get<double>(o.loss_scale), 0.0);
  EXPECT_EQ(o.overflow_tolerance, 0.05);
  EXPECT_EQ(o.max_gradient_norm, 0.05);
  EXPECT_FALSE(o.global_gradient_clipping);
  // No scaling: the same steps as without a GradScaler, non-finite gradients included.
  auto run = [](bool with_scaler) {
    Tensor p = fv({1, -2, 3});
    p.set_requires_grad(true);
    optim::SGD opt({p}, 0.1);
    amp::GradScaler scaler;
    EXPECT_FALSE(scaler.enabled());
    for (int t = 0; t < 3; ++t) {
      Tensor g = t == 2 ? fv({1, INFINITY, 2}) : fv({0.5f, -1, 2});
      Tensor loss = sum(p * g);
      if (with_scaler) {
        EXPECT_EQ(scaler.scale(loss).item<float>(), loss.item<float>());
      }
      amp::optimizer_step(loss, opt, with_scaler ? &scaler : nullptr);
      opt.zero_grad();
    }
    EXPECT_EQ(scaler.num_skipped_steps().item<int64_t>(), 0);
    return p.to_vector<float>();
  };
  auto a = run(true), b = run(false);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) << i;
}

TEST(GradScaler, MaxGradientNormClipsOnlyWithDynamicScalingAndGlobalClipping) {
  // Gradient (3, 4): norm 5. Returns p after one SGD(lr 1) step from 0.
  auto step = [](amp::GradScalerOptions o) {
    Tensor p = fv({0, 0});
    p.set_requires_grad(true);
    optim::SGD opt({p}, 1.0);
    amp::GradScaler scaler(o);
    amp::optimizer_step(sum(p * fv({3, 4})), opt, &scaler);
    return p.to_vector<double>();
  };
  amp::GradScalerOptions o;
  o.loss_scale = "dynamic";
  o.max_gradient_norm = 1.0;
  expect_close(step(o), {-3, -4}, 1e-6, "dynamic without global clipping");
  o.global_gradient_clipping = true;
  expect_close(step(o), {-0.6, -0.8}, 1e-5, "dynamic with global clipping");
  o.loss_scale = 8.0;
  expect_close(step(o), {-3, -4}, 1e-6, "static");
}

TEST(Clipping, GlobalNormAndValue) {
  Tensor a = fv({3, 4}), b = fv({12});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  (sum(a * fv({3, 4})) + sum(b * fv({12}))).backward();  // grads (3, 4) and (12): norm 13
  Tensor total = amp::clip_grad_norm_({a, b}, 6.5);
  EXPECT_NEAR(total.item<double>(), 13.0, 1e-5);
  double c = 6.5 / (13.0 + 1e-6);
  expect_close(a.grad().to_vector<double>(), {3 * c, 4 * c}, 1e-6);
  expect_close(b.grad().to_vector<double>(), {12 * c}, 1e-6);
  // Below the limit nothing changes; the inf norm is the largest magnitude.
  Tensor t2 = amp::clip_grad_norm_({a, b}, 100.0, INFINITY);
  EXPECT_NEAR(t2.item<double>(), 12 * c, 1e-5);
  expect_close(b.grad().to_vector<double>(), {12 * c}, 1e-6);
  amp::clip_grad_value_({a, b}, 2.0);
  expect_close(a.grad().to_vector<double>(), {1.5, 2.0}, 1e-6);
  expect_close(b.grad().to_vector<double>(), {2.0}, 1e-6);
  expect_error([&] { amp::clip_grad_norm_({a}, -1); }, {"max_norm must be >= 0"});
  expect_error([&] { amp::clip_grad_value_({a}, -1); }, {"clip_value must be >= 0"});
}

TEST(Autocast, MatmulInLowPrecisionReductionsAndLossesInF32) {
  Tensor x = rt({4, 8}, 1), w = rt({3, 8}, 2), bias = rt({3}, 3);
  w.set_requires_grad(true);
  Tensor y = iv({0, 2, 1, 2});
  Tensor out, loss;
  {
    amp::autocast ac(DType::bf16);
    EXPECT_EQ(amp::autocast_dtype(), DType::bf16);
    out = linear(x, w, bias);
    EXPECT_EQ(out.dtype(), DType::bf16);
    EXPECT_EQ(sum(out).dtype(), DType::f32);
    EXPECT_EQ(softmax(out, 1).dtype(), DType::f32);
    loss = cross_entropy(out, y);
    EXPECT_EQ(loss.dtype(), DType::f32);
    EXPECT_EQ(matmul(x, w.t()).dtype(), DType::bf16);
    {
      amp::autocast off(std::nullopt);
      EXPECT_EQ(linear(x, w).dtype(), DType::f32);
    }
  }
  EXPECT_FALSE(amp::autocast_dtype().has_value());
  // Same as casting by hand.
  Tensor ref = linear(cast(x, DType::bf16), cast(w, DType::bf16), cast(bias, DType::bf16));
  EXPECT_EQ(out.to_vector<float>(), ref.to_vector<float>());
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().dtype(), DType::f32);  // master weights and their gradients stay f32
  expect_error([] { amp::autocast a(DType::f32); }, {"autocast: dtype must be bf16 or f16"});
}

// 200 traced AdamW steps of an MLP (64 -> 128 -> 128 -> 10, batch 32, fixed batches) in f32 and
// under bf16 autocast from the same start: the bf16 loss curve follows the f32 one. bf16 keeps
// 8 significant bits, so each product input and output carries a relative rounding of up to
// 2^-9; through three layers and the softmax the loss moves by about 1% of itself, and the two
// runs' parameters drift apart by such steps over training. Allowed: 5% of the f32 loss plus
// 0.02 at every step (measured: at most 2.6% here), while both curves fall by more than half.
TEST(Autocast, Bf16LossCurveFollowsF32) {
  auto run = [](bool bf16) {
    manual_seed(5);
    nn::Sequential m(nn::Linear(64, 128), nn::ReLU(), nn::Linear(128, 128), nn::ReLU(),
                     nn::Linear(128, 10));
    optim::AdamW opt(m->parameters(), 3e-3);
    std::vector<Tensor> xs, ys;
    for (int b = 0; b < 4; ++b) {
      xs.push_back(randn({32, 64}));
      std::vector<int64_t> y(32);
      for (int i = 0; i < 32; ++i) y[static_cast<size_t>(i)] = (i * 7 + b) % 10;
      ys.push_back(from_vector(y, {32}));
    }
    auto step = trace([&](const Tensor& x, const Tensor& y) {
      std::optional<amp::autocast> ac;
      if (bf16) ac.emplace(DType::bf16);
      Tensor loss = cross_entropy(m(x), y);
      ac.reset();
      loss.backward();
      opt.step();
      opt.zero_grad();
      return loss;
    });
    std::vector<float> losses;
    for (int s = 0; s < 200; ++s) losses.push_back(step(xs[s % 4], ys[s % 4]).item<float>());
    return losses;
  };
  const std::vector<float> f32 = run(false), bf16 = run(true);
  double worst = 0;
  for (size_t s = 0; s < f32.size(); ++s) {
    const double d = std::fabs(double{bf16[s]} - double{f32[s]});
    worst = std::max(worst, d / std::max(1e-6, double{f32[s]}));
    ASSERT_LE(d, 0.05 * f32[s] + 0.02)
        << "step " << s << ": bf16 " << bf16[s] << ", f32 " << f32[s];
  }
  EXPECT_LT(f32.back(), 0.5f * f32.front());
  EXPECT_LT(bf16.back(), 0.5f * bf16.front());
  std::printf("bf16 loss curve: largest relative gap to f32 %.4f; last losses %.4f / %.4f\n", worst,
              bf16.back(), f32.back());
}

}  // namespace
}  // namespace cstorch::testing

namespace cstorch::testing {
namespace {

// f16 conversions (single F16C instructions where available) agree with the portable
// round-to-nearest-even versions on every half value, every midpoint between neighbours, and
// out-of-range inputs.
TEST(F16Conversion, MatchesThePortableVersion) {
  for (uint32_t h = 0; h < 65536; ++h) {
    f16_t v;
    v.bits = static_cast<uint16_t>(h);
    float a = static_cast<float>(v), b = f16_t::to_float(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << h;
      continue;
    }
    ASSERT_EQ(a, b) << "bits " << h;
    ASSERT_EQ(f16_t(b).bits, f16_t::from_float(b)) << "value " << b;
    if ((h & 0x7c00u) != 0x7c00u && (h & 0x7fffu) < 0x7bffu) {  // midpoint to the next half up
      float up = f16_t::to_float(static_cast<uint16_t>(h + 1));
      float mid = b + (up - b) / 2;
      ASSERT_EQ(f16_t(mid).bits, f16_t::from_float(mid)) << "midpoint " << mid;
      float above = std::nextafter(mid, up);
      ASSERT_EQ(f16_t(above).bits, f16_t::from_float(above)) << "above midpoint " << above;
    }
  }
  for (float x : {65519.0f, 65520.0f, 1e6f, -1e9f, INFINITY, -INFINITY, 1e-9f, -3e-8f})
    EXPECT_EQ(f16_t(x).bits, f16_t::from_float(x)) << x;
  EXPECT_TRUE(std::isnan(static_cast<float>(f16_t(NAN))));
}

}  // namespace
}  // namespace cstorch::testing
