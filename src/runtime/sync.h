// The points where the client waits for the asynchronous executor.
#pragma once
#include <cstdint>

namespace cstorch::runtime {

// When a buffer's contents are ready for the client: after executor job `job` (a step's
// output), or, for a buffer queued steps write (a state tensor), after every queued job.
struct Event {
  int64_t job = -1;
  bool written_by_steps = false;
};
// Waits for what `e` describes (returns at once on the executor thread).
void wait(const Event& e);

// True on the executor's own thread (step closures run there; they never wait on themselves).
bool on_executor_thread();
// On the executor thread: the step number of the job (step or closure) now running, i.e. the
// step that was current when it was queued. Elsewhere -1.
int64_t executing_step();
// Waits until every queued job has run; rethrows a failure of an earlier step.
void synchronize();
// Waits until job `job` has run (or fails as synchronize does).
void wait_for_job(int64_t job);
// Before an eager write of a tensor's value, on the client thread: waits until every step
// closure queued so far has run. A closure reads its tensor arguments when it runs, so in a loop
// that is not traced (nothing queued ahead of the closure) later eager updates would otherwise
// overwrite them first, and a checkpoint closure would save a later step's weights. Returns at
// once on the executor thread or when no closure is pending; a closure's failure stays for the
// next synchronize().
void await_queued_closures();

}  // namespace cstorch::runtime
