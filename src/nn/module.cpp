// Module registration, traversal, state_dict and load_state_dict.
#include "cstorch/nn/module.h"

#include <set>

#include "core/internal.h"
#include "ir/device.h"
#include "runtime/trace_context.h"

namespace cstorch::nn {

void StateDict::insert(const std::string& k, const Tensor& v) {
  auto it = index_.find(k);
  if (it != index_.end()) {
    items_[it->second].second = v;
    return;
  }
  index_[k] = items_.size();
  items_.push_back({k, v});
}
const Tensor& StateDict::at(const std::string& k) const {
  auto it = index_.find(k);
  CS_CHECK(it != index_.end(), "state_dict: no key '{}'", k);
  return items_[it->second].second;
}
std::vector<std::string> StateDict::keys() const {
  std::vector<std::string> r;
  for (auto& [k, v] : items_) r.push_back(k);
  return r;
}

State StateDict::to_state() const {
  State s = State::map();
  for (const auto& [k, v] : items_) s.set(k, v);
  return s;
}

StateDict StateDict::from_state(const State& s) {
  CS_CHECK(s.is_map(), "state_dict: expected a map of tensors, got a {}", kind_name(s.kind()));
  StateDict d;
  const auto& keys = s.keys();
  for (size_t i = 0; i < keys.size(); ++i) {
    const State& v = s.items()[i];
    CS_CHECK(v.is_tensor(), "state_dict: key '{}' holds a {}, not a tensor", keys[i],
             kind_name(v.kind()));
    d.insert(keys[i], v.as_tensor());
  }
  return d;
}

Tensor Module::forward(const Tensor&) {
  fail("{} has no single-tensor forward(); call its own methods", type_name_);
}

static void check_name(const std::string& name, const std::string& type) {
  CS_CHECK(!name.empty() && name.find('.') == std::string::npos,
           "{}: invalid name '{}' (must be non-empty and contain no '.')", type, name);
}

Tensor& Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_name(name, type_name_);
  for (auto& [k, v] : params_)
    CS_CHECK(k != name, "{}: parameter '{}' registered twice", type_name_, name);
  CS_CHECK(t.defined(), "{}: parameter '{}' is undefined", type_name_, name);
  t = t.detach();
  if (requires_grad) t.set_requires_grad(true);
  t.set_name(name);
  params_.push_back({name, t});
  return params_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor t) {
  check_name(name, type_name_);
  t.set_name(name);
  buffers_.push_back({name, t});
  return buffers_.back().second;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_name(name, type_name_);
  CS_CHECK(m != nullptr, "{}: submodule '{}' is null", type_name_, name);
  for (auto& [k, v] : children_)
    CS_CHECK(k != name, "{}: submodule '{}' registered twice", type_name_, name);
  children_.push_back({name, std::move(m)});
}

void Module::collect(const std::string& prefix, bool recurse, bool params,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (auto& [k, v] : params ? params_ : buffers_) out.push_back({prefix + k, v});
  if (!recurse) return;
  for (auto& [k, m] : children_) m->collect(prefix + k + ".", true, params, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, true, out);
  // A parameter shared by two modules (tied weights) is listed once, like PyTorch.
  std::set<TensorImpl*> seen;
  std::vector<std::pair<std::string, Tensor>> uniq;
  for (auto& p : out)
    if (seen.insert(p.second.impl()).second) uniq.push_back(p);
  return uniq;
}
std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> r;
  for (auto& [k, v] : named_parameters(recurse)) r.push_back(v);
  return r;
}
std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, false, out);
  return out;
}

StateDict Module::state_dict() const {
  StateDict sd;
  std::vector<std::pair<std::string, Tensor>> all;
  collect("", true, true, all);
  collect("", true, false, all);
  for (auto& [k, v] : all) sd.insert(k, v);
  return sd;
}

void Module::load_state_dict(const StateDict& sd, bool strict) {
  std::vector<std::pair<std::string, Tensor>> mine;
  collect("", true, true, mine);
  collect("", true, false, mine);
  std::set<std::string> expected;
  std::vector<std::string> missing, unexpected;
  for (auto& [k, v] : mine) {
    expected.insert(k);
    if (!sd.contains(k)) missing.push_back(k);
  }
  for (auto& [k, v] : sd)
    if (!expected.count(k)) unexpected.push_back(k);
  if (strict && (!missing.empty() || !unexpected.empty())) {
    fail("load_state_dict ({}): missing keys [{}]; unexpected keys [{}]", type_name_,
         fmt::join(missing, ", "), fmt::join(unexpected, ", "));
  }
  for (auto& [k, dst] : mine) {
    if (!sd.contains(k)) continue;
    const Tensor& src = sd.at(k);
    CS_CHECK(
        src.shape() == dst.shape(),
        "load_state_dict ({}): size mismatch for '{}': the checkpoint has shape {}, the model {}",
        type_name_, k, shape_str(src.shape()), shape_str(dst.shape()));
    NoGradGuard ng;
    Tensor d = dst;
    d.copy_(src.dtype() == dst.dtype() ? src : cast(src, dst.dtype()));
  }
}

bool Module::is_training() const {
  if (detail::in_trace())
    runtime::TraceContext::current()->note_mode(weak_from_this(), &training_, training_);
  return training_;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [k, m] : children_) m->train(on);
}

void Module::to(Device d) {
  CS_CHECK(!detail::in_trace(), "{}: to(device) inside a traced step; move the model before",
           type_name_);
  try {
    ir::device_backend(d);
  } catch (const Error& e) {
    fail("{}.to({}): {}", type_name_, device_str(d), e.what());
  }
  // Every holder of a parameter (optimizers, tied modules) shares its TensorImpl, so moving the
  // value under the handle moves it for all of them; a tied parameter is moved once (a second
  // move finds it there). Children move themselves: a module may hold more than its state.
  for (auto& [k, m] : children_) m->to(d);
  for (auto& [k, t] : named_parameters(false)) detail::move_to_device(t, d);
  for (auto& [k, t] : named_buffers(false))
    if (t.defined()) detail::move_to_device(t, d);
}

}  // namespace cstorch::nn
