// Optimizer base: param groups, lr and other scheduled hyper-parameters as tensors, the
// preinitialize contract, zero_grad, state_dict / load_state_dict.
#include "cstorch/optim/optimizer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <set>
#include <tuple>

#include "core/internal.h"
#include "optim/common.h"
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
  defaults_ = std::move(defaults);
  for (size_t gi = 0; gi < groups_.size(); ++gi) check_group(gi);
  runtime::SuspendTrace eager;
  step_applied_ = scalar_tensor(1, DType::i64);
  step_applied_.set_name("optimizer.step_applied");
}

void Optimizer::check_group(size_t gi) {
  std::set<TensorImpl*> seen;
  for (size_t before = 0; before < gi; ++before)
    for (const auto& p : groups_[before].params) seen.insert(p.impl());
  auto& g = groups_[gi];
  CS_CHECK(!g.params.empty(), "optimizer: parameter group {} is empty", gi);
  for (size_t pi = 0; pi < g.params.size(); ++pi) {
    const Tensor& p = g.params[pi];
    // Named by position (and by name where the tensor has one: a module's parameters are
    // named "weight", "bias"; a bare tensor has no name).
    const std::string which = p.defined() && !p.name().empty()
                                  ? fmt::format("parameter {} ('{}') of group {}", pi, p.name(), gi)
                                  : fmt::format("parameter {} of group {}", pi, gi);
    CS_CHECK(p.defined(), "optimizer: {} is an undefined tensor", which);
    CS_CHECK(p.requires_grad(), "optimizer: {} does not require grad", which);
    // As in PyTorch: a computed tensor (w * 2) gets no .grad of its own, so it never moves.
    CS_CHECK(p.is_leaf(),
             "optimizer: {} is not a leaf tensor (it is computed from others); optimize the "
             "tensors it is computed from",
             which);
    CS_CHECK(seen.insert(p.impl()).second, "optimizer: {} appears in more than one place", which);
  }
  for (auto& [k, v] : defaults_) g.options.emplace(k, v);
  CS_CHECK(g.options.count("lr"), "optimizer: parameter group {} has no learning rate 'lr'", gi);
  // (NaN fails too. The argument is named: it is what an override of the optimizer's block
  // set, and cszoo names the override that set a key an error names.)
  CS_CHECK(impl::nonneg_finite(g.options["lr"]), "optimizer: invalid learning rate {} (lr {})",
           g.options["lr"], impl::nonneg_rule(g.options["lr"]));
  runtime::SuspendTrace eager;
  g.lr = scalar_tensor(g.options["lr"], DType::f32);
  g.lr.set_name(fmt::format("param_groups.{}.lr", gi));
}

void Optimizer::add_param_group(std::vector<Tensor> params, std::map<std::string, double> options) {
  const size_t gi = groups_.size();
  CS_CHECK(!initialized_,
           "{}: add_param_group: the optimizer's state already exists (its first step(), "
           "state_dict() or load_state_dict() created it); add every parameter group before",
           name());
  std::vector<std::string> valid;
  for (const auto& [k, v] : defaults_) valid.push_back(k);
  for (const auto& [k, v] : options) {
    CS_CHECK(defaults_.count(k),
             "{}: add_param_group: group {} has unknown hyper-parameter '{}'; valid keys: {}",
             name(), gi, k, fmt::join(valid, ", "));
    // The constructors' own range checks, for the keys most optimizers share.
    const bool nonneg =
        k == "lr" || k == "weight_decay" || k == "eps" || k == "momentum" || k == "dampening";
    CS_CHECK(!nonneg || impl::nonneg_finite(v), "{}: add_param_group: group {}: invalid {} {} ({})",
             name(), gi, k, v, impl::nonneg_rule(v));
    CS_CHECK(!(k == "beta1" || k == "beta2") || (v >= 0 && v < 1),
             "{}: add_param_group: group {}: invalid {} {} (must be in [0, 1))", name(), gi, k, v);
  }
  groups_.push_back(ParamGroup{std::move(params), std::move(options), Tensor(), {}});
  try {
    check_group(gi);
  } catch (...) {
    groups_.pop_back();  // a refused group leaves the optimizer as it was
    throw;
  }
}

void Optimizer::set_lr(size_t group, double lr) {
  CS_CHECK(group < groups_.size(), "set_lr: group {} out of range ({} groups)", group,
           groups_.size());
  CS_CHECK(impl::nonneg_finite(lr), "{}: invalid learning rate {} for group {} ({})", name(), lr,
           group, impl::nonneg_rule(lr));
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
           "a fixed number, or not at all); schedulable keys: {}",
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
  note_traced_read(g, key);
  return it->second;
}

void Optimizer::note_traced_read(const ParamGroup& g, const std::string& key) const {
  auto* ctx = runtime::TraceContext::current();
  if (!ctx || groups_.empty()) return;
  const ptrdiff_t gi = &g - groups_.data();
  if (gi < 0 || gi >= static_cast<ptrdiff_t>(groups_.size())) return;  // not one of ours
  const double v = g.options.at(key);
  const size_t index = static_cast<size_t>(gi);
  // Compared bit for bit: a NaN option would never equal itself and retrace every call.
  ctx->note_setting(alive_, fmt::format("{}/{}/{}", static_cast<const void*>(this), gi, key),
                    [this, index, key, v] {
                      if (index >= groups_.size()) return false;
                      const ParamGroup& now = groups_[index];
                      auto it = now.options.find(key);
                      return !now.tensors.count(key) && it != now.options.end() &&
                             std::bit_cast<uint64_t>(it->second) == std::bit_cast<uint64_t>(v);
                    });
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
// The value a state dict holds for a tensor-held hyper-parameter: the group's configured
// number where the f32 tensor still holds it (0.001, not the f32 0.0010000000474974513, as
// PyTorch keeps the Python float), else what the tensor holds (a scheduler's value).
double exported_value(const Tensor& t, double configured) {
  const double v = host_value(t);
  return static_cast<float>(configured) == static_cast<float>(v) ? configured : v;
}
}  // namespace

Optimizer::Layout Optimizer::layout() const {
  Layout l;
  const auto& o = groups_.front().options;
  for (const char* b : {"amsgrad", "maximize", "nesterov", "centered", "adam", "scale_parameter",
                        "relative_step", "warmup_init"})
    if (o.count(b)) l.bool_options.push_back(b);
  const std::array<std::string, 3> pairs[] = {{"betas", "beta1", "beta2"},
                                              {"etas", "etaminus", "etaplus"},
                                              {"step_sizes", "step_size_min", "step_size_max"}};
  for (const auto& pr : pairs)
    if (o.count(pr[1]) && o.count(pr[2])) l.pairs.push_back(pr);
  return l;
}

void Optimizer::state_to_dict(const ParamGroup&, State&) const {}
State Optimizer::state_from_dict(const ParamGroup&, const State& ps) const {
  return ps;
}

namespace {
// Keys torch.optim keeps in a param group that choose how an update is computed (kernel
// selection, graph capture, autograd through the step) or what a scheduler started from,
// never what it computes: accepted from torch's dicts and ignored when this optimizer has no
// such option.
bool torch_execution_key(const std::string& k) {
  return k == "foreach" || k == "capturable" || k == "differentiable" || k == "fused" ||
         k == "initial_lr";
}
}  // namespace

State Optimizer::state_dict() {
  CS_CHECK(!detail::in_trace(),
           "{}: state_dict() inside a traced step; call it from a step closure or between steps",
           name());
  ensure_initialized();
  const Layout lay = layout();
  auto is_bool = [&](const std::string& k) {
    return std::find(lay.bool_options.begin(), lay.bool_options.end(), k) != lay.bool_options.end();
  };
  State st = State::map();
  State groups = State::list();
  int64_t index = 0;
  for (auto& g : groups_) {
    State gs = State::map();
    gs.set("lr", exported_value(g.lr, g.options.at("lr")));
    auto value = [&](const std::string& k) {
      auto t = g.tensors.find(k);
      return t != g.tensors.end() ? exported_value(t->second, g.options.at(k)) : g.options.at(k);
    };
    std::set<std::string> paired;
    for (const auto& pr : lay.pairs) paired.insert({pr[1], pr[2]});
    for (auto& [k, v] : g.options) {
      if (k == "lr") continue;
      if (paired.count(k)) {
        for (const auto& pr : lay.pairs)
          if (pr[1] == k) gs.set(pr[0], State(std::vector<State>{value(pr[1]), value(pr[2])}));
        continue;
      }
      if (is_bool(k))
        gs.set(k, value(k) != 0);
      else
        gs.set(k, value(k));
    }
    State ids = State::list();
    for (auto& p : g.params) {
      auto it = state_.find(p.impl());
      if (it != state_.end() && !it->second.empty()) {
        State ps = State::map();
        for (auto& nm : state_order_) {
          auto s = it->second.find(nm);
          if (s == it->second.end()) continue;
          if (nm == "step" && lay.integer_step)
            ps.set(nm, static_cast<int64_t>(std::llround(host_value(s->second))));
          else
            ps.set(nm, s->second);
        }
        state_to_dict(g, ps);
        if (ps.size() > 0) st.set(std::to_string(index), ps);
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
  const Layout lay = layout();
  // The dict's parameter ids (its groups' "params" lists, in order) name this optimizer's
  // parameters in order, as torch's load_state_dict pairs them.
  std::map<std::string, std::pair<size_t, Tensor>> by_id;  // id -> (group, parameter)
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const State& gs = gl[gi];
    CS_CHECK(gs.is_map(), "{}: param_groups.{} must be a map", who, gi);
    CS_CHECK(gs.contains("params") && gs.at("params").is_list(),
             "{}: param_groups.{}.params must be a list of parameter indices", who, gi);
    const State& ids = gs.at("params");
    CS_CHECK(ids.size() == groups_[gi].params.size(),
             "{}: param_groups.{}.params has {} parameters, this optimizer's group has {}", who, gi,
             ids.size(), groups_[gi].params.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      CS_CHECK(ids[i].is_int(), "{}: param_groups.{}.params.{}: expected an integer id, got {}",
               who, gi, i, kind_name(ids[i].kind()));
      CS_CHECK(
          by_id.emplace(std::to_string(ids[i].as_int()), std::make_pair(gi, groups_[gi].params[i]))
              .second,
          "{}: param_groups.{}.params.{}: parameter id {} appears twice", who, gi, i,
          ids[i].as_int());
    }
  }
  // Validate everything before writing anything, so a bad dict leaves the optimizer as it was.
  // Hyper-parameters first: (group, option, value). They decide which state the optimizer keeps.
  std::vector<std::tuple<size_t, std::string, double>> options;
  for (size_t gi = 0; gi < groups_.size(); ++gi)
    for (const auto& k : gl[gi].keys()) {
      if (k == "params") continue;
      const State& v = gl[gi].at(k);
      const auto& own = groups_[gi].options;
      auto pair = std::find_if(lay.pairs.begin(), lay.pairs.end(),
                               [&](const auto& pr) { return pr[0] == k; });
      if (pair != lay.pairs.end() && !own.count(k)) {
        CS_CHECK(v.is_list() && v.size() == 2 && v[0].is_number() && v[1].is_number(),
                 "{}: param_groups.{}.{}: expected a pair of numbers ({}, {}), got {}", who, gi, k,
                 (*pair)[1], (*pair)[2], v.repr());
        options.emplace_back(gi, (*pair)[1], v[0].as_double());
        options.emplace_back(gi, (*pair)[2], v[1].as_double());
        continue;
      }
      if (torch_execution_key(k) && !own.count(k)) continue;
      CS_CHECK(v.is_number() || v.is_bool(), "{}: param_groups.{}.{}: expected a number, got {}",
               who, gi, k, v.repr());
      if (!own.count(k)) {
        // Usually a dict of another kind of optimizer (a checkpoint of SGD resumed with Adam):
        // said, with what the dict has, since the key alone did not say it.
        std::vector<std::string> theirs;
        for (const auto& key : gl[gi].keys())
          if (key != "params") theirs.push_back(key);
        fail(
            "{}: param_groups.{}.{}: unknown hyper-parameter for {} (the dict's group has {}: "
            "the state of another kind of optimizer? This one is {})",
            who, gi, k, name(), fmt::join(theirs, ", "), name());
      }
      options.emplace_back(gi, k, v.is_bool() ? (v.as_bool() ? 1.0 : 0.0) : v.as_double());
    }
  for (const auto& [gi, k, d] : options)
    if (k == "lr")
      CS_CHECK(impl::nonneg_finite(d), "{}: param_groups.{}.lr: invalid learning rate {} ({})", who,
               gi, d, impl::nonneg_rule(d));
  // The groups as they will be: state is read in the layout their options give.
  std::vector<ParamGroup> target = groups_;
  bool reshaped = false;  // an option other than the lr changes: the kept state may change
  for (const auto& [gi, k, d] : options) {
    if (k != "lr" && target[gi].options.at(k) != d) reshaped = true;
    target[gi].options[k] = d;
  }
  // Parameter-shaped state this kind of optimizer keeps under some hyper-parameters only
  // (SGD's momentum_buffer, Adam's max_exp_avg_sq): a dict may hold it where this optimizer
  // does not, as a checkpoint of the same optimizer with momentum does for one without.
  const auto optional_names = state_names_to_sparsify();
  const std::set<std::string> optional(optional_names.begin(), optional_names.end());
  std::vector<std::pair<Tensor, State>> loads;  // parameter, its state as this optimizer holds it
  for (const auto& key : st.keys()) {
    auto found = by_id.find(key);
    CS_CHECK(found != by_id.end(), "{}: state.{}: not a parameter id of param_groups.*.params", who,
             key);
    CS_CHECK(st.at(key).is_map(), "{}: state.{} must be a map of state tensors", who, key);
    const auto& [gi, p] = found->second;
    State ps = state_from_dict(target[gi], st.at(key));
    auto it = state_.find(p.impl());
    for (const auto& nm : ps.keys()) {
      const State& v = ps.at(nm);
      if (v.is_none()) continue;  // torch: no such state yet (SGD without momentum)
      const bool kept = it != state_.end() && it->second.count(nm);
      // What state_from_dict adds of its own layout (SGD's first-step flag) is loaded where
      // the hyper-parameters keep it.
      if (!kept && !st.at(key).contains(nm)) continue;
      if (!kept && !optional.count(nm)) {
        std::vector<std::string> own;
        if (it != state_.end())
          for (const auto& [k, v] : it->second) own.push_back(k);
        fail(
            "{}: state.{}.{}: this optimizer has no state '{}' for parameter '{}' (it keeps {}): "
            "the state of another kind of optimizer?",
            who, key, nm, nm, p.name(),
            own.empty() ? std::string("none") : fmt::format("{}", fmt::join(own, ", ")));
      }
      const Tensor& like = kept ? it->second.at(nm) : p;
      const auto want = like.shape();
      if (v.is_number()) {
        CS_CHECK(like.numel() == 1, "{}: state.{}.{}: a number for a state of shape {}", who, key,
                 nm, shape_str(want));
        continue;
      }
      CS_CHECK(v.is_tensor(), "{}: state.{}.{}: expected a tensor, got {}", who, key, nm,
               kind_name(v.kind()));
      CS_CHECK(v.as_tensor().shape() == want,
               "{}: state.{}.{}: shape {} does not match this optimizer's {}", who, key, nm,
               shape_str(v.as_tensor().shape()), shape_str(want));
    }
    loads.emplace_back(p, std::move(ps));
  }
  NoGradGuard ng;
  for (const auto& [gi, k, d] : options) {
    ParamGroup& g = groups_[gi];
    if (k == "lr") {
      set_lr(gi, d);
      continue;
    }
    g.options[k] = d;
    auto t = g.tensors.find(k);
    if (t != g.tensors.end()) t->second.fill_(d);
  }
  if (reshaped) {
    // As torch's optimizer follows the loaded hyper-parameters, so does the state kept here:
    // preinitialize() again under them decides what is kept (momentum turned on adds buffers,
    // turned off drops them). State kept before stays the same tensors (a traced step may
    // hold them).
    auto before = std::move(state_);
    auto order_before = std::move(state_order_);
    state_.clear();
    state_order_.clear();  // the dict's names in the order these hyper-parameters create them
    runtime::SuspendTrace eager;
    in_preinitialize_ = true;
    try {
      preinitialize();
      if (enable_global_step_)
        for (auto& g : groups_)
          for (auto& p : g.params)
            if (!state_[p.impl()].count("step")) create_state(p, "step", zeros({}, DType::f32));
    } catch (...) {
      in_preinitialize_ = false;
      state_ = std::move(before);
      state_order_ = std::move(order_before);
      throw;
    }
    in_preinitialize_ = false;
    for (auto& [impl, names] : state_) {
      auto old = before.find(impl);
      if (old == before.end()) continue;
      for (auto& [nm, t] : names) {
        auto kept = old->second.find(nm);
        if (kept != old->second.end()) t = kept->second;
      }
    }
  }
  for (const auto& [p, ps] : loads) {
    auto& own_state = state_[p.impl()];
    for (const auto& nm : ps.keys()) {
      const State& v = ps.at(nm);
      if (v.is_none()) continue;
      auto own = own_state.find(nm);
      if (own == own_state.end()) continue;  // optional state these hyper-parameters do not use
      if (v.is_number())
        own->second.fill_(v.as_double());
      else
        own->second.copy_(v.as_tensor().to(own->second.dtype()));
    }
  }
}

}  // namespace cstorch::optim
