// Executor implementation (see executor.h) and the client-side synchronisation points.
#include "runtime/executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "cstorch/runtime.h"
#include "ir/device.h"
#include "runtime/checkpoint_steps.h"
#include "runtime/sync.h"

namespace cstorch::runtime {

namespace {
thread_local bool t_on_executor = false;
thread_local int64_t t_job_step = -1;  // step of the job running on this (executor) thread
thread_local int64_t t_job_id = -1;    // its id

// Before a client thread blocks on the executor, it gives up the host threads it keeps idle for
// its own parallel kernels (see DeviceBackend::release_idle_host_threads): while the client
// waits, the executor's team is the only one that works; and the executor, idle for kIdleRelease,
// gives up its own for the client's eager kernels. Called without the executor's lock, since
// ending a pool joins its threads.
void release_idle_host_threads(std::unique_lock<std::mutex>& l) {
  l.unlock();
  ir::device_backend(Device{}).release_idle_host_threads();
  l.lock();
}
constexpr std::chrono::milliseconds kIdleRelease{5};
}  // namespace

Executor& Executor::get() {
  // Never destroyed: the worker may still hold tensors at static-destruction time. Pending
  // work is flushed by an atexit handler instead.
  static Executor* e = [] {
    auto* ex = new Executor();
    std::atexit([] {
      try {
        Executor::get().synchronize();
      } catch (const std::exception& err) {
        std::fprintf(stderr, "cstorch: error in a step still running at exit: %s\n", err.what());
      }
    });
    return ex;
  }();
  return *e;
}

Executor::Executor() : thread_([this] { loop(); }) {}
Executor::~Executor() {
  {
    std::lock_guard<std::mutex> l(m_);
    stop_ = true;
  }
  cv_work_.notify_all();
  thread_.join();
}

void Executor::loop() {
  t_on_executor = true;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> l(m_);
      auto has_work = [&] { return stop_ || !q_.empty(); };
      // Idle for a while (the client is doing other work, eager ops perhaps): the executor's
      // own idle team is ended too, for the same reason as a blocked client's. Not at once, so
      // that a client a little slower than the steps does not restart the team every step.
      if (!cv_work_.wait_for(l, kIdleRelease, has_work)) {
        release_idle_host_threads(l);
        cv_work_.wait(l, has_work);
      }
      if (q_.empty()) return;
      job = std::move(q_.front());
      q_.pop_front();
    }
    std::exception_ptr err;
    t_job_step = job.step;
    t_job_id = job.id;
    try {
      job.fn();
    } catch (const std::exception& e) {
      err = std::make_exception_ptr(StepError(
          job.step, job.what, fmt::format("step {}: {} failed: {}", job.step, job.what, e.what())));
    } catch (...) {
      err = std::make_exception_ptr(
          StepError(job.step, job.what, fmt::format("step {}: {} failed", job.step, job.what)));
    }
    job.fn = nullptr;  // release captured tensors before signalling
    {
      std::lock_guard<std::mutex> l(m_);
      if (job.is_step) {
        --steps_queued_;
        ++executions_;
      }
      done_id_ = job.id;
      if (err) {
        if (!error_) error_ = err;
        // Drop everything queued after the failure: later steps would see broken state.
        for (auto& j : q_) done_id_ = j.id;
        q_.clear();
        steps_queued_ = 0;
      }
    }
    cv_space_.notify_all();
    cv_done_.notify_all();
  }
}

void Executor::rethrow_if_failed() {
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> l(m_);
    e = error_;
    error_ = nullptr;
  }
  if (e) std::rethrow_exception(e);
}

int64_t Executor::enqueue(std::function<void()> fn, bool is_step, int64_t step, std::string what) {
  CS_CHECK(!t_on_executor,
           "a traced step or step closure cannot be started from inside a step closure");
  rethrow_if_failed();
  int64_t id;
  {
    std::unique_lock<std::mutex> l(m_);
    auto has_space = [&] { return steps_queued_ < lookahead_ || error_; };
    if (is_step && !has_space()) release_idle_host_threads(l);
    if (is_step) cv_space_.wait(l, has_space);
    if (error_) {
      l.unlock();
      rethrow_if_failed();
      l.lock();
    }
    id = next_id_++;
    if (is_step) ++steps_queued_;
    q_.push_back(Job{std::move(fn), is_step, step, std::move(what), id});
  }
  cv_work_.notify_one();
  return id;
}

void Executor::wait_for(int64_t job) {
  if (t_on_executor) return;
  await_quietly(job);
  rethrow_if_failed();
}

void Executor::await_quietly(int64_t job) {
  if (t_on_executor) return;
  std::unique_lock<std::mutex> l(m_);
  auto done = [&] { return done_id_ >= job; };
  if (!done()) release_idle_host_threads(l);
  cv_done_.wait(l, done);
}

void Executor::synchronize() {
  int64_t last;
  {
    std::lock_guard<std::mutex> l(m_);
    last = next_id_ - 1;
  }
  wait_for(last);
}

void Executor::set_lookahead(int n) {
  CS_CHECK(n >= 1, "set_lookahead: lookahead must be at least 1 step, got {}", n);
  std::lock_guard<std::mutex> l(m_);
  lookahead_ = n;
}

bool on_executor_thread() {
  return t_on_executor;
}
int64_t executing_step() {
  return t_on_executor ? t_job_step : -1;
}
void synchronize() {
  Executor::get().synchronize();
}
void wait_for_job(int64_t job) {
  Executor::get().wait_for(job);
}
namespace {
std::atomic<int64_t> g_last_closure{-1};  // the executor's id of the last closure queued
void note_closure_queued(int64_t id) {
  int64_t seen = g_last_closure.load(std::memory_order_relaxed);
  while (seen < id && !g_last_closure.compare_exchange_weak(seen, id, std::memory_order_release)) {
  }
}
}  // namespace
void await_queued_closures() {
  if (t_on_executor) return;
  int64_t last = g_last_closure.load(std::memory_order_acquire);
  if (last < 0) return;
  Executor::get().await_quietly(last);
  // It has run: later eager writes return at once, without the executor's lock, until another
  // closure is queued (which a failed exchange leaves in place).
  g_last_closure.compare_exchange_strong(last, -1, std::memory_order_acq_rel);
}
void wait(const Event& e) {
  if (t_on_executor) {
    // Jobs run in the order queued: a result of a job queued after this one has not been
    // computed yet (its buffer holds whatever was there). Reached from a step closure that
    // reads a tensor of a later step (through a variable it captured, not an argument).
    CS_CHECK(e.job < t_job_id,
             "step {}: a step closure reads a result of a step queued after it, which has not run "
             "yet: pass the tensor to the closure as an argument (it is read once its step has "
             "run)",
             t_job_step);
    return;
  }
  if (e.written_by_steps)
    synchronize();
  else if (e.job >= 0)
    wait_for_job(e.job);
}

}  // namespace cstorch::runtime

namespace cstorch {

namespace {
int64_t g_step = 0;
bool g_step_set = false;
}  // namespace

void synchronize() {
  runtime::Executor::get().synchronize();
}
void set_lookahead(int steps) {
  runtime::Executor::get().set_lookahead(steps);
}
// Per-thread settings (OpenMP thread count, denormal modes) are applied here (eager ops) and on
// the executor thread (compiled steps), between executions.
template <class F>
static void on_caller_and_executor(const char* what, F apply) {
  auto& ex = runtime::Executor::get();
  ex.synchronize();
  apply();
  ex.enqueue([apply] { apply(); }, false, current_step(), what);
  ex.synchronize();
}

// Thread count and denormal modes are options of the CPU backend (the host threads that run
// its kernels).
void set_num_threads(int n) {
  CS_CHECK(n >= 1, "set_num_threads: need at least 1 thread, got {}", n);
  on_caller_and_executor("set_num_threads", [n] {
    ir::device_backend(Device{}).apply_thread_settings(ir::HostThreadSettings{.num_threads = n});
  });
}
int get_num_threads() {
  return ir::device_backend(Device{}).host_threads();
}
bool set_flush_denormal(bool on) {
  bool ok = false;  // the same answer on both threads: a property of the CPU
  on_caller_and_executor("set_flush_denormal", [on, &ok] {
    ok = ir::device_backend(Device{}).apply_thread_settings(
        ir::HostThreadSettings{.flush_denormal = on ? 1 : 0});
  });
  return ok;
}
void set_current_step(int64_t step) {
  g_step = step;
  g_step_set = true;
}
int64_t current_step() {
  // A step closure's: the step it was queued after.
  if (runtime::on_executor_thread()) return runtime::executing_step();
  return g_step;
}

namespace detail {
int64_t enqueue_closure(std::function<void()> fn, std::string what) {
  // The step the closure follows: the current one under a DataExecutor (which numbers the steps
  // before running them), else the last step run (the counter names the next one).
  const int64_t step = g_step_set ? g_step : std::max<int64_t>(g_step - 1, 0);
  const int64_t id = runtime::Executor::get().enqueue(
      runtime::bind_checkpoint_schedule(std::move(fn)), false, step, std::move(what));
  runtime::note_closure_queued(id);
  return id;
}
void await_job_quietly(int64_t job) noexcept {
  try {
    runtime::Executor::get().await_quietly(job);
  } catch (...) {
    // Only from locking: nothing to wait for then.
  }
}
// A DataExecutor has finished numbering steps: executions count on from `next`.
void end_step_numbering(int64_t next) {
  g_step = next;
  g_step_set = false;
}
// Step number for the next execution; advances the implicit counter when no DataExecutor
// numbers the steps.
int64_t next_execution_step() {
  if (g_step_set) return g_step;
  return g_step++;
}
}  // namespace detail

}  // namespace cstorch
