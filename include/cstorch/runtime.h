// Tracing and asynchronous execution of whole training steps.
//
//   auto step = cstorch::trace([&](const cstorch::Batch& b) { ...; return loss; });
//   auto loss = step(batch);   // first call: trace once, compile, run; later: replay
//
// The body runs once per input signature (shapes and dtypes); later calls bind the new batch
// and replay the compiled program on the executor thread, which runs up to `lookahead` steps
// behind the caller. Non-tensor values in the body keep the value they had when it was
// traced. Reading a tensor's value inside the body is an error: use a step closure.
#pragma once
#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cstorch/tensor.h"

namespace cstorch {

// A named batch of tensors (ordered by key).
using Batch = std::map<std::string, Tensor>;

namespace detail {

// Type-erased traced function: flat tensors in, flat tensors out.
class TracedFunction {
 public:
  using Body = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
  TracedFunction(Body body, std::string name);
  ~TracedFunction();
  // Traces and compiles on a new signature, then enqueues one execution. Returns the step's
  // outputs as tensors whose values arrive when the executor has run the step.
  std::vector<Tensor> call(const std::vector<Tensor>& inputs);
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

template <class T>
struct Flat;
template <>
struct Flat<Tensor> {
  static void flatten(const Tensor& t, std::vector<Tensor>& out) { out.push_back(t); }
  static Tensor unflatten(const Tensor& proto, const std::vector<Tensor>& in, size_t& i) {
    return in[i++];
  }
};
template <>
struct Flat<std::vector<Tensor>> {
  static void flatten(const std::vector<Tensor>& v, std::vector<Tensor>& out) {
    out.insert(out.end(), v.begin(), v.end());
  }
  static std::vector<Tensor> unflatten(const std::vector<Tensor>& proto,
                                       const std::vector<Tensor>& in, size_t& i) {
    std::vector<Tensor> r(in.begin() + i, in.begin() + i + proto.size());
    i += proto.size();
    return r;
  }
};
template <>
struct Flat<Batch> {
  static void flatten(const Batch& b, std::vector<Tensor>& out) {
    for (auto& [k, v] : b) out.push_back(v);
  }
  static Batch unflatten(const Batch& proto, const std::vector<Tensor>& in, size_t& i) {
    Batch r;
    for (auto& [k, v] : proto) r[k] = in[i++];
    return r;
  }
};

}  // namespace detail

// The callable returned by trace(). Arguments and results may be Tensor, std::vector<Tensor>
// or Batch; the result may also be void.
template <class F>
class Traced {
 public:
  Traced(F fn, std::string name)
      : fn_(std::make_shared<F>(std::move(fn))),
        name_(std::move(name)),
        args_(std::make_shared<std::shared_ptr<void>>()),
        result_(std::make_shared<std::shared_ptr<void>>()) {}

  template <class... Args>
  auto operator()(const Args&... args) {
    using R = std::invoke_result_t<F&, const Args&...>;
    using Tup = std::tuple<std::decay_t<Args>...>;
    std::vector<Tensor> flat;
    (detail::Flat<std::decay_t<Args>>::flatten(args, flat), ...);
    *args_ = std::make_shared<Tup>(args...);  // structure (keys, sizes) for a (re)trace
    if (!impl_) {
      auto fn = fn_;
      auto args_slot = args_;
      auto result_slot = result_;
      impl_ = std::make_shared<detail::TracedFunction>(
          [fn, args_slot, result_slot](const std::vector<Tensor>& placeholders) {
            const Tup& protos = *std::static_pointer_cast<Tup>(*args_slot);
            size_t i = 0;
            Tup rebuilt = std::apply(
                [&](const auto&... p) {
                  return Tup{
                      detail::Flat<std::decay_t<decltype(p)>>::unflatten(p, placeholders, i)...};
                },
                protos);
            std::vector<Tensor> out;
            if constexpr (std::is_void_v<R>) {
              std::apply(*fn, rebuilt);
            } else {
              R r = std::apply(*fn, rebuilt);
              detail::Flat<R>::flatten(r, out);
              *result_slot = std::make_shared<R>(std::move(r));
            }
            return out;
          },
          name_);
    }
    auto outs = impl_->call(flat);
    if constexpr (!std::is_void_v<R>) {
      size_t i = 0;
      return detail::Flat<R>::unflatten(*std::static_pointer_cast<R>(*result_), outs, i);
    }
  }

 private:
  std::shared_ptr<F> fn_;
  std::string name_;
  std::shared_ptr<std::shared_ptr<void>> args_, result_;
  std::shared_ptr<detail::TracedFunction> impl_;
};

// True on this thread while a traced step's body is being recorded: tensor values cannot be
// read then (host-side checks of batch values must be skipped or moved into kernels).
bool is_tracing();

// Wraps a training (or evaluation) step so it is traced once per input signature, compiled
// and replayed asynchronously. Alias: compile_step.
template <class F>
Traced<F> trace(F fn, std::string name = "step") {
  return Traced<F>(std::move(fn), std::move(name));
}
template <class F>
Traced<F> compile_step(F fn, std::string name = "step") {
  return trace(std::move(fn), std::move(name));
}

// ---------------------------------------------------------------------------------------------
// Step closures: run `fn(args...)` after every step enqueued so far has run, with tensor
// arguments materialised, in order, on the executor thread. Tensors passed in are read when
// the closure runs (an in-place update made before then is what it sees); reading, inside the
// closure, a result of a step queued after it is an error (that step has not run). Inside the
// closure, current_step() is the step it was queued after. When the last copy of the returned
// callable is destroyed while an exception unwinds the stack (a loop left by an error), the
// calls still queued are waited for first, since `fn` may refer to the caller's locals that
// the unwinding destroys next.
namespace detail {
// Returns the executor's id of the queued call.
int64_t enqueue_closure(std::function<void()> fn, std::string what);
// Waits until executor job `job` has run or been dropped after a failure; an error stays for the
// next synchronize(). Returns at once on the executor thread.
void await_job_quietly(int64_t job) noexcept;
class ClosureCalls {
 public:
  ClosureCalls() : exceptions_(std::uncaught_exceptions()) {}
  ~ClosureCalls() {
    if (std::uncaught_exceptions() > exceptions_ && last >= 0) await_job_quietly(last);
  }
  ClosureCalls(const ClosureCalls&) = delete;
  ClosureCalls& operator=(const ClosureCalls&) = delete;
  std::atomic<int64_t> last{-1};

 private:
  int exceptions_;
};
}  // namespace detail
template <class F>
auto step_closure(F fn) {
  return [fn = std::make_shared<F>(std::move(fn)),
          calls = std::make_shared<detail::ClosureCalls>()](auto&&... args) {
    calls->last = detail::enqueue_closure(
        [fn, tup = std::make_tuple(std::decay_t<decltype(args)>(args)...)]() mutable {
          std::apply(*fn, tup);
        },
        "step closure");
  };
}

// Waits for every queued step and closure; rethrows an error raised by any of them.
void synchronize();
// How many steps the executor may run behind the caller (default 2; at least 1).
void set_lookahead(int steps);
// Threads of the shared compute pool (OpenMP and OpenBLAS). Results do not depend on it: work
// is split across threads, but no sum's order follows the thread count, so training gives the
// same bits at any setting (on one machine; CPUs with other instruction sets differ in the last
// bits).
void set_num_threads(int n);
int get_num_threads();
// As torch.set_flush_denormal: when on, f32/f64 denormal inputs read as zero and denormal
// results are flushed to zero (x86 DAZ and FTZ modes), in eager ops and compiled steps alike.
// Off by default, as in PyTorch: results then match PyTorch's exactly, at the cost of slow
// arithmetic once values become denormal (e.g. vanishing gradients in a deep narrow network).
// Returns false, changing nothing, on CPUs without these modes.
bool set_flush_denormal(bool on);
// The step number attached to the next execution (DataExecutor sets it; else a counter).
void set_current_step(int64_t step);
int64_t current_step();

// Counters for tests and benchmarks.
struct RuntimeStats {
  int64_t traces = 0;                       // bodies traced (one per signature)
  int64_t executions = 0;                   // compiled steps run
  int64_t last_step_heap_allocations = -1;  // when allocation counting is enabled (tests)
};
RuntimeStats runtime_stats();

}  // namespace cstorch
