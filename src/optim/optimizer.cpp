// Optimizer base: param groups, lr tensors, the preinitialize contract, zero_grad.
#include "cstorch/optim/optimizer.h"

#include <set>

#include "core/internal.h"
#include "runtime/trace_context.h"

namespace cstorch::optim {

Optimizer::Optimizer(std::vector<Tensor> params, std::map<std::string, double> defaults,
                     bool enable_global_step)
    : enable_global_step_(enable_global_step) {
  groups_.push_back(ParamGroup{std::move(params), {}, Tensor()});
  setup(std::move(defaults));
}
Optimizer::Optimizer(std::vector<ParamGroup> groups, std::map<std::string, double> defaults,
                     bool enable_global_step)
    : enable_global_step_(enable_global_step), groups_(std::move(groups)) {
  setup(std::move(defaults));
}

void Optimizer::setup(std::map<std::string, double> defaults) {
  CS_CHECK(!groups_.empty(), "optimizer: no parameter groups given");
  std::set<TensorImpl*> seen;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    auto& g = groups_[gi];
    CS_CHECK(!g.params.empty(), "optimizer: parameter group {} is empty", gi);
    for (auto& p : g.params) {
      CS_CHECK(p.defined(), "optimizer: parameter group {} holds an undefined tensor", gi);
      CS_CHECK(p.requires_grad(), "optimizer: parameter '{}' in group {} does not require grad",
               p.name(), gi);
      CS_CHECK(seen.insert(p.impl()).second,
               "optimizer: parameter '{}' appears in more than one place", p.name());
    }
    for (auto& [k, v] : defaults) g.options.emplace(k, v);
    CS_CHECK(g.options.count("lr"), "optimizer: parameter group {} has no learning rate 'lr'", gi);
    CS_CHECK(g.options["lr"] >= 0, "optimizer: invalid learning rate {}", g.options["lr"]);
    runtime::SuspendTrace eager;
    g.lr = scalar_tensor(g.options["lr"], DType::f32);
  }
}

void Optimizer::set_lr(size_t group, double lr) {
  CS_CHECK(group < groups_.size(), "set_lr: group {} out of range ({} groups)", group,
           groups_.size());
  groups_[group].options["lr"] = lr;
  NoGradGuard ng;
  groups_[group].lr.fill_(lr);
}

double Optimizer::option(const ParamGroup& g, const std::string& key) const {
  auto it = g.options.find(key);
  CS_CHECK(it != g.options.end(), "{}: hyper-parameter '{}' is not set", name(), key);
  return it->second;
}

void Optimizer::ensure_initialized() {
  if (initialized_) return;
  runtime::SuspendTrace eager;  // state is real, persistent memory even when first used in a trace
  NoGradGuard ng;
  in_preinitialize_ = true;
  try {
    preinitialize();
  } catch (...) {
    in_preinitialize_ = false;
    throw;
  }
  in_preinitialize_ = false;
  initialized_ = true;
}

void Optimizer::create_state(const Tensor& p, const std::string& nm, const Tensor& init) {
  CS_CHECK(in_preinitialize_,
           "{}: optimizer state '{}' created outside preinitialize(); all state must be created "
           "there so that it exists before the step is traced",
           name(), nm);
  CS_CHECK(!detail::in_trace(), "{}: internal: state '{}' created while tracing", name(), nm);
  Tensor own = zeros(init.shape(), init.dtype());  // own storage: init may share its buffer
  own.copy_(init);
  own.set_name(p.name() + "." + nm);
  state_[p.impl()][nm] = own;
}

bool Optimizer::has_state(const Tensor& p, const std::string& nm) {
  ensure_initialized();
  auto it = state_.find(p.impl());
  return it != state_.end() && it->second.count(nm);
}

Tensor& Optimizer::state(const Tensor& p, const std::string& nm) {
  ensure_initialized();
  auto it = state_.find(p.impl());
  CS_CHECK(it != state_.end() && it->second.count(nm),
           "{}: parameter '{}' has no state '{}' (create it in preinitialize())", name(), p.name(),
           nm);
  return it->second[nm];
}

void Optimizer::zero_grad(bool set_to_none) {
  for (auto& g : groups_)
    for (auto& p : g.params) {
      if (set_to_none) {
        p.impl()->grad.reset();
      } else if (p.impl()->grad) {
        Tensor gr(p.impl()->grad);
        NoGradGuard ng;
        gr.zero_();
      }
    }
}

}  // namespace cstorch::optim
