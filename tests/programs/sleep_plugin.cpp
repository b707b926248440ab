// A Model Zoo plugin for tests, loaded with `cszoo --python_paths DIR`: registers the callback
// "SleepEachStep" ({ms: N}) that sleeps N milliseconds after each training batch is queued, so
// a test can kill a run part way through.
#include <chrono>
#include <thread>

#include "modelzoo/callback.h"

namespace {

class SleepEachStep : public modelzoo::Callback {
 public:
  explicit SleepEachStep(int64_t ms) : ms_(ms) {}
  std::string name() const override { return "SleepEachStep"; }
  void on_train_batch_end(modelzoo::Trainer&, const cstorch::Tensor&, int64_t) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
  }

 private:
  int64_t ms_;
};

MODELZOO_REGISTER(callbacks, "SleepEachStep",
                  [](const modelzoo::ConfigView& a) -> modelzoo::CallbackPtr {
                    a.check_keys({"ms"});
                    return std::make_shared<SleepEachStep>(a.get_int("ms", 10));
                  });

}  // namespace
