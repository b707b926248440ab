// Traceable optimizers. All state is created in preinitialize() (called once, eagerly, before
// the first use of state — even when that first use is inside a traced step); creating state
// anywhere else is an error. step() uses tensor ops only (no branch on a tensor value), so it
// traces into the compiled training step. Learning rates are 0-d tensors per param group, so
// a change (or a scheduler) reaches the compiled step without retracing.
#pragma once
#include <array>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cstorch/config.h"
#include "cstorch/state.h"
#include "cstorch/tensor.h"

namespace cstorch::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  std::map<std::string, double> options;  // hyper-parameters (lr, momentum, ...)
  Tensor lr;                              // 0-d f32 tensor read by step()
  // Other hyper-parameters held as 0-d f32 tensors because a scheduler drives them (see
  // Optimizer::hyper_tensor); step() reads these instead of `options`.
  std::map<std::string, Tensor> tensors;
};

class Optimizer {
 public:
  // `defaults` fill missing per-group options; "lr" is required and must be >= 0.
  // enable_global_step: every parameter gets a 0-d f32 "step" state (created after
  // preinitialize()), advanced by increment_global_step().
  Optimizer(std::vector<Tensor> params, std::map<std::string, double> defaults,
            bool enable_global_step = false);
  Optimizer(std::vector<ParamGroup> groups, std::map<std::string, double> defaults,
            bool enable_global_step = false);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Creates every state tensor via create_state(). Called once by ensure_initialized().
  virtual void preinitialize() = 0;
  // One update from the parameters' .grad (parameters without a gradient are skipped).
  // Implementations call ensure_initialized() first and use tensor ops only.
  virtual void step() = 0;
  // The names of the state tensors that weight sparsity would sparsify along with each
  // parameter (masked where the parameter's weights are pruned, so that pruned weights stay
  // zero), e.g. {"momentum_buffer"} for SGD; every optimizer must say which they are.
  // Recorded only: this project has no weight sparsity (no sparse or masked parameters, no
  // pruning schedule, no sparsity configuration), so nothing here calls this method. What it
  // returns changes no update, no state_dict() and no checkpoint. It is kept, and required of
  // custom optimizers, so that optimizers written against this interface declare the names as
  // they must for a sparsity feature; the built-in lists are checked by the unit tests.
  virtual std::vector<std::string> state_names_to_sparsify() const = 0;
  virtual std::string name() const = 0;

  // Sets every parameter's .grad to none (set_to_none) or to zeros.
  void zero_grad(bool set_to_none = true);
  // Adds a parameter group, as torch.optim's add_param_group: `options` (this optimizer's own
  // names: "lr", "weight_decay", "beta1", "beta2", "momentum", ...; flags as 0 / 1) override
  // the defaults the optimizer was built with, for these parameters only; keys not given take
  // those defaults. The usual use: weight decay off for biases and norms,
  //   AdamW opt(weights, 1e-3); opt.add_param_group(biases_and_norms, {{"weight_decay", 0}});
  // Parameters are numbered across groups in order (state_dict), so a torch optimizer built
  // with the same groups in the same order takes this one's state and the other way round.
  // Errors (naming the group and the key): no parameters; a parameter that is undefined, does
  // not require grad, is not a leaf or is already in a group; a key this optimizer does not
  // have (the valid ones listed); a negative, NaN or infinite lr, weight_decay, eps, momentum
  // or dampening (infinite as f32 too: above 3.4028235e+38), a beta1 / beta2 outside [0, 1);
  // and a call after the optimizer's state exists
  // (its first step(), state_dict() or load_state_dict()): add every group before. A scheduler
  // writes its value to every group, this one included.
  void add_param_group(std::vector<Tensor> params, std::map<std::string, double> options = {});
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // Sets a group's learning rate (writes the lr tensor). A negative, NaN or infinite rate is an
  // error, and so is one above f32's largest value (3.4028235e+38), infinite in the step.
  void set_lr(size_t group, double lr);

  // The 0-d f32 tensor that holds hyper-parameter `key` of `group` ("lr" is the lr tensor).
  // A key other than lr becomes tensor-held on the first call (a scheduler driving
  // weight_decay calls this); from then on step() reads the tensor, so writing it changes a
  // compiled step without retracing (a key read as a fixed number is a constant of the
  // compiled step: changing it traces the step again). Optimizers can read "lr" and
  // "weight_decay" as tensors; asking
  // for a key this optimizer reads as a fixed number, or one the group does not have, is an
  // error naming the key and the group.
  Tensor& hyper_tensor(size_t group, const std::string& key);
  // Keys step() reads through hyper() (so hyper_tensor may drive them).
  virtual std::vector<std::string> schedulable_keys() const { return {"lr", "weight_decay"}; }

  // The state tensor `name` of parameter `p` (runs preinitialize first if needed).
  Tensor& state(const Tensor& p, const std::string& name);
  bool has_state(const Tensor& p, const std::string& name);
  // Runs preinitialize() once (eagerly, even inside a trace) and writes the first value of
  // schedulers that have not written it yet.
  void ensure_initialized();

  // PyTorch's layout of the same optimizer: {"state": {"0": {name: tensor, ...}, ...},
  // "param_groups": [{"lr": ..., <options>, "params": [0, 1, ...]}, ...]}; parameters are
  // numbered across groups in order. Hyper-parameters are named and typed as torch.optim's
  // (see layout()): "betas": [b1, b2] (and "etas", "step_sizes"), booleans as booleans; state
  // tensors carry torch's names, with "step" a 0-d f32 tensor, or an integer where torch keeps
  // an integer. The state tensors are the live ones (as torch's). A .pt save writes the state
  // keys as integers and the pairs as tuples, so torch.optim.<Name>.load_state_dict takes the
  // "optimizer" entry of torch.load(...) as it is (docs/checkpoint-format.md).
  // Reads tensor values, so call it outside a traced step (e.g. in a step closure).
  State state_dict();
  // Copies values from `sd` into this optimizer's state (shapes must match; values are cast
  // to the state's dtype) and restores the groups' hyper-parameters. Reads what state_dict()
  // writes, what torch.optim's state_dict() writes (pairs, booleans, integer steps, None for
  // absent state, and torch's execution switches "foreach", "capturable", "differentiable",
  // "fused" and "initial_lr", which change no update and are ignored when this optimizer has
  // no such option), and the layout of older cstorch checkpoints ("beta1"/"beta2" as numbers,
  // booleans as 0/1). State entries are matched to parameters through the groups' "params"
  // lists, as torch does. Parameters the dict has no state for keep theirs. As in torch, the
  // dict's hyper-parameters replace this optimizer's, and the state kept follows them: a dict
  // of SGD with momentum loaded into SGD without gives it the momentum and its buffers (one
  // without momentum loaded into SGD with drops them). Everything is validated before anything
  // is written; errors name the key path that is wrong (a state no configuration of this kind
  // of optimizer keeps, such as Adam's exp_avg given to SGD, is one). A traced step that read
  // a hyper-parameter the dict changes as a fixed number (momentum, an untensored weight_decay)
  // is traced again at its next call, as after any other change of a group's options.
  void load_state_dict(const State& sd);

  // How state_dict() names and types hyper-parameters so that the dict matches torch.optim's.
  struct Layout {
    // Options held here as 0/1 numbers that the dict holds as booleans.
    std::vector<std::string> bool_options;
    // Two options the dict holds as one pair {pair, first, second}, e.g. {"betas", "beta1",
    // "beta2"}.
    std::vector<std::array<std::string, 3>> pairs;
    // The "step" state is an integer in the dict (torch keeps a Python int for this optimizer).
    bool integer_step = false;
  };
  // Default: the pairs betas (beta1, beta2), etas (etaminus, etaplus) and step_sizes
  // (step_size_min, step_size_max) and the booleans amsgrad, maximize, nesterov, centered,
  // adam, scale_parameter, relative_step and warmup_init, each where the group has them.
  virtual Layout layout() const;

  // Every parameter and state tensor (handles), for GradScaler's skip of non-finite steps.
  std::vector<Tensor> params_and_state();
  // 0-d i64 tensor, 1 when the last step() was applied and 0 when GradScaler skipped it;
  // schedulers advance by it, so a skipped step does not advance the schedule.
  Tensor& step_applied();

  // Schedulers register a callback that writes their first value; ensure_initialized() runs
  // pending ones. Returns an id for remove_start_hook.
  int64_t add_start_hook(std::function<void()> fn);
  void remove_start_hook(int64_t id);

 protected:
  // Only inside preinitialize(): registers state `name` of `p` with initial value `init`.
  void create_state(const Tensor& p, const std::string& name, const Tensor& init);
  // Only inside preinitialize(): a zero tensor shaped like the parameter under each name, for
  // every parameter of every group.
  void create_zero_states(std::initializer_list<const char*> names);
  // A fixed hyper-parameter of the group. An error when the key is tensor-held (see
  // hyper_tensor): read it with hyper() instead.
  double option(const ParamGroup& g, const std::string& key) const;
  // A hyper-parameter as a 0-d f32 tensor: the group's tensor when a scheduler drives it, else
  // a constant (folded by the compiler).
  Tensor hyper(const ParamGroup& g, const std::string& key) const;
  // True when the hyper-parameter is non-zero or tensor-held (so the update term is needed).
  bool active(const ParamGroup& g, const std::string& key) const;
  // Adds one to the "step" state of `p` (enable_global_step) and returns it.
  Tensor increment_global_step(const Tensor& p);
  // One parameter's state as state_dict() writes it (`ps`: name -> tensor, editable), and as
  // load_state_dict() receives it before validation (returns what to load). For state whose
  // representation differs from torch's (SGD's first-step flag); the default changes nothing.
  virtual void state_to_dict(const ParamGroup& g, State& ps) const;
  virtual State state_from_dict(const ParamGroup& g, const State& ps) const;
  bool enable_global_step_;

 private:
  void setup(std::map<std::string, double> defaults);
  // Checks group gi's parameters (against those of the groups before it) and its options,
  // fills the options it lacks from defaults_ and makes its lr tensor.
  void check_group(size_t gi);
  std::map<std::string, double> defaults_;
  // Inside a trace: keys the step by this fixed hyper-parameter (a constant in its graph), so
  // that a step called after it changed (load_state_dict, an edit of the group's options, the
  // key becoming tensor-held) is traced again instead of replaying the old value.
  void note_traced_read(const ParamGroup& g, const std::string& key) const;
  // Lives as long as this optimizer: what a trace's notes check before reading it.
  std::shared_ptr<const int> alive_ = std::make_shared<const int>(0);
  std::vector<ParamGroup> groups_;
  std::map<TensorImpl*, std::map<std::string, Tensor>> state_;
  std::vector<std::string> state_order_;  // state names in creation order
  bool initialized_ = false;
  bool in_preinitialize_ = false;
  Tensor step_applied_;
  std::map<int64_t, std::function<void()>> start_hooks_;
  int64_t next_hook_ = 0;
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

 protected:
  // With dampening, the "initialized" flag is torch's "momentum_buffer is None": the dict
  // holds no buffer before the first step and no flag.
  void state_to_dict(const ParamGroup& g, State& ps) const override;
  State state_from_dict(const ParamGroup& g, const State& ps) const override;
};

// Adam with L2 weight decay, amsgrad and maximize (torch.optim.Adam).
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
       double eps = 1e-8, double weight_decay = 0, bool amsgrad = false, bool maximize = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override {
    return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  }
  std::string name() const override { return "Adam"; }

 protected:
  Adam(std::vector<Tensor> params, double lr, double beta1, double beta2, double eps,
       double weight_decay, bool amsgrad, bool maximize, bool decoupled);
  bool decoupled_ = false;
};

// AdamW with decoupled weight decay and amsgrad (torch.optim.AdamW).
class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 1e-2, bool amsgrad = false, bool maximize = false);
  std::string name() const override { return "AdamW"; }
};

// Adadelta (torch.optim.Adadelta); counts its steps in state "step" as torch does.
class Adadelta : public Optimizer {
 public:
  Adadelta(std::vector<Tensor> params, double lr = 1.0, double rho = 0.9, double eps = 1e-6,
           double weight_decay = 0, bool maximize = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override {
    return {"square_avg", "acc_delta"};
  }
  std::string name() const override { return "Adadelta"; }
  Layout layout() const override;  // "step" is an integer
};

// Adafactor (Shazeer & Stern 2018, as in the reference implementations): factored second
// moments for tensors of rank >= 2, update clipping by RMS, relative step sizes. `lr` must be
// given exactly when relative_step is false.
class Adafactor : public Optimizer {
 public:
  Adafactor(std::vector<Tensor> params, std::optional<double> lr = std::nullopt,
            double eps1 = 1e-30, double eps2 = 1e-3, double clip_threshold = 1.0,
            double decay_rate = -0.8, std::optional<double> beta1 = std::nullopt,
            double weight_decay = 0, bool scale_parameter = true, bool relative_step = true,
            bool warmup_init = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override {
    return {"exp_avg", "exp_avg_sq"};
  }
  std::string name() const override { return "Adafactor"; }
  // With relative_step the rate is computed from the step count and lr is never read: a
  // scheduler driving it is an error (it was accepted and changed nothing).
  std::vector<std::string> schedulable_keys() const override;
};

// Adagrad (torch.optim.Adagrad).
class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, double lr = 1e-2, double lr_decay = 0,
          double weight_decay = 0, double initial_accumulator_value = 0, double eps = 1e-10,
          bool maximize = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override { return {"sum"}; }
  std::string name() const override { return "Adagrad"; }
};

// Adamax (torch.optim.Adamax).
class Adamax : public Optimizer {
 public:
  Adamax(std::vector<Tensor> params, double lr = 2e-3, double beta1 = 0.9, double beta2 = 0.999,
         double eps = 1e-8, double weight_decay = 0, bool maximize = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override {
    return {"exp_avg", "exp_inf"};
  }
  std::string name() const override { return "Adamax"; }
};

// Averaged SGD (torch.optim.ASGD): eta and mu are state tensors computed in the step.
class ASGD : public Optimizer {
 public:
  ASGD(std::vector<Tensor> params, double lr = 1e-2, double lambd = 1e-4, double alpha = 0.75,
       double t0 = 1e6, double weight_decay = 0, bool maximize = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override { return {"ax"}; }
  std::string name() const override { return "ASGD"; }
};

// LAMB (You et al. 2019, Algorithm 2): Adam moments with bias correction, update
// r = m_hat / (sqrt(v_hat) + eps) + wd * p, scaled per parameter by the trust ratio
// ||p|| / ||r|| (1 when either norm is 0). adam = true drops the trust ratio.
class Lamb : public Optimizer {
 public:
  Lamb(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
       double eps = 1e-6, double weight_decay = 0, bool adam = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override {
    return {"exp_avg", "exp_avg_sq"};
  }
  std::string name() const override { return "Lamb"; }
};

// Lion (Chen et al. 2023): p -= lr * (sign(b1*m + (1-b1)*g) + wd*p); m = b2*m + (1-b2)*g.
class Lion : public Optimizer {
 public:
  Lion(std::vector<Tensor> params, double lr = 1e-4, double beta1 = 0.9, double beta2 = 0.99,
       double weight_decay = 0);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override { return {"exp_avg"}; }
  std::string name() const override { return "Lion"; }
};

// NAdam (torch.optim.NAdam).
class NAdam : public Optimizer {
 public:
  NAdam(std::vector<Tensor> params, double lr = 2e-3, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 0, double momentum_decay = 4e-3);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override {
    return {"exp_avg", "exp_avg_sq"};
  }
  std::string name() const override { return "NAdam"; }
};

// RAdam (torch.optim.RAdam); the rectification branch (rho_t > 5) is a where().
class RAdam : public Optimizer {
 public:
  RAdam(std::vector<Tensor> params, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, double weight_decay = 0);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override {
    return {"exp_avg", "exp_avg_sq"};
  }
  std::string name() const override { return "RAdam"; }
};

// RMSprop with momentum and centered variants (torch.optim.RMSprop); counts its steps in
// state "step" as torch does.
class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, double lr = 1e-2, double alpha = 0.99, double eps = 1e-8,
          double weight_decay = 0, double momentum = 0, bool centered = false,
          bool maximize = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override {
    return {"square_avg", "momentum_buffer", "grad_avg"};
  }
  std::string name() const override { return "RMSprop"; }
  Layout layout() const override;  // "step" is an integer
};

// Rprop (torch.optim.Rprop). The learning rate only sets the initial step sizes. Counts its
// steps in state "step" as torch does.
class Rprop : public Optimizer {
 public:
  Rprop(std::vector<Tensor> params, double lr = 1e-2, double etaminus = 0.5, double etaplus = 1.2,
        double step_size_min = 1e-6, double step_size_max = 50, bool maximize = false);
  void preinitialize() override;
  void step() override;
  std::vector<std::string> state_names_to_sparsify() const override {
    return {"prev", "step_size"};
  }
  std::vector<std::string> schedulable_keys() const override { return {}; }
  std::string name() const override { return "Rprop"; }
  Layout layout() const override;  // "step" is an integer
};

// Builds an optimizer by class name (case-insensitive). `learning_rate` is an alias of `lr`.
// An unknown type is an error listing the valid names; so are unknown keys, naming them and the
// valid ones (a warning let a misspelt key train with its default).
std::unique_ptr<Optimizer> configure_optimizer(const std::string& optimizer_type,
                                               std::vector<Tensor> params, const Config& args);
// The optimizer names configure_optimizer knows.
std::vector<std::string> optimizer_names();

}  // namespace cstorch::optim
