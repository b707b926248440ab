// The points where the client waits for the asynchronous executor.
#pragma once
#include <cstdint>

namespace cstorch::runtime {

// True on the executor's own thread (step closures run there; they never wait on themselves).
bool on_executor_thread();
// On the executor thread: the step number of the job (step or closure) now running, i.e. the
// step that was current when it was queued. Elsewhere -1.
int64_t executing_step();
// Waits until every queued job has run; rethrows a failure of an earlier step.
void synchronize();
// Waits until job `job` has run (or fails as synchronize does).
void wait_for_job(int64_t job);

}  // namespace cstorch::runtime
