// FC-MNIST: a custom training loop with a DataExecutor. Trains a fully connected network on MNIST
// IDX files (synthetic digits are generated on first run when no files are present), printing
// the loss from a step closure, then reports test accuracy. --precision bf16 / f16 trains in
// mixed precision (f16 with dynamic loss scaling).
#include <cstorch/cstorch.h>
#include <cstorch/data/mnist.h>
#include <CLI/CLI.hpp>
#include <chrono>

namespace cs = cstorch;
using cs::Tensor;

int main(int argc, char** argv) {
  CLI::App app{"Train a fully connected network on MNIST with cstorch"};
  std::string data_dir = "data/mnist";
  std::vector<int64_t> hidden = {256, 256};
  int64_t batch_size = 64, epochs = 2, log_every = 100;
  double lr = 0.05, momentum = 0.9;
  int threads = 0, seed = 1;
  std::string precision = "f32";
  app.add_option("--data-dir", data_dir, "Folder with MNIST IDX files (generated if missing)");
  app.add_option("--hidden", hidden, "Hidden layer sizes")->delimiter(',');
  app.add_option("--batch-size", batch_size, "Batch size");
  app.add_option("--epochs", epochs, "Epochs over the training split");
  app.add_option("--lr", lr, "SGD learning rate");
  app.add_option("--momentum", momentum, "SGD momentum");
  app.add_option("--threads", threads, "Compute threads (0: all cores)");
  app.add_option("--seed", seed, "Random seed");
  app.add_option("--log-every", log_every, "Print the loss every N steps");
  app.add_option("--precision", precision,
                 "f32, bf16 (autocast, f32 master weights) or f16 (autocast with dynamic loss "
                 "scaling)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}));
  CLI11_PARSE(app, argc, argv);

  try {
    if (threads > 0) cs::set_num_threads(threads);
    if (!cs::data::mnist_files_exist(data_dir)) {
      auto t0 = std::chrono::steady_clock::now();
      cs::data::write_synthetic_mnist(data_dir, 60000, 10000, 2024);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      fmt::print(
          "no MNIST files in {}: generated synthetic digits (60000 train, 10000 test) in {:.1f} "
          "s\n",
          data_dir, s);
    }

    auto backend = cs::backend("CPU");
    cs::manual_seed(seed);
    cs::nn::Sequential model;
    int64_t in = 784;
    for (auto h : hidden) {
      model->push_back(cs::nn::Linear(in, h).module());
      model->push_back(cs::nn::ReLU().module());
      in = h;
    }
    model->push_back(cs::nn::Linear(in, 10).module());
    auto compiled = cs::compile(model, backend);
    auto optimizer = cs::optim::configure_optimizer("SGD", model->parameters(),
                                                    {{"lr", lr}, {"momentum", momentum}});

    cs::utils::data::DataLoader loader(
        cs::data::mnist_input_fn,
        {{"data_dir", data_dir}, {"split", "train"}, {"batch_size", batch_size}, {"seed", seed}});
    int64_t steps_per_epoch = loader.size();

    // Mixed precision: matmuls in the 16-bit type, losses and reductions in f32, f32 weights.
    std::optional<cs::DType> low;
    if (precision == "bf16") low = cs::DType::bf16;
    if (precision == "f16") low = cs::DType::f16;
    std::unique_ptr<cs::amp::GradScaler> scaler;
    if (precision == "f16") scaler = std::make_unique<cs::amp::GradScaler>("dynamic");

    auto training_step = cs::trace([&](const cs::Batch& batch) {
      cs::amp::autocast ac(low);
      auto loss = cs::nn::functional::cross_entropy(compiled(batch.at("x")), batch.at("y"));
      cs::amp::optimizer_step(loss, *optimizer, scaler.get());
      optimizer->zero_grad();
      return loss;
    });
    auto print_loss = cs::step_closure([log_every](const Tensor& loss, int64_t step) {
      if (step % log_every == 0) fmt::print("step {:5d}  loss {:.4f}\n", step, loss.item<float>());
    });

    fmt::print("training {} -> {} -> 10 for {} epochs ({} steps of batch {}) on {} thread(s)\n",
               784, fmt::join(hidden, " -> "), epochs, epochs * steps_per_epoch, batch_size,
               cs::get_num_threads());
    auto t0 = std::chrono::steady_clock::now();
    cs::utils::data::DataExecutor executor(
        loader, {.num_steps = epochs * steps_per_epoch, .checkpoint_steps = 0});
    for (const auto& batch : executor) {
      auto loss = training_step(batch);
      print_loss(loss, executor.step());
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("trained {} steps in {:.2f} s ({:.0f} steps/s)\n", executor.num_steps(), secs,
               executor.num_steps() / secs);

    // Evaluation: a traced step without gradients; the smaller last batch traces once more.
    model->eval();
    auto eval_step = cs::trace([&](const cs::Batch& batch) {
      cs::NoGradGuard no_grad;
      cs::amp::autocast ac(low);
      auto pred = cs::argmax(compiled(batch.at("x")), 1);
      return cs::sum(cs::eq(pred, batch.at("y")));
    });
    auto test = cs::data::mnist_input_fn(
        {{"data_dir", data_dir}, {"split", "test"}, {"batch_size", 1000}}, {});
    std::vector<Tensor> correct;
    int64_t total = 0;
    while (auto b = test->next()) {
      total += b->at("y").numel();
      correct.push_back(eval_step(*b));
    }
    int64_t right = 0;
    for (auto& c : correct) right += c.item<int64_t>();
    fmt::print("test accuracy: {:.2f}% ({} / {})\n", 100.0 * right / total, right, total);
    if (scaler)
      fmt::print("loss scale {} after {} skipped steps\n", scaler->loss_scale().item<float>(),
                 scaler->num_skipped_steps().item<int64_t>());
  } catch (const cs::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
