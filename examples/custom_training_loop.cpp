// A minimal custom training loop for a fully connected network on MNIST, statement by
// statement: a ClusterConfig and the CSX backend, the model, compile, a Cerebras-compliant
// optimizer, the DataLoader wrapper, the traced training step, a DataExecutor with the number of
// steps and the checkpoint interval, the loss read in a step closure and checkpoints saved in a
// checkpoint closure. Synthetic digits are written to --data-dir when it holds no MNIST files;
// checkpoints are written as checkpoint_<step>.mdl into the working directory.
#include <cstorch/cstorch.h>
#include <cstorch/data/mnist.h>
#include <CLI/CLI.hpp>

namespace cs = cstorch;

int main(int argc, char** argv) {
  CLI::App app{"A minimal custom training loop: FC-MNIST on the CSX backend"};
  std::string data_dir = "data/mnist";
  int64_t num_steps = 1000, checkpoint_steps = 100, batch_size = 64;
  app.add_option("--data-dir", data_dir, "Folder with MNIST IDX files (generated if missing)");
  app.add_option("--num-steps", num_steps, "Training steps")->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-steps", checkpoint_steps, "Save every N steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "Batch size")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    if (!cs::data::mnist_files_exist(data_dir))
      cs::data::write_synthetic_mnist(data_dir, 60000, 10000, 2024);

    // Configure the Wafer Scale Cluster
    cs::ClusterConfig config{.num_csx = 1};
    auto backend = cs::backend("CSX", {.cluster_config = config});

    // Define your model
    cs::nn::Sequential model(cs::nn::Linear(784, 256), cs::nn::ReLU(), cs::nn::Linear(256, 10));
    auto loss_fn = [](const cs::Tensor& outputs, const cs::Tensor& targets) {
      return cs::nn::functional::cross_entropy(outputs, targets);
    };

    // Compile your model
    auto compiled_model = cs::compile(model, backend);

    // Optimize model parameters
    cs::optim::SGD optimizer(model->parameters(), /*lr=*/0.01, /*momentum=*/0.9);

    // Dataloaders
    cs::utils::data::DataLoader training_dataloader(
        cs::data::mnist_input_fn,
        {{"data_dir", data_dir}, {"split", "train"}, {"batch_size", batch_size}});

    // Define the training step
    auto training_step = cs::trace([&](const cs::Batch& batch) {
      auto outputs = compiled_model(batch.at("x"));
      auto loss = loss_fn(outputs, batch.at("y"));
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      return loss;
    });

    // Define an execution
    cs::utils::data::DataExecutor executor(
        training_dataloader, {.num_steps = num_steps, .checkpoint_steps = checkpoint_steps});

    // Train your model
    auto print_loss = cs::step_closure([](const cs::Tensor& loss, int64_t step) {
      fmt::print("Train Loss {}: {}\n", step, loss.item<float>());
    });

    auto save_checkpoint = cs::checkpoint_closure([&](int64_t step) {
      cs::save(cs::State::map({
                   {"model", model->state_dict().to_state()},
                   {"optimizer", optimizer.state_dict()},
               }),
               fmt::format("checkpoint_{}.mdl", step));
    });

    int64_t global_step = 0;
    for (const cs::Batch& batch : executor) {
      auto loss = training_step(batch);
      print_loss(loss, global_step);

      global_step += 1;
      if (global_step % checkpoint_steps == 0) save_checkpoint(global_step);
    }
  } catch (const cs::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
