// Traceable optimizers. All state is created in preinitialize() (called once, eagerly, before
// the first use of state — even when that first use is inside a traced step); creating state
// anywhere else is an error. step() uses tensor ops only (no branch on a tensor value), so it
// traces into the compiled training step. Learning rates are 0-d tensors per param group, so
// a change (or a scheduler) reaches the compiled step without retracing.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cstorch/tensor.h"

namespace cstorch {
using Config = nlohmann::json;
}

namespace cstorch::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  std::map<std::string, double> options;  // hyper-parameters (lr, momentum, ...)
  Tensor lr;                              // 0-d f32 tensor read by step()
};

class Optimizer {
 public:
  // `defaults` fill missing per-group options; "lr" is required.
  Optimizer(std::vector<Tensor> params, std::map<std::string, double> defaults,
            bool enable_global_step = false);
  Optimizer(std::vector<ParamGroup> groups, std::map<std::string, double> defaults,
            bool enable_global_step = false);
  virtual ~Optimizer() = default;

  // Creates every state tensor via create_state(). Called once by ensure_initialized().
  virtual void preinitialize() = 0;
  // One update from the parameters' .grad (parameters without a gradient are skipped).
  virtual void step() = 0;
  virtual std::vector<std::string> state_names_to_sparsify() const = 0;
  virtual std::string name() const = 0;

  // Sets every parameter's .grad to none (set_to_none) or to zeros.
  void zero_grad(bool set_to_none = true);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Sets a group's learning rate (writes the lr tensor).
  void set_lr(size_t group, double lr);

  // The state tensor `name` of parameter `p` (runs preinitialize first if needed).
  Tensor& state(const Tensor& p, const std::string& name);
  bool has_state(const Tensor& p, const std::string& name);
  void ensure_initialized();

 protected:
  // Only inside preinitialize(): registers state `name` of `p` with initial value `init`.
  void create_state(const Tensor& p, const std::string& name, const Tensor& init);
  double option(const ParamGroup& g, const std::string& key) const;
  bool enable_global_step_;

 private:
  void setup(std::map<std::string, double> defaults);
  std::vector<ParamGroup> groups_;
  std::map<TensorImpl*, std::map<std::string, Tensor>> state_;
  bool initialized_ = false;
  bool in_preinitialize_ = false;
};

// SGD with momentum, dampening, Nesterov, weight decay and maximize (torch.optim.SGD).
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, double lr, double momentum = 0, double dampening = 0,
      double weight_decay = 0, bool nesterov = false, bool maximize = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override { return {"momentum_buffer"}; }
  std::string name() const override { return "SGD"; }
};

// AdamW with decoupled weight decay and amsgrad (torch.optim.AdamW).
class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 1e-2, bool amsgrad = false, bool maximize = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override {
    return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  }
  std::string name() const override { return "AdamW"; }
};

// Builds an optimizer by class name (case-insensitive). `learning_rate` is an alias of `lr`.
// An unknown type is an error listing the valid names; unknown keys are a warning naming them.
std::unique_ptr<Optimizer> configure_optimizer(const std::string& optimizer_type,
                                               std::vector<Tensor> params, const Config& args);
// The optimizer names configure_optimizer knows.
std::vector<std::string> optimizer_names();

}  // namespace cstorch::optim
