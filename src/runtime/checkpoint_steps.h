// The checkpoint steps of the training loop now running (a DataExecutor, or a range-for over a
// DataLoader): the only steps at which a step closure may fetch the weights to save them.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cstorch::runtime {

struct CheckpointSchedule {
  int64_t first = 0;  // the loop's first and last step numbers
  int64_t last = 0;
  int64_t every = 0;  // checkpoint_steps; 0: the last step only
  // Checkpoint steps are the s with (s + offset) % every == 0, and the last step. A DataExecutor
  // uses 1 (steps k-1, 2k-1, ...: every k-th step counted from one); a range-for over a
  // DataLoader uses 0 (steps 0, k, 2k, ...: the steps `i % checkpoint_steps == 0` of a loop
  // that numbers its batches from zero).
  int64_t offset = 1;
  // Where `every` came from, for messages ("configured in cstorch::configure", ...).
  const char* source = "";

  bool contains(int64_t s) const;
  // Every checkpoint step in order (the last step included).
  std::vector<int64_t> steps() const;
  // Fails with the refusal for a fetch at step `s` by `what`: the step, the checkpoint steps (at
  // most 20 listed), where checkpoint_steps came from, and why weights are fetched only there.
  [[noreturn]] void refuse(const std::string& what, int64_t s) const;
};

// The schedule of the loop now running; null when none runs. Set and read on the client thread.
void set_checkpoint_schedule(std::shared_ptr<const CheckpointSchedule> s);
std::shared_ptr<const CheckpointSchedule> checkpoint_schedule();

// Wraps a step closure queued now: while it runs (on the executor thread) the schedule of the
// loop that queued it is the closure's schedule.
std::function<void()> bind_checkpoint_schedule(std::function<void()> fn);

// Where weights are fetched for a checkpoint (cstorch::save): inside a step closure queued by a
// loop, fails with CheckpointSchedule::refuse unless the closure's step is a checkpoint step of
// that loop. Outside step closures it does nothing (there the save waits for every queued step).
void require_checkpoint_step(const std::string& what);

}  // namespace cstorch::runtime
