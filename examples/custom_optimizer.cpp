// A user-written optimizer and learning-rate scheduler: subclass
// cstorch::optim::Optimizer (preinitialize creates all state, step uses tensor ops only,
// state_names_to_sparsify) and cstorch::optim::lr_scheduler::LRScheduler (closed_form_lr as
// tensor ops of the step). Both run inside a traced training step; the example fits a small
// linear regression and prints the loss and learning rate from a step closure.
#include <cstorch/cstorch.h>
#include <CLI/CLI.hpp>

namespace cs = cstorch;
using cs::Tensor;

// Sign descent with momentum ("signum", Bernstein et al. 2018):
//   m = beta * m + (1 - beta) * g;  p -= lr * (sign(m) + weight_decay * p).
class Signum : public cs::optim::Optimizer {
 public:
  Signum(std::vector<Tensor> params, double lr, double beta = 0.9, double weight_decay = 0)
      : Optimizer(std::move(params), {{"lr", lr}, {"beta", beta}, {"weight_decay", weight_decay}},
                  /*enable_global_step=*/true) {}

  // The only place state may be created.
  void preinitialize() override {
    for (auto& g : param_groups())
      for (auto& p : g.params) create_state(p, "momentum", cs::zeros_like(p));
  }

  void step() override {
    ensure_initialized();
    cs::NoGradGuard no_grad;
    for (auto& g : param_groups()) {
      double beta = option(g, "beta");
      Tensor wd = hyper(g, "weight_decay");  // a tensor: a scheduler may drive it
      for (auto& p : g.params) {
        Tensor grad = p.grad();
        if (!grad.defined()) continue;
        increment_global_step(p);
        Tensor& m = state(p, "momentum");
        m.copy_(m * beta + grad * (1 - beta));
        p.copy_(p - g.lr * (cs::sign(m) + wd * p));
      }
    }
  }

  std::vector<std::string> state_names_to_sparsify() const override { return {"momentum"}; }
  std::string name() const override { return "Signum"; }
};

// Linear warmup to `peak` over `warmup` steps, then decay as peak * sqrt(warmup / s). No
// branch on the step: the two pieces are selected with where().
class WarmupInverseSqrt : public cs::optim::lr_scheduler::LRScheduler {
 public:
  WarmupInverseSqrt(cs::optim::Optimizer& opt, double peak, int64_t warmup)
      : LRScheduler(opt), peak_(peak), warmup_(static_cast<double>(warmup)) {
    start();  // write the value for step 0 now
  }
  Tensor closed_form_lr(const Tensor& s) const override {
    Tensor rising = (s + 1.0) * (peak_ / warmup_);
    Tensor falling = cs::sqrt(warmup_ / cs::maximum(s, cs::scalar_tensor(1.0))) * peak_;
    return cs::where(s < warmup_, rising, falling);
  }
  std::string name() const override { return "WarmupInverseSqrt"; }

 private:
  double peak_, warmup_;
};

int main(int argc, char** argv) {
  CLI::App app{"A custom optimizer and scheduler in a traced training step"};
  int64_t steps = 300, log_every = 50;
  app.add_option("--steps", steps, "Training steps");
  app.add_option("--log-every", log_every, "Print every N steps");
  CLI11_PARSE(app, argc, argv);
  try {
    cs::manual_seed(3);
    // Data: y = x @ w_true + 0.5 + small noise.
    Tensor x = cs::randn({256, 8});
    Tensor w_true = cs::randn({8, 1});
    Tensor y = cs::matmul(x, w_true) + 0.5 + cs::randn({256, 1}) * 0.01;

    cs::nn::Linear model(8, 1);
    Signum optimizer(model->parameters(), /*lr=*/0.02, /*beta=*/0.9);
    WarmupInverseSqrt scheduler(optimizer, /*peak=*/0.02, /*warmup=*/20);

    auto training_step = cs::trace([&](const Tensor& xb, const Tensor& yb) {
      Tensor loss = cs::mse_loss(model(xb), yb);
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      scheduler.step();
      return std::vector<Tensor>{loss, scheduler.last_lr() * 1.0};
    });
    auto report = cs::step_closure([&](const Tensor& loss, const Tensor& lr, int64_t step) {
      if (step % log_every == 0 || step + 1 == steps)
        fmt::print("step {:4d}  loss {:.6f}  lr {:.6f}\n", step, loss.item<float>(),
                   lr.item<float>());
    });
    for (int64_t s = 0; s < steps; ++s) {
      auto out = training_step(x, y);
      report(out[0], out[1], s);
    }
    cs::synchronize();
    auto sd = optimizer.state_dict();
    fmt::print("optimizer state of parameter 0: {}\n",
               fmt::join(sd.at("state").at("0").keys(), ", "));
    fmt::print("scheduler last_epoch: {}\n", scheduler.state_dict().at("last_epoch").as_int());
  } catch (const cs::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
