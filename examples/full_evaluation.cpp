// The full evaluation script of the cstorch::configure() API, statement by statement:
// configure, compile the model and switch it to evaluation, an accuracy metric computed inside
// the traced step, weights loaded from a checkpoint, the DataLoader, the traced evaluation step,
// a step closure that sums the loss, and the loop over the DataLoader without gradients; then
// the accuracy. The model is the fully connected MNIST network of full_training.cpp; a relative
// --checkpoint is read from --model-dir.
#include <cstorch/cstorch.h>
#include <cstorch/data/mnist.h>
#include <CLI/CLI.hpp>

namespace cs = cstorch;
namespace metrics = cstorch::metrics;

int main(int argc, char** argv) {
  CLI::App app{"Evaluate FC-MNIST with the configure() API and a loop over the DataLoader"};
  std::string model_dir = "./", mgmt_address, data_dir = "data/mnist", checkpoint;
  int64_t num_steps = 100, batch_size = 100;
  app.add_option("--model-dir", model_dir, "Where checkpoints are (a relative --checkpoint)");
  app.add_option("--mgmt-address", mgmt_address, "Cluster management address (recorded only)");
  app.add_option("--data-dir", data_dir, "Folder with MNIST IDX files (generated if missing)");
  app.add_option("--checkpoint", checkpoint, "The checkpoint to evaluate")->required();
  app.add_option("--num-steps", num_steps, "Evaluation steps")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "Batch size")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    if (!cs::data::mnist_files_exist(data_dir))
      cs::data::write_synthetic_mnist(data_dir, 60000, 10000, 2024);

    cs::configure({.model_dir = model_dir, .mgmt_address = mgmt_address});

    cs::nn::Sequential model(cs::nn::Linear(784, 256), cs::nn::ReLU(), cs::nn::Linear(256, 10));
    auto compiled_model = cs::compile(model);
    compiled_model->eval();

    auto loss_fn = [](const cs::Tensor& outputs, const cs::Tensor& targets) {
      return cs::nn::functional::cross_entropy(outputs, targets);
    };

    metrics::AccuracyMetric accuracy("accuracy");

    cs::State state_dict = cs::load(checkpoint);
    model->load_state_dict(cs::nn::StateDict::from_state(state_dict.at("model")));

    auto eval_dataloader_fn = cs::data::mnist_input_fn;
    cs::utils::data::DataLoader dataloader(eval_dataloader_fn, {
                                                                   {"num_steps", num_steps},
                                                                   {"data_dir", data_dir},
                                                                   {"split", "test"},
                                                                   {"batch_size", batch_size},
                                                               });

    auto evaluation_step = cs::compile_step([&](const cs::Batch& batch) {
      const cs::Tensor& inputs = batch.at("x");
      const cs::Tensor& targets = batch.at("y");
      auto outputs = compiled_model(inputs);
      auto loss = loss_fn(outputs, targets);

      // update() reads its arguments within the step: the labels need no copy.
      accuracy(/*labels=*/targets,
               /*predictions=*/cs::argmax(outputs, -1).to(cs::DType::i32));

      return loss;
    });

    double total_loss = 0;
    int64_t total_steps = 0;

    auto post_eval_step = cs::step_closure([&](const cs::Tensor& loss) {
      total_loss += loss.item<float>();
      total_steps += 1;
    });

    {
      cs::NoGradGuard no_grad;
      for (const cs::Batch& batch : dataloader) {
        auto loss = evaluation_step(batch);

        post_eval_step(loss);
      }
    }

    fmt::print("Eval Accuracy: {}\n", static_cast<double>(accuracy));
    fmt::print("Eval Loss: {} (mean over {} steps)\n", total_loss / total_steps, total_steps);
  } catch (const cs::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
