// The executor: one worker thread that runs compiled steps and step closures from a bounded
// FIFO queue, asynchronously to the caller (the "client"). The client may run `lookahead`
// steps ahead. A failure is recorded with its step and op, the jobs queued after it are
// dropped, and the error is rethrown to the client at its next synchronisation point.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace cstorch::runtime {

class Executor {
 public:
  static Executor& get();
  // Queues `fn`; blocks while `lookahead` steps are already queued. Returns the job id.
  int64_t enqueue(std::function<void()> fn, bool is_step, int64_t step, std::string what);
  void synchronize();
  void wait_for(int64_t job);
  // As wait_for, without rethrowing a failure (it stays for the next synchronize).
  void await_quietly(int64_t job);
  void rethrow_if_failed();  // the client-side check at every enqueue
  void set_lookahead(int n);
  int64_t executions() const { return executions_; }

 private:
  Executor();
  ~Executor();
  struct Job {
    std::function<void()> fn;
    bool is_step;
    int64_t step;
    std::string what;
    int64_t id;
  };
  void loop();

  mutable std::mutex m_;
  std::condition_variable cv_work_, cv_space_, cv_done_;
  std::deque<Job> q_;
  int steps_queued_ = 0;
  int lookahead_ = 2;
  int64_t next_id_ = 0;
  int64_t done_id_ = -1;
  int64_t executions_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cstorch::runtime
