// nn::Module: parameters, buffers and submodules registered by name; state_dict with
// PyTorch's dotted keys; train/eval. Layers are used through holders (`Linear(784, 10)`) that
// behave like shared pointers and are callable.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cstorch/state.h"
#include "cstorch/tensor.h"

namespace cstorch::nn {

// Name -> tensor in registration order (PyTorch's OrderedDict).
class StateDict {
 public:
  void insert(const std::string& k, const Tensor& v);
  bool contains(const std::string& k) const { return index_.count(k) > 0; }
  const Tensor& at(const std::string& k) const;  // error names the missing key
  size_t size() const { return items_.size(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }
  std::vector<std::string> keys() const;

  // As a nested State map (key -> tensor), and back (every value must be a tensor; the error
  // names the key that is not).
  State to_state() const;
  static StateDict from_state(const State& s);

 private:
  std::vector<std::pair<std::string, Tensor>> items_;
  std::map<std::string, size_t> index_;
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;

  // The single-input forward; modules with other signatures define their own methods.
  virtual Tensor forward(const Tensor& x);
  Tensor operator()(const Tensor& x) { return forward(x); }

  // Registers a parameter (a leaf that requires grad unless `requires_grad` is false).
  Tensor& register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  // Registers a persistent non-trainable tensor (saved in state_dict).
  Tensor& register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const {
    return children_;
  }

  // Parameters and buffers by dotted name ("0.weight", "fc1.bias").
  StateDict state_dict() const;
  // Copies values in. strict: every key must match both ways. Shapes must match always;
  // errors list the missing / unexpected keys or name the key and both shapes.
  void load_state_dict(const StateDict& sd, bool strict = true);

  virtual void train(bool on = true);
  void eval() { train(false); }
  // Inside a traced step, the mode read is part of the step's key: after train() or eval()
  // changes it, the next call traces the step again for the new mode (each mode's graph is
  // kept), rather than replaying the graph of the mode it was traced in.
  bool is_training() const;
  const std::string& type_name() const { return type_name_; }
  // Moves parameters to a device (CPU: nothing to move).
  virtual void to(Device d);

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> m);

 private:
  void collect(const std::string& prefix, bool recurse, bool params,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// Shared-pointer-like holder with call syntax: `Linear fc(784, 10); y = fc(x); fc->weight`.
template <class Impl>
class ModuleHolder {
 public:
  using ImplType = Impl;
  template <class... Args>
  explicit ModuleHolder(Args&&... args)
      : impl_(std::make_shared<Impl>(std::forward<Args>(args)...)) {}
  ModuleHolder(std::shared_ptr<Impl> p) : impl_(std::move(p)) {}
  // An empty holder, assigned later (a member constructed in the owner's constructor body).
  ModuleHolder(std::nullptr_t) : impl_(nullptr) {}
  Impl* operator->() const { return impl_.get(); }
  Impl& operator*() const { return *impl_; }
  template <class... Args>
  auto operator()(Args&&... args) const {
    return impl_->forward(std::forward<Args>(args)...);
  }
  const std::shared_ptr<Impl>& ptr() const { return impl_; }
  std::shared_ptr<Module> module() const { return impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

#define CSTORCH_MODULE(Name)                                    \
  class Name : public ::cstorch::nn::ModuleHolder<Name##Impl> { \
   public:                                                      \
    using ModuleHolder<Name##Impl>::ModuleHolder;               \
  }

}  // namespace cstorch::nn
