// A Model Zoo callback plugin: logs the L2 norm of all model weights every N steps.
//
//   build (CMake, after find_package(cstorch 0.5 REQUIRED), as in examples/external):
//                  add_library(weight_norm MODULE weight_norm_callback.cpp)
//                  target_link_libraries(weight_norm PRIVATE cstorch::modelzoo)
//                  set_target_properties(weight_norm PROPERTIES PREFIX "")
//   use:           cszoo fit params.yaml --plugin_paths weight_norm.so, with
//                  `callbacks: [{WeightNorm: {every_n_steps: 10}}]` under trainer.init
#include <cmath>

#include "modelzoo/callback.h"
#include "modelzoo/trainer.h"

namespace {

class WeightNorm : public modelzoo::Callback {
 public:
  explicit WeightNorm(int64_t every_n_steps) : every_(every_n_steps) {}
  std::string name() const override { return "WeightNorm"; }

  // Inside the traced step, after the update: the norm becomes an output of the step.
  void on_after_optimizer_step(modelzoo::Trainer& t) override {
    cstorch::Tensor sq;
    for (const auto& p : t.model().parameters()) {
      cstorch::Tensor s = (p * p).sum();
      sq = sq.defined() ? sq + s : s;
    }
    t.add_step_output("weight_norm", cstorch::sqrt(sq));
  }

  // In the client loop, which runs ahead of execution: read the value in a step closure,
  // which runs once the step has.
  void on_train_batch_end(modelzoo::Trainer& t, const cstorch::Tensor&, int64_t step) override {
    if (step % every_ != 0) return;
    modelzoo::Trainer* trainer = &t;
    cstorch::step_closure([trainer, step](const cstorch::Tensor& norm) {
      const double v = norm.item<float>();
      trainer->log_metrics(step, {{"weight_norm", v}});
      fmt::print("weight_norm at step {}: {:.6f}\n", step, v);
    })(t.step_output("weight_norm"));
  }

 private:
  int64_t every_;
};

// The YAML factory: check the keys (an unknown one is an error naming its key path and the
// valid keys) and the values.
MODELZOO_REGISTER(callbacks, "WeightNorm",
                  [](const modelzoo::ConfigView& args) -> modelzoo::CallbackPtr {
                    args.check_keys({"every_n_steps"});
                    const int64_t n = args.get_int("every_n_steps", 1);
                    if (n < 1)
                      args.at("every_n_steps").error(fmt::format("must be at least 1, got {}", n));
                    return std::make_shared<WeightNorm>(n);
                  });

}  // namespace
