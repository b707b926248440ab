// Data loading and the execution loop.
//
// DataLoader(input_fn, args): a worker calls input_fn(args, worker) to build its own Loader.
// DataExecutor(loader, {num_steps, checkpoint_steps}) numbers the steps, re-iterates the loader
// when it runs out, and knows the checkpoint steps (k-1, 2k-1, ..., and the last step).
// checkpoint_closure(fn) runs fn at checkpoint steps only (after the step has run).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cstorch/optim/optimizer.h"
#include "cstorch/runtime.h"

namespace cstorch::utils::data {

struct WorkerInfo {
  int id = 0;
  int num_workers = 1;
};

// A source of batches for one epoch at a time.
class Loader {
 public:
  virtual ~Loader() = default;
  // The next batch of this epoch, or nullopt at its end.
  virtual std::optional<Batch> next() = 0;
  // Starts a new epoch.
  virtual void reset() = 0;
  // Batches per epoch (-1 when unknown).
  virtual int64_t size() const { return -1; }
};

// Batches of rows of in-memory tensors (first dim = sample), optionally shuffled with a seed
// (a new permutation every epoch), keeping or dropping a last partial batch.
class TensorLoader : public Loader {
 public:
  TensorLoader(Batch tensors, int64_t batch_size, bool shuffle = false, uint64_t seed = 0,
               bool drop_last = false, WorkerInfo shard = {});
  std::optional<Batch> next() override;
  void reset() override;
  int64_t size() const override;

 private:
  Batch data_;
  int64_t n_, batch_, pos_ = 0, epoch_ = 0;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  std::vector<int64_t> order_;
};

using InputFn =
    std::function<std::shared_ptr<Loader>(const Config& args, const WorkerInfo& worker)>;

class DataLoader {
 public:
  // `args` are forwarded to input_fn; the step arguments (num_steps, ...) are read by the
  // DataExecutor. One worker for now (the worker pool comes with the data pipeline).
  DataLoader(InputFn input_fn, Config args = Config::object());
  Loader& loader();
  const Config& args() const { return args_; }

 private:
  InputFn fn_;
  Config args_;
  std::shared_ptr<Loader> loader_;
};

struct ExecutorOptions {
  int64_t num_steps = -1;
  int64_t checkpoint_steps = 0;  // 0: only... no checkpoints
};

class DataExecutor {
 public:
  DataExecutor(DataLoader& loader, ExecutorOptions opts);
  ~DataExecutor();

  class iterator {
   public:
    iterator(DataExecutor* ex, bool end) : ex_(ex), end_(end) {}
    const Batch& operator*() const { return ex_->batch_; }
    iterator& operator++();
    bool operator!=(const iterator& o) const { return end_ != o.end_; }

   private:
    DataExecutor* ex_;
    bool end_;
  };
  iterator begin();
  iterator end() { return iterator(this, true); }

  int64_t step() const { return step_; }  // 0-based step of the current batch
  int64_t num_steps() const { return num_steps_; }
  bool is_checkpoint_step(int64_t step) const;
  std::vector<int64_t> checkpoint_steps() const;
  static DataExecutor* current();

 private:
  bool fetch();
  void finish();
  DataLoader& loader_;
  int64_t num_steps_, ckpt_;
  int64_t step_ = -1;
  Batch batch_;
};

}  // namespace cstorch::utils::data

namespace cstorch {

// Runs fn(args...) as a step closure at checkpoint steps of the active DataExecutor; calling
// it at any other step is an error listing the checkpoint steps.
namespace detail {
void check_checkpoint_step(const char* what);
}
template <class F>
auto checkpoint_closure(F fn) {
  auto closure = step_closure(std::move(fn));
  return [closure](auto&&... args) {
    detail::check_checkpoint_step("checkpoint_closure");
    closure(std::forward<decltype(args)>(args)...);
  };
}

}  // namespace cstorch
