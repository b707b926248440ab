// The Metric base (state tensors, shared input checks) and the registry of live metrics.
#include <algorithm>
#include <cmath>
#include <mutex>

#include "core/internal.h"
#include "cstorch/metrics.h"
#include "cstorch/runtime.h"
#include "runtime/trace_context.h"

namespace cstorch::metrics {

namespace {

struct Registry {
  std::mutex mu;
  std::vector<Metric*> live;  // creation order
};
Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: metrics may outlive static teardown
  return *r;
}

bool name_taken(const std::vector<Metric*>& live, const std::string& n) {
  return std::any_of(live.begin(), live.end(), [&](Metric* m) { return m->name() == n; });
}

}  // namespace

Metric::Metric(std::string kind, std::string name) : kind_(std::move(kind)) {
  CS_CHECK(!name.empty(), "{}: a metric needs a non-empty name", kind_);
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  name_ = base_name_ = name;
  for (int i = 1; name_taken(r.live, name_); ++i) name_ = fmt::format("{}_{}", name, i);
  r.live.push_back(this);
}

Metric::~Metric() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.live.erase(std::remove(r.live.begin(), r.live.end(), this), r.live.end());
}

double Metric::compute() const {
  // A host read: inside a traced step there is no value yet (the error was item()'s, naming
  // an op of the metric's arithmetic, not the metric).
  CS_CHECK(!detail::in_trace(),
           "metric '{}': compute() inside a traced step, where values cannot be read; use "
           "compute_tensor() there (and read it in a step closure), or call compute() after the "
           "loop",
           name());
  return compute_tensor().item<double>();
}

void Metric::reset() {
  for (auto& [n, t] : states_) t.zero_();
}

State Metric::state_dict() const {
  State s = State::map();
  for (const auto& [n, t] : states_) s.set(n, t);
  return s;
}

void Metric::load_state_dict(const State& s) {
  CS_CHECK(s.is_map(), "{}: expected a map of state tensors, got {}", context("load_state_dict"),
           s.repr());
  for (auto& [n, t] : states_) {
    CS_CHECK(s.contains(n), "{}: key '{}' is missing", context("load_state_dict"), n);
    const State& v = s.at(n);
    CS_CHECK(v.is_tensor(), "{}: key '{}' is not a tensor", context("load_state_dict"), n);
    CS_CHECK(v.as_tensor().shape() == t.shape(), "{}: key '{}' has shape {}, expected {}",
             context("load_state_dict"), n, shape_str(v.as_tensor().shape()), shape_str(t.shape()));
    t.copy_(v.as_tensor().to(DType::f32));
  }
}

Tensor Metric::add_state(const std::string& name, const Shape& shape) {
  runtime::SuspendTrace eager;  // persistent memory even when constructed inside a trace
  Tensor t = zeros(shape);
  t.set_name(fmt::format("{}.{}", name_, name));
  states_.emplace_back(name, t);
  return t;
}

void Metric::place_states(Device d) const {
  if (states_.empty() || states_.front().second.device() == d) return;
  runtime::SuspendTrace eager;  // the state lives on; moving it is not part of the step
  for (auto& [n, t] : states_) detail::move_to_device(t, d);
}

Tensor Metric::count_of(const Tensor& like) {
  return full({}, static_cast<double>(like.numel()), DType::f32, like.device());
}

std::string Metric::context(const char* fn) const {
  return fmt::format("{} '{}'.{}", kind_, name_, fn);
}

void Metric::check_defined(const char* arg, const Tensor& t) const {
  CS_CHECK(t.defined(), "{}: {} is an undefined tensor", context("update"), arg);
}

void Metric::check_same_shape(const char* a_name, const Tensor& a, const char* b_name,
                              const Tensor& b) const {
  CS_CHECK(a.shape() == b.shape(), "{}: {} shape {} and {} shape {} differ (they must be equal)",
           context("update"), a_name, shape_str(a.shape()), b_name, shape_str(b.shape()));
}

void Metric::check_integer(const char* arg, const Tensor& t) const {
  CS_CHECK(is_integral(t.dtype()) || t.dtype() == DType::boolean,
           "{}: {} must hold integer class ids (i32, i64 or bool), got dtype {}", context("update"),
           arg, dtype_name(t.dtype()));
}

void Metric::check_floating(const char* arg, const Tensor& t) const {
  CS_CHECK(is_floating(t.dtype()),
           "{}: {} must be a floating tensor (f32, bf16, f16), got dtype {}", context("update"),
           arg, dtype_name(t.dtype()));
}

Tensor Metric::weights_or_ones(const Tensor& weights, const Tensor& like,
                               const char* like_name) const {
  place_states(like.device());
  if (!weights.defined()) return ones(like.shape(), DType::f32, like.device());
  check_same_shape("weights", weights, like_name, like);
  return weights.to(DType::f32);
}

void Metric::check_no_invalid(const Tensor& invalid, const char* what) const {
  double n = invalid.item<double>();
  CS_CHECK(n == 0,
           "{}: {} {} with non-zero weight were outside the valid range since the last "
           "reset (use weight 0 to ignore elements such as padding)",
           context("compute"), static_cast<int64_t>(n), what);
}

// ---------------------------------------------------------------------------------------------

std::vector<Metric*> live_metrics() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.live;
}

Metric* find_metric(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (Metric* m : r.live)
    if (m->name() == name) return m;
  return nullptr;
}

std::map<std::string, double> compute_all(bool reset) {
  synchronize();
  std::map<std::string, double> out;
  auto live = live_metrics();
  for (Metric* m : live) out[m->name()] = m->compute();
  if (reset)
    for (Metric* m : live) m->reset();
  return out;
}

void reset_all() {
  for (Metric* m : live_metrics()) m->reset();
}

}  // namespace cstorch::metrics
