// A Model Zoo plugin for the distributed fault tests: registers the callback "FailAtStep"
// ({step: S, rank: R, how: throw|kill|stop, mark: PATH}) that makes world rank R fail when it
// starts training step S, as a crashing replica would: `throw` (default) raises an error,
// `kill` sends the process SIGKILL, `stop` SIGSTOP (a hung replica). The other replicas are then
// waiting in a collective; the launch must stop. With `mark`, the rank first writes the
// CLOCK_MONOTONIC time (seconds) of the failure to PATH, so a test can time the stop from it.
#include <signal.h>
#include <time.h>

#include <cstdio>
#include <fstream>

#include "cstorch/distributed.h"
#include "modelzoo/callback.h"

namespace {

class FailAtStep : public modelzoo::Callback {
 public:
  FailAtStep(int64_t step, int rank, std::string how, std::string mark)
      : step_(step), rank_(rank), how_(std::move(how)), mark_(std::move(mark)) {}
  std::string name() const override { return "FailAtStep"; }
  void on_train_batch_start(modelzoo::Trainer&, const cstorch::Batch&, int64_t step) override {
    if (step != step_ || cstorch::distributed::world_rank() != rank_) return;
    if (!mark_.empty()) {
      timespec ts{};
      clock_gettime(CLOCK_MONOTONIC, &ts);
      std::ofstream(mark_) << fmt::format("{:.6f}\n", ts.tv_sec + ts.tv_nsec * 1e-9);
    }
    if (how_ == "kill") ::raise(SIGKILL);
    if (how_ == "stop") ::raise(SIGSTOP);
    cstorch::fail("FailAtStep: injected failure at step {}", step);
  }

 private:
  int64_t step_;
  int rank_;
  std::string how_, mark_;
};

MODELZOO_REGISTER(callbacks, "FailAtStep",
                  [](const modelzoo::ConfigView& a) -> modelzoo::CallbackPtr {
                    a.check_keys({"step", "rank", "how", "mark"});
                    const std::string how = a.get_string("how", "throw");
                    if (how != "throw" && how != "kill" && how != "stop")
                      a.at("how").error("expected throw, kill or stop, got '" + how + "'");
                    return std::make_shared<FailAtStep>(a.get_int("step", 5),
                                                        static_cast<int>(a.get_int("rank", 1)), how,
                                                        a.get_string("mark", ""));
                  });

}  // namespace
