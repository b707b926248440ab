// Checkpoint steps of the running loop, and the refusal of a weight fetch at any other step.
#include "runtime/checkpoint_steps.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "cstorch/core/error.h"
#include "runtime/sync.h"

namespace cstorch::runtime {

namespace {
std::shared_ptr<const CheckpointSchedule> g_schedule;              // client thread
thread_local std::shared_ptr<const CheckpointSchedule> t_closure;  // executor thread
}  // namespace

namespace {
// The smallest s >= first with (s + offset) % every == 0 (every > 0).
int64_t first_multiple(const CheckpointSchedule& c) {
  return c.first + (c.every - (c.first + c.offset) % c.every) % c.every;
}
}  // namespace

bool CheckpointSchedule::contains(int64_t s) const {
  if (s < first || s > last) return false;
  if (s == last) return true;
  return every > 0 && (s + offset) % every == 0;
}

std::vector<int64_t> CheckpointSchedule::steps() const {
  std::vector<int64_t> r;
  if (every > 0)
    for (int64_t s = first_multiple(*this); s <= last; s += every) r.push_back(s);
  if (r.empty() || r.back() != last) r.push_back(last);
  return r;
}

void CheckpointSchedule::refuse(const std::string& what, int64_t s) const {
  constexpr size_t kListed = 20;
  std::vector<std::string> listed;
  if (every > 0)
    for (int64_t c = first_multiple(*this); c < last; c += every) {
      if (listed.size() == kListed) {
        listed.push_back("...");
        break;
      }
      listed.push_back(std::to_string(c));
    }
  listed.push_back(std::to_string(last));
  const std::string rule =
      every > 0 ? fmt::format("checkpoint_steps={} {}, and the last step", every, source)
                : fmt::format("the last step only, checkpoint_steps being 0 {}", source);
  fail(
      "{}: step {} is not a checkpoint step; checkpoints can be taken at steps {}. It is only "
      "possible to fetch weights on predetermined checkpoint steps ({}); this is so to make "
      "training more performant",
      what, s, fmt::join(listed, ", "), rule);
}

void set_checkpoint_schedule(std::shared_ptr<const CheckpointSchedule> s) {
  g_schedule = std::move(s);
}
std::shared_ptr<const CheckpointSchedule> checkpoint_schedule() {
  return g_schedule;
}

std::function<void()> bind_checkpoint_schedule(std::function<void()> fn) {
  if (!g_schedule) return fn;
  return [fn = std::move(fn), s = g_schedule] {
    struct Scope {
      std::shared_ptr<const CheckpointSchedule> prev;
      ~Scope() { t_closure = std::move(prev); }
    } scope{std::exchange(t_closure, s)};
    fn();
  };
}

void require_checkpoint_step(const std::string& what) {
  if (!on_executor_thread() || !t_closure) return;
  const int64_t s = executing_step();
  if (!t_closure->contains(s)) t_closure->refuse(what, s);
}

}  // namespace cstorch::runtime
