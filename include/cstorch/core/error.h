// Errors raised by cstorch. Every error is a cstorch::Error whose message says what failed and
// where (op, shape, file, key path or step) so a user can act on it.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace cstorch {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A job that ran behind the user's loop failed: the execution of a traced step, or a step
// closure (checkpoint closures are step closures). Such a failure surfaces at the loop's next
// synchronisation point (the next step, a read of a result, cstorch::synchronize), not at the call
// that queued the job, so the error says which step the job belonged to. what() is "step <step>:
// <job> failed: <cause>".
class StepError : public Error {
 public:
  StepError(int64_t step, std::string job, const std::string& msg)
      : Error(msg), step_(step), job_(std::move(job)) {}
  // The step the failed job belonged to: a traced step's own number (steps count from 1), a step
  // closure's the step it was queued after.
  int64_t step() const { return step_; }
  // What failed, as the message names it: "traced step '<name>'" for an execution of the traced
  // function <name> (cstorch::trace), "step closure" for a step or checkpoint closure.
  const std::string& job() const { return job_; }

 private:
  int64_t step_;
  std::string job_;
};

// Throws cstorch::Error with a fmt-formatted message.
template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

#define CS_CHECK(cond, ...)                    \
  do {                                         \
    if (!(cond)) ::cstorch::fail(__VA_ARGS__); \
  } while (0)

}  // namespace cstorch
