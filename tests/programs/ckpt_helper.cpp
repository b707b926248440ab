// Test helper for the checkpoint end-to-end tests (a separate process, so a test can kill it or
// resume in a fresh process):
//
//   ckpt_helper write-big OUT MB        save a state of about MB megabytes to OUT
//   ckpt_helper train --data DIR --steps N [--resume CKPT] [--save CKPT] [--final OUT]
//
// `train` runs a traced FC-MNIST step (784-64-10 with dropout, so the RNG matters; SGD with
// momentum) on batch i = samples [32 i, 32 i + 32) of the training split, printing
// "step <i> loss <float bits in hex>" for every step. --resume loads model, momentum buffers,
// RNG state and global step from CKPT; --save writes them after the last step; --final saves
// the final weights.
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "cstorch/data/mnist.h"

namespace cs = cstorch;
using cs::State;
using cs::Tensor;

static int write_big(const std::string& out, int64_t mb) {
  State s = State::map();
  int64_t per = 1 << 20;  // 4 MiB f32 tensors
  for (int64_t i = 0; i < mb / 4; ++i)
    s.set("layer" + std::to_string(i) + ".weight", cs::full({per}, static_cast<double>(i)));
  cs::save(s, out);
  std::printf("saved %s\n", out.c_str());
  return 0;
}

static int train(const std::string& data_dir, int64_t steps, const std::string& resume,
                 const std::string& save_to, const std::string& final_out) {
  cs::set_num_threads(1);  // bitwise comparison across processes: fixed thread count
  auto split = cs::data::load_mnist_split(data_dir, "train");
  int64_t n = split.images.dims[0];
  std::vector<float> x(split.images.data.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = split.images.data[i] / 255.0f;
  std::vector<int64_t> y(split.labels.data.begin(), split.labels.data.end());
  const int64_t batch = 32;

  auto backend = cs::backend("CPU");
  cs::manual_seed(7);
  cs::nn::Sequential model;
  model->push_back(cs::nn::Linear(784, 64).module());
  model->push_back(cs::nn::ReLU().module());
  model->push_back(cs::nn::Dropout(0.2).module());
  model->push_back(cs::nn::Linear(64, 10).module());
  auto compiled = cs::compile(model, backend);
  auto params = model->parameters();
  cs::optim::SGD optimizer(params, 0.05, 0.9);

  int64_t start = 0;
  if (!resume.empty()) {
    State s = cs::load(resume);
    model->load_state_dict(cs::nn::StateDict::from_state(s.at("model")));
    const State& mom = s.at("optimizer").at("momentum_buffer");
    for (size_t i = 0; i < params.size(); ++i)
      optimizer.state(params[i], "momentum_buffer").copy_(mom.at(std::to_string(i)).as_tensor());
    cs::set_rng_state(s.at("rng").as_tensor());
    start = s.at("global_step").as_int();
  }

  auto step = cs::trace([&](const cs::Batch& b) {
    auto loss = cs::nn::functional::cross_entropy(compiled(b.at("x")), b.at("y"));
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    return loss;
  });
  auto print = cs::step_closure([](const Tensor& loss, int64_t i) {
    float v = loss.item<float>();
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    std::printf("step %lld loss %08x %.6f\n", static_cast<long long>(i), bits, v);
  });
  for (int64_t i = start; i < start + steps; ++i) {
    int64_t first = (i * batch) % (n - batch);
    cs::Batch b{{"x", cs::from_blob(x.data() + first * 784, {batch, 784}, cs::DType::f32)},
                {"y", cs::from_blob(y.data() + first, {batch}, cs::DType::i64)}};
    print(step(b), i);
  }
  if (!save_to.empty()) {
    State mom = State::map();
    for (size_t i = 0; i < params.size(); ++i)
      mom.set(std::to_string(i), optimizer.state(params[i], "momentum_buffer"));
    cs::save(State::map({{"model", model->state_dict().to_state()},
                         {"optimizer", State::map({{"momentum_buffer", mom}})},
                         {"rng", cs::rng_state()},
                         {"global_step", start + steps}}),
             save_to);
  }
  if (!final_out.empty())
    cs::save(State::map({{"model", model->state_dict().to_state()}}), final_out);
  std::fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"checkpoint test helper"};
  app.require_subcommand(1);
  std::string out, data_dir, resume, save_to, final_out;
  int64_t mb = 64, steps = 0;
  auto* big = app.add_subcommand("write-big", "save a large state");
  big->add_option("out", out)->required();
  big->add_option("mb", mb)->required();
  auto* tr = app.add_subcommand("train", "train FC-MNIST steps");
  tr->add_option("--data", data_dir)->required();
  tr->add_option("--steps", steps)->required();
  tr->add_option("--resume", resume);
  tr->add_option("--save", save_to);
  tr->add_option("--final", final_out);
  CLI11_PARSE(app, argc, argv);
  try {
    if (big->parsed()) return write_big(out, mb);
    return train(data_dir, steps, resume, save_to, final_out);
  } catch (const cs::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
