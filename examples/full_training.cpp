// The full training script of the cstorch::configure() API, statement by statement: configure
// with checkpoint_steps, compile, an optimizer and a learning-rate scheduler built from
// configuration, a GradScaler only when loss scaling is on, a checkpoint-saving step closure,
// resuming from a checkpoint, the DataLoader, the traced training step, a loss-printing step
// closure, and the loop over the DataLoader that saves whenever `i % checkpoint_steps == 0`.
// The model is a fully connected network on MNIST (synthetic digits are written to --data-dir
// when it holds no MNIST files); what a script would fill in is a command-line option here.
// Checkpoints are written as checkpoint_<step>.mdl into --model-dir (a resumed run's steps
// count on from its checkpoint's).
#include <cstorch/cstorch.h>
#include <cstorch/data/mnist.h>
#include <CLI/CLI.hpp>

namespace cs = cstorch;

int main(int argc, char** argv) {
  CLI::App app{"Train FC-MNIST with the configure() API and a custom loop over the DataLoader"};
  std::string model_dir = "./", mgmt_address, data_dir = "data/mnist";
  std::string optimizer_type = "SGD", optimizer_args = "{lr: 0.01, momentum: 0.9}";
  std::string learning_rate = "0.01", loss_scale = "0.0";
  std::optional<std::string> checkpoint_path;
  int64_t checkpoint_steps_arg = 100, num_steps = 1000, batch_size = 64;
  app.add_option("--model-dir", model_dir, "Where checkpoints and reports go");
  app.add_option("--mgmt-address", mgmt_address, "Cluster management address (recorded only)");
  app.add_option("--data-dir", data_dir, "Folder with MNIST IDX files (generated if missing)");
  app.add_option("--checkpoint-steps", checkpoint_steps_arg, "Save every N steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--num-steps", num_steps, "Training steps")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch_size, "Batch size")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", optimizer_type, "Optimizer class name");
  app.add_option("--optimizer-args", optimizer_args, "Optimizer arguments (YAML map)");
  app.add_option("--learning-rate", learning_rate,
                 "A number, a {scheduler: ...} map or a list of them (YAML)");
  app.add_option("--loss-scale", loss_scale, "0.0 (off), a number, or dynamic");
  app.add_option("--checkpoint-path", checkpoint_path, "Resume from this checkpoint");
  CLI11_PARSE(app, argc, argv);

  try {
    if (!cs::data::mnist_files_exist(data_dir))
      cs::data::write_synthetic_mnist(data_dir, 60000, 10000, 2024);

    // Needs to be run at the beginning before model initialization
    const int64_t checkpoint_steps = checkpoint_steps_arg;
    cs::configure({
        .model_dir = model_dir,
        .checkpoint_steps = checkpoint_steps,
        .mgmt_address = mgmt_address,
    });

    // user defined model
    cs::nn::Sequential model(cs::nn::Linear(784, 256), cs::nn::ReLU(), cs::nn::Linear(256, 10));
    auto compiled_model = cs::compile(model);  // on the CSX backend that configure() made

    auto loss_fn = [](const cs::Tensor& outputs, const cs::Tensor& targets) {
      return cs::nn::functional::cross_entropy(outputs, targets);
    };

    std::unique_ptr<cs::optim::Optimizer> optimizer = cs::optim::configure_optimizer(
        optimizer_type, model->parameters(), cs::parse_config(optimizer_args));
    std::shared_ptr<cs::optim::lr_scheduler::LRScheduler> lr_scheduler =
        cs::optim::configure_lr_scheduler(*optimizer, cs::parse_config(learning_rate));

    std::unique_ptr<cs::amp::GradScaler> grad_scaler;
    if (loss_scale == "dynamic")
      grad_scaler = std::make_unique<cs::amp::GradScaler>("dynamic");
    else if (std::stod(loss_scale) != 0.0)
      grad_scaler = std::make_unique<cs::amp::GradScaler>(std::stod(loss_scale));

    auto save_checkpoint = cs::step_closure([&](int64_t step) {
      std::string checkpoint_file = fmt::format("checkpoint_{}.mdl", step);

      cs::State state_dict = cs::State::map({
          {"model", model->state_dict().to_state()},
          {"optimizer", optimizer->state_dict()},
      });
      if (lr_scheduler) state_dict.set("lr_scheduler", lr_scheduler->state_dict());
      if (grad_scaler) state_dict.set("grad_scaler", grad_scaler->state_dict());

      state_dict.set("global_step", step);

      cs::save(state_dict, checkpoint_file);
    });

    int64_t global_step = 0;

    // Load checkpoint if provided
    if (checkpoint_path) {
      cs::State state_dict = cs::load(*checkpoint_path);

      model->load_state_dict(cs::nn::StateDict::from_state(state_dict.at("model")));
      optimizer->load_state_dict(state_dict.at("optimizer"));
      if (lr_scheduler) lr_scheduler->load_state_dict(state_dict.at("lr_scheduler"));
      if (grad_scaler) grad_scaler->load_state_dict(state_dict.at("grad_scaler"));

      global_step = state_dict.contains("global_step") ? state_dict.at("global_step").as_int() : 0;
      fmt::print("Loaded {} (global step {})\n", *checkpoint_path, global_step);
    }

    auto train_dataloader_fn = cs::data::mnist_input_fn;
    cs::utils::data::DataLoader dataloader(train_dataloader_fn, {
                                                                    {"num_steps", num_steps},
                                                                    {"data_dir", data_dir},
                                                                    {"split", "train"},
                                                                    {"batch_size", batch_size},
                                                                });

    auto training_step = cs::compile_step([&](const cs::Batch& batch) {
      const cs::Tensor& inputs = batch.at("x");
      const cs::Tensor& targets = batch.at("y");
      auto outputs = compiled_model(inputs);
      auto loss = loss_fn(outputs, targets);

      optimizer->zero_grad();
      cs::amp::optimizer_step(loss, *optimizer, grad_scaler.get(), /*max_gradient_norm=*/1.0);

      if (lr_scheduler) lr_scheduler->step();

      return loss;
    });

    auto post_training_step = cs::step_closure(
        [](const cs::Tensor& loss) { fmt::print("Loss: {}\n", loss.item<float>()); });

    // Checkpoints are named by the step that ran, counted over the runs: a resumed run goes on
    // from the step after its checkpoint's (named from 0 again, it wrote over the checkpoints
    // of the run it resumed, the one it started from included).
    const int64_t first_step = checkpoint_path ? global_step + 1 : 0;
    int64_t i = 0;
    for (const cs::Batch& batch : dataloader) {
      auto loss = training_step(batch);

      post_training_step(loss);

      // Can only save checkpoint on predetermined steps (of this loop: i counts its batches)
      if (i % checkpoint_steps == 0) save_checkpoint(first_step + i);
      ++i;
    }
  } catch (const cs::Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 1;
  }
  return 0;
}
