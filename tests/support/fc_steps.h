// FC-MNIST training steps (the Model Zoo's fc_mnist model, traced, with SGD + momentum, Adam or
// AdamW) on any device from the same initial weights and batches: the per-step losses, for
// comparing a device with the CPU. Used by the CUDA capability test (tests/unit/device/) and by
// the GPU tests (tests/cuda/).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include <cstorch/cstorch.h>

#include "modelzoo/model.h"
#include "modelzoo/registry.h"
#include "runtime/run_mode.h"

namespace cstorch::testing {

struct FcRun {
  std::vector<float> train_losses;  // one per training step
  std::vector<float> eval_losses;   // one per evaluation step (after training)
  std::vector<Tensor> params;       // final parameters, on the CPU
};

// MNIST-shaped batches: pixels in [0, 1), labels 0..9.
inline Batch fc_batch(int64_t batch, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(batch) * 784);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& v : x) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<float>(s >> 8) / 16777216.0f;
  }
  std::vector<int64_t> y(static_cast<size_t>(batch));
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>((i * 7 + seed) % 10);
  return {{"x", from_vector(x, {batch, 784})}, {"y", from_vector(y, {batch})}};
}

// `optimizer`: "sgd" (lr 0.05, momentum 0.9), "adam" (lr 1e-3) or "adamw" (lr 1e-3, weight
// decay 0.01); `lr` > 0 replaces the learning rate. `hidden`: the YAML list of hidden sizes
// ("[256, 256]").
inline FcRun fc_mnist_run(Device dev, const std::string& optimizer, int steps, int64_t batch,
                          const std::string& hidden, int eval_steps = 2, double lr = 0) {
  runtime::StepDeviceScope scope(dev);
  manual_seed(5);
  auto cfg = parse_config("hidden_sizes: " + hidden + "\n");
  auto model =
      modelzoo::models().create("fc_mnist", modelzoo::ConfigView(cfg, "model"), "model.name");
  model->to(dev);
  std::unique_ptr<optim::Optimizer> opt;
  if (optimizer == "sgd")
    opt = std::make_unique<optim::SGD>(model->parameters(), lr > 0 ? lr : 0.05, 0.9);
  else if (optimizer == "adam")
    opt = std::make_unique<optim::Adam>(model->parameters(), lr > 0 ? lr : 1e-3);
  else
    opt = std::make_unique<optim::AdamW>(model->parameters(), lr > 0 ? lr : 1e-3, 0.9, 0.999, 1e-8,
                                         0.01);
  auto train = trace([&](const Batch& b) {
    Tensor l = model->loss(b);
    l.backward();
    opt->step();
    opt->zero_grad();
    return l;
  });
  FcRun r;
  model->train();
  for (int s = 0; s < steps; ++s)
    r.train_losses.push_back(train(fc_batch(batch, static_cast<uint32_t>(s % 7))).item<float>());
  model->eval();
  auto eval = trace([&](const Batch& b) { return model->loss(b); });
  for (int s = 0; s < eval_steps; ++s)
    r.eval_losses.push_back(eval(fc_batch(batch, static_cast<uint32_t>(100 + s))).item<float>());
  for (auto& p : model->parameters()) r.params.push_back(p.to(Device{}));
  return r;
}

}  // namespace cstorch::testing
