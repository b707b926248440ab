// A Model Zoo plugin for the distributed fault test: registers the callback "FailAtStep"
// ({step: S, rank: R}) that throws when world rank R starts training step S, as a crashing
// replica would. The other replicas are then waiting in a collective; the launch must stop.
#include "cstorch/distributed.h"
#include "modelzoo/callback.h"

namespace {

class FailAtStep : public modelzoo::Callback {
 public:
  FailAtStep(int64_t step, int rank) : step_(step), rank_(rank) {}
  std::string name() const override { return "FailAtStep"; }
  void on_train_batch_start(modelzoo::Trainer&, const cstorch::Batch&, int64_t step) override {
    if (step == step_ && cstorch::distributed::world_rank() == rank_)
      cstorch::fail("FailAtStep: injected failure at step {}", step);
  }

 private:
  int64_t step_;
  int rank_;
};

MODELZOO_REGISTER(callbacks, "FailAtStep",
                  [](const modelzoo::ConfigView& a) -> modelzoo::CallbackPtr {
                    a.check_keys({"step", "rank"});
                    return std::make_shared<FailAtStep>(a.get_int("step", 5),
                                                        static_cast<int>(a.get_int("rank", 1)));
                  });

}  // namespace
