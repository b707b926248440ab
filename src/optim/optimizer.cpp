// Optimizer base: param groups, lr and other scheduled hyper-parameters as tensors, the
// preinitialize contract, zero_grad, state_dict / load_state_dict.
#include "cstorch/optim/optimizer.h"

#include <algorithm>
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
    g.lr.set_name(fmt::format("param_groups.{}.lr", gi));
  }
  runtime::SuspendTrace eager;
  step_applied_ = scalar_tensor(1, DType::i64);
  step_applied_.set_name("optimizer.step_applied");
}

void Optimizer::set_lr(size_t group, double lr) {
  CS_CHECK(group < groups_.size(), "set_lr: group {} out of range ({} groups)", group,
           groups_.size());
  CS_CHECK(lr >= 0, "{}: invalid learning rate {} for group {} (must be >= 0)", name(), lr, group);
  groups_[group].options["lr"] = lr;
  NoGradGuard ng;
  groups_[group].lr.fill_(lr);
}

Tensor& Optimizer::hyper_tensor(size_t group, const std::string& key) {
  CS_CHECK(group < groups_.size(), "{}: parameter group {} out of range ({} groups)", name(), group,
           groups_.size());
  auto keys = schedulable_keys();
  CS_CHECK(std::find(keys.begin(), keys.end(), key) != keys.end(),
           "{}: hyper-parameter '{}' cannot be driven by a scheduler (this optimizer reads it as "
           "a fixed number); schedulable keys: {}",
           name(), key,
           keys.empty() ? std::string("none") : fmt::format("{}", fmt::join(keys, ", ")));
  ParamGroup& g = groups_[group];
  if (key == "lr") return g.lr;
  auto it = g.tensors.find(key);
  if (it != g.tensors.end()) return it->second;
  auto o = g.options.find(key);
  CS_CHECK(o != g.options.end(), "{}: parameter group {} has no hyper-parameter '{}'", name(),
           group, key);
  runtime::SuspendTrace eager;
  Tensor t = scalar_tensor(o->second, DType::f32);
  t.set_name(fmt::format("param_groups.{}.{}", group, key));
  return g.tensors[key] = t;
}

double Optimizer::option(const ParamGroup& g, const std::string& key) const {
  CS_CHECK(key != "lr" && !g.tensors.count(key),
           "{}: internal: hyper-parameter '{}' is held as a tensor; read it with hyper()", name(),
           key);
  auto it = g.options.find(key);
  CS_CHECK(it != g.options.end(), "{}: hyper-parameter '{}' is not set", name(), key);
  return it->second;
}

Tensor Optimizer::hyper(const ParamGroup& g, const std::string& key) const {
  if (key == "lr") return g.lr;
  auto t = g.tensors.find(key);
  if (t != g.tensors.end()) return t->second;
  return scalar_tensor(option(g, key), DType::f32);
}

bool Optimizer::active(const ParamGroup& g, const std::string& key) const {
  if (key == "lr" || g.tensors.count(key)) return true;
  return option(g, key) != 0;
}

Tensor Optimizer::increment_global_step(const Tensor& p) {
  Tensor& t = state(p, "step");
  t.copy_(t + 1.0);
  return t;
}

Tensor& Optimizer::step_applied() {
  return step_applied_;
}

int64_t Optimizer::add_start_hook(std::function<void()> fn) {
  start_hooks_[next_hook_] = std::move(fn);
  return next_hook_++;
}

void Optimizer::remove_start_hook(int64_t id) {
  start_hooks_.erase(id);
}

void Optimizer::ensure_initialized() {
  while (!start_hooks_.empty()) {  // a hook removes itself when it runs
    auto it = start_hooks_.begin();
    auto fn = it->second;
    start_hooks_.erase(it);
    fn();
  }
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
  if (enable_global_step_) {
    for (auto& g : groups_)
      for (auto& p : g.params)
        if (!state_[p.impl()].count("step")) create_state(p, "step", zeros({}, DType::f32));
  }
  in_preinitialize_ = false;
  initialized_ = true;
}

void Optimizer::create_zero_states(std::initializer_list<const char*> names) {
  for (auto& g : groups_)
    for (auto& p : g.params)
      for (const char* nm : names) create_state(p, nm, zeros_like(p));
}

void Optimizer::create_state(const Tensor& p, const std::string& nm, const Tensor& init) {
  CS_CHECK(in_preinitialize_,
           "{}: optimizer state '{}' created outside preinitialize(); all state must be created "
           "there so that it exists before the step is traced",
           name(), nm);
  CS_CHECK(!detail::in_trace(), "{}: internal: state '{}' created while tracing", name(), nm);
  // Own storage (init may share its buffer), on init's device.
  Tensor own = zeros(init.shape(), init.dtype(), init.device());
  own.copy_(init);
  own.set_name(p.name() + "." + nm);
  state_[p.impl()][nm] = own;
  if (std::find(state_order_.begin(), state_order_.end(), nm) == state_order_.end())
    state_order_.push_back(nm);
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

std::vector<Tensor> Optimizer::params_and_state() {
  ensure_initialized();
  std::vector<Tensor> r;
  for (auto& g : groups_)
    for (auto& p : g.params) {
      r.push_back(p);
      auto it = state_.find(p.impl());
      if (it == state_.end()) continue;
      for (auto& nm : state_order_) {
        auto s = it->second.find(nm);
        if (s != it->second.end()) r.push_back(s->second);
      }
    }
  return r;
}

namespace {
// A host number from a tensor-held hyper-parameter (a sync point).
double host_value(const Tensor& t) {
  return t.item<float>();
}
}  // namespace

State Optimizer::state_dict() {
  CS_CHECK(!detail::in_trace(),
           "{}: state_dict() inside a traced step; call it from a step closure or between steps",
           name());
  ensure_initialized();
  State st = State::map();
  State groups = State::list();
  int64_t index = 0;
  for (auto& g : groups_) {
    State gs = State::map();
    gs.set("lr", host_value(g.lr));
    for (auto& [k, v] : g.options) {
      if (k == "lr") continue;
      auto t = g.tensors.find(k);
      gs.set(k, t != g.tensors.end() ? host_value(t->second) : v);
    }
    State ids = State::list();
    for (auto& p : g.params) {
      auto it = state_.find(p.impl());
      if (it != state_.end() && !it->second.empty()) {
        State ps = State::map();
        for (auto& nm : state_order_) {
          auto s = it->second.find(nm);
          if (s != it->second.end()) ps.set(nm, s->second);
        }
        st.set(std::to_string(index), ps);
      }
      ids.push_back(index++);
    }
    gs.set("params", ids);
    groups.push_back(gs);
  }
  return State::map({{"state", st}, {"param_groups", groups}});
}

void Optimizer::load_state_dict(const State& sd) {
  const std::string who = name() + ".load_state_dict";
  CS_CHECK(!detail::in_trace(), "{}: called inside a traced step", who);
  CS_CHECK(sd.is_map(), "{}: expected a map with keys 'state' and 'param_groups', got {}", who,
           kind_name(sd.kind()));
  CS_CHECK(sd.contains("state") && sd.contains("param_groups"),
           "{}: expected keys 'state' and 'param_groups', got {}", who, sd.repr());
  const State& st = sd.at("state");
  const State& gl = sd.at("param_groups");
  CS_CHECK(st.is_map(), "{}: 'state' must be a map, got {}", who, kind_name(st.kind()));
  CS_CHECK(gl.is_list(), "{}: 'param_groups' must be a list, got {}", who, kind_name(gl.kind()));
  CS_CHECK(gl.size() == groups_.size(), "{}: param_groups has {} groups, this optimizer has {}",
           who, gl.size(), groups_.size());
  ensure_initialized();
  std::vector<Tensor> flat;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const State& gs = gl[gi];
    CS_CHECK(gs.is_map(), "{}: param_groups.{} must be a map", who, gi);
    CS_CHECK(gs.contains("params") && gs.at("params").is_list(),
             "{}: param_groups.{}.params must be a list of parameter indices", who, gi);
    CS_CHECK(gs.at("params").size() == groups_[gi].params.size(),
             "{}: param_groups.{}.params has {} parameters, this optimizer's group has {}", who, gi,
             gs.at("params").size(), groups_[gi].params.size());
    for (auto& p : groups_[gi].params) flat.push_back(p);
  }
  // Validate everything before writing anything, so a bad dict leaves the optimizer as it was.
  for (const auto& key : st.keys()) {
    size_t pos = 0;
    int64_t idx = -1;
    try {
      idx = std::stoll(key, &pos);
    } catch (...) {
    }
    CS_CHECK(pos == key.size() && idx >= 0 && idx < static_cast<int64_t>(flat.size()),
             "{}: state.{}: not a parameter index (0..{})", who, key, flat.size() - 1);
    const State& ps = st.at(key);
    CS_CHECK(ps.is_map(), "{}: state.{} must be a map of state tensors", who, key);
    const Tensor& p = flat[static_cast<size_t>(idx)];
    auto it = state_.find(p.impl());
    for (const auto& nm : ps.keys()) {
      CS_CHECK(it != state_.end() && it->second.count(nm),
               "{}: state.{}.{}: this optimizer has no state '{}' for parameter '{}'", who, key, nm,
               nm, p.name());
      const State& v = ps.at(nm);
      const Tensor& own = it->second.at(nm);
      if (v.is_number()) {
        CS_CHECK(own.numel() == 1, "{}: state.{}.{}: a number for a state of shape {}", who, key,
                 nm, shape_str(own.shape()));
        continue;
      }
      CS_CHECK(v.is_tensor(), "{}: state.{}.{}: expected a tensor, got {}", who, key, nm,
               kind_name(v.kind()));
      CS_CHECK(v.as_tensor().shape() == own.shape(),
               "{}: state.{}.{}: shape {} does not match this optimizer's {}", who, key, nm,
               shape_str(v.as_tensor().shape()), shape_str(own.shape()));
    }
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (const auto& k : gl[gi].keys()) {
      if (k == "params") continue;
      const State& v = gl[gi].at(k);
      CS_CHECK(v.is_number() || v.is_bool(), "{}: param_groups.{}.{}: expected a number, got {}",
               who, gi, k, kind_name(v.kind()));
      CS_CHECK(groups_[gi].options.count(k),
               "{}: param_groups.{}.{}: unknown hyper-parameter for {}", who, gi, k, name());
    }
  NoGradGuard ng;
  for (const auto& key : st.keys()) {
    const Tensor& p = flat[std::stoul(key)];
    const State& ps = st.at(key);
    for (const auto& nm : ps.keys()) {
      Tensor& own = state_.at(p.impl()).at(nm);
      const State& v = ps.at(nm);
      if (v.is_number())
        own.fill_(v.as_double());
      else
        own.copy_(v.as_tensor());
    }
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    ParamGroup& g = groups_[gi];
    for (const auto& k : gl[gi].keys()) {
      if (k == "params") continue;
      const State& v = gl[gi].at(k);
      double d = v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_double();
      if (k == "lr") {
        set_lr(gi, d);
        continue;
      }
      g.options[k] = d;
      auto t = g.tensors.find(k);
      if (t != g.tensors.end()) t->second.fill_(d);
    }
  }
}

}  // namespace cstorch::optim
