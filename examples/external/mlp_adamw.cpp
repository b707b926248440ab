// A program built outside the cstorch tree against the installed library: a 4 -> 32 -> 1 MLP
// fitted with AdamW to a fixed random "teacher" network on 512 in-memory samples, in a traced
// training step. Prints the loss every 50 steps; exits 1 unless the final loss is below a tenth
// of the first (the check that training really happened), 2 on a cstorch error.
#include <cstorch/cstorch.h>

namespace cs = cstorch;

int main() {
  try {
    cs::manual_seed(0);
    // Data: y = tanh(x @ w1) @ w2 for a teacher the student never sees.
    cs::Tensor x = cs::randn({512, 4});
    cs::Tensor y = cs::matmul(cs::tanh(cs::matmul(x, cs::randn({4, 8}))), cs::randn({8, 1}));

    cs::nn::Sequential model(cs::nn::Linear(4, 32), cs::nn::ReLU(), cs::nn::Linear(32, 1));
    auto optimizer = cs::optim::configure_optimizer("AdamW", model->parameters(),
                                                    {{"lr", 1e-2}, {"weight_decay", 1e-4}});

    auto training_step = cs::trace([&](const cs::Tensor& xb, const cs::Tensor& yb) {
      cs::Tensor loss = cs::mse_loss(model(xb), yb);
      loss.backward();
      optimizer->step();
      optimizer->zero_grad();
      return loss;
    });

    const int64_t steps = 300;
    std::vector<float> losses(steps);
    auto record = cs::step_closure([&](const cs::Tensor& loss, int64_t step) {
      losses[static_cast<size_t>(step)] = loss.item<float>();
      if (step % 50 == 0 || step + 1 == steps)
        fmt::print("step {:3d}  loss {:.6f}\n", step, losses[static_cast<size_t>(step)]);
    });
    for (int64_t s = 0; s < steps; ++s) record(training_step(x, y), s);
    cs::synchronize();  // step closures run after their step: wait for the last one

    const float first = losses.front(), last = losses.back();
    if (!(last < 0.1f * first)) {
      fmt::print(stderr, "FAIL: the loss did not fall enough: first {:.6f}, last {:.6f}\n", first,
                 last);
      return 1;
    }
    fmt::print("OK: loss fell from {:.6f} to {:.6f}\n", first, last);
  } catch (const cs::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  return 0;
}
