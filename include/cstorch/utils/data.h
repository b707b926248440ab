// Data loading and the execution loop.
//
//   DataLoader loader(input_fn, {{"batch_size", 64}, {"num_epochs", 2}, {"num_workers", 2}});
//   DataExecutor executor(loader, {.checkpoint_steps = 100});
//   for (const Batch& batch : executor) { auto loss = step(batch); log(loss); }
//   // or, without a DataExecutor (checkpoint_steps from cstorch::configure):
//   for (const Batch& batch : loader) { ... }
//
// DataLoader(input_fn, args): `num_workers` worker threads each call input_fn(args, worker) to
// build their own Loader (so they can shard) and stream its batches into a bounded per-worker
// prefetch queue. The client takes batches from the workers in a fixed round-robin order, so the
// batch sequence is the same for every run whatever the threads' timing. The step arguments
// (num_steps, max_steps, num_epochs, steps_per_epoch, initial_step) and the worker settings are
// read from `args`; everything else is forwarded to input_fn.
//
// DataExecutor(loader, num_steps, checkpoint_steps) numbers the steps, re-iterates the loader
// when an epoch ends, knows the checkpoint steps (k-1, 2k-1, ..., and the last step) and
// measures how long the client waited for data. A range-for over the DataLoader itself runs the
// same loop with the step arguments' number of steps; its checkpoint steps are 0, k, 2k, ...
// and the last step (the steps where `i % checkpoint_steps == 0` for a batch index i counted
// from zero). checkpoint_closure(fn) is a step closure that may only be called at checkpoint
// steps, and cstorch::save() inside any step closure queued by such a loop is refused at a step
// that is not a checkpoint step: weights are fetched at checkpoint steps only.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cstorch/config.h"
#include "cstorch/runtime.h"
#include "cstorch/state.h"

namespace cstorch::utils::data {

// Which worker is building or running a loader: id in 0..num_workers-1.
struct WorkerInfo {
  int id = 0;
  int num_workers = 1;
};

// A source of batches, one epoch at a time. A loader is used by one worker thread only.
class Loader {
 public:
  virtual ~Loader() = default;
  // The next batch of this epoch, or nullopt at its end.
  virtual std::optional<Batch> next() = 0;
  // Starts the next epoch (a shuffling loader draws the next epoch's order).
  virtual void reset() = 0;
  // Batches per epoch (-1 when unknown).
  virtual int64_t size() const { return -1; }
  // A restartable loader records its position so a resumed run continues exactly where it
  // stopped: state_dict() after k next() calls, loaded into a fresh loader built the same way,
  // makes the fresh loader return what the original's next() calls k+1, ... return (across
  // resets too). The defaults raise an error saying the loader is not restartable.
  virtual bool restartable() const { return false; }
  virtual State state_dict() const;
  virtual void load_state_dict(const State& state);
};

// Batches of rows of in-memory tensors (first dim = sample). Worker `shard.id` of
// `shard.num_workers` takes rows id, id+n, id+2n, ...; with `shuffle` those rows are permuted
// anew every epoch from (seed, epoch). A last partial batch is kept unless `drop_last`.
// Restartable: its state is {epoch, position, samples_streamed}.
class TensorLoader : public Loader {
 public:
  // Errors: no tensors, a 0-d tensor, tensors with different sample counts (naming them),
  // batch_size < 1, an invalid worker.
  TensorLoader(Batch tensors, int64_t batch_size, bool shuffle = false, uint64_t seed = 0,
               bool drop_last = false, WorkerInfo shard = {});
  std::optional<Batch> next() override;
  void reset() override;
  int64_t size() const override;
  bool restartable() const override { return true; }
  State state_dict() const override;
  // Errors name the missing or mismatching key (a state from a loader of another size).
  void load_state_dict(const State& state) override;

 private:
  void shuffle_order();
  Batch data_;
  int64_t n_, batch_, pos_ = 0, epoch_ = 0, samples_ = 0;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  std::vector<int64_t> order_;
};

using InputFn =
    std::function<std::shared_ptr<Loader>(const Config& args, const WorkerInfo& worker)>;

// The step arguments of a DataLoader. Unset optionals were not given.
struct StepArgs {
  std::optional<int64_t> num_steps, max_steps, num_epochs, steps_per_epoch;
  int64_t initial_step = 0;
};

// Steps to run: min(num_epochs * steps_per_epoch, num_steps, max_steps - initial_step) over the
// terms whose arguments were given. steps_per_epoch defaults to `loader_length` (batches per
// epoch; -1 when unknown) and may not exceed it. Errors (cstorch::Error):
//   none of num_epochs, num_steps, max_steps: "One of num_epochs, num_steps, or max_steps must
//   be provided"; num_epochs and num_steps both given; initial_step >= max_steps ("initial_step
//   (I) must be less than max_steps (M)..."); a non-positive num_steps, max_steps, num_epochs or
//   steps_per_epoch; a negative initial_step; steps_per_epoch > loader_length; num_epochs
//   without steps_per_epoch when the length is unknown.
int64_t compute_num_steps(const StepArgs& a, int64_t loader_length);

// Reads the step arguments from `args` (integers; null counts as not given). A non-integer
// value is an error naming the key.
StepArgs step_args_from(const Config& args);

class DataLoader {
 public:
  // `args` keys read here (and not forwarded): num_steps, max_steps, num_epochs,
  // steps_per_epoch, initial_step (see StepArgs); num_workers (>= 1; default: the current
  // backend's cluster_config.num_workers_per_csx, else 1); prefetch (batches each worker may
  // have ready ahead of the client, >= 1, default 4). Every other key is passed to input_fn.
  // With more than one replica (cstorch/distributed.h; `num_replicas` / `replica` args override
  // the active group, for tests): num_workers is the cluster's total (default
  // num_workers_per_csx per replica), assigned round-robin — this replica runs workers w with
  // w % num_replicas == replica, each building its loader as worker w of the total; fewer
  // workers than replicas is an error saying how many are needed. An integer `batch_size` is
  // the global batch: input_fn receives this replica's share (distributed::replica_batch_size).
  // Workers start on first use (size(), next(), the DataExecutor), not here.
  explicit DataLoader(InputFn input_fn, Config args = Config::object());
  // Stops and joins the workers (a worker blocked on a full queue is woken).
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  const Config& args() const { return args_; }  // what input_fn receives
  // What data this loader reads, as a map of the settings that decide it (files, split, order;
  // not how fast it is read): the Model Zoo's data processors set their config section. When
  // set, state_dict() records it and load_state_dict() refuses a state of a loader that read
  // other data, naming the settings that differ, so a resumed run does not continue another
  // data set at a position that means nothing there. Null (the default): not checked.
  void set_data_description(Config description) { description_ = std::move(description); }
  const Config& data_description() const { return description_; }
  const StepArgs& step_args() const { return steps_; }
  int num_workers() const { return num_workers_; }  // workers this process runs
  // Multi-replica: the replica this loader feeds, of how many, and its workers' global ids
  // among all `total_workers()`.
  int num_replicas() const { return num_replicas_; }
  int replica() const { return replica_; }
  const std::vector<int>& worker_ids() const { return worker_ids_; }
  int total_workers() const { return total_workers_; }
  int prefetch() const { return prefetch_; }

  // Batches per epoch: the sum of the workers' loader sizes, capped by steps_per_epoch; -1 when
  // a worker's size is unknown and no steps_per_epoch is given. Starts the workers and waits
  // until each has built its loader (an input_fn error is raised here).
  int64_t size();
  // compute_num_steps(step_args(), size()).
  int64_t num_steps();

  // The next batch in round-robin order over the workers (a worker whose epoch has ended is
  // skipped), or nullopt when the epoch has ended: every worker's loader ran out, or
  // steps_per_epoch batches were taken. The call after nullopt starts the next epoch. A worker
  // error is raised here as cstorch::Error "DataLoader worker I of N: ..." (the source's
  // message names the file and sample); the workers are then stopped and every later call
  // raises the same error.
  std::optional<Batch> next();

  // Restartable state: the epoch, batches taken in it, the round-robin position, and per worker
  // its loader's state after the last batch the client took from it, with batches and samples
  // streamed. Called from a step closure (on the executor thread, while the client runs ahead),
  // it returns the state as of the closure's step when a DataExecutor recorded it. Errors: a
  // worker's loader that is not restartable.
  State state_dict();
  // Restores a state_dict(); the next batch is the one the saved run would have taken next.
  // Running workers are stopped and restarted from the state. Errors name the bad key, a
  // worker count different from the saved one, or the data description's settings that differ
  // from the saved one's (both loaders having one).
  void load_state_dict(const State& state);

  // Seconds the client spent blocked in next() waiting for a worker, and batches taken.
  double data_wait_seconds() const { return wait_s_; }
  // next() calls that found the worker's queue empty and had to wait.
  int64_t data_waits() const { return waits_; }
  int64_t batches_taken() const { return total_batches_; }

  // Used by DataExecutor: remember the state after the batch of `step` for closures.
  void record_step(int64_t step);

  // `for (const Batch& b : loader)` runs one loop over num_steps() batches, as a DataExecutor
  // with default options does (see DataExecutor): the steps are numbered initial_step,
  // initial_step + 1, ... (cstorch::current_step() is the current one, so step closures see it),
  // the loader is re-iterated when an epoch ends, and the loop stops after
  // min(num_epochs * steps_per_epoch, num_steps, max_steps - initial_step) batches. Its
  // checkpoint steps, for checkpoint_closure and for cstorch::save() in a step closure, are the
  // steps s with s % checkpoint_steps == 0 and the last step, checkpoint_steps being the one of
  // cstorch::configure() (0 when it was not called: the last step only). The loop state lives in
  // the iterators, so leaving the loop early (break, an exception) ends it; iterating again
  // starts a new loop that continues from the loader's position. Errors: those of DataExecutor
  // (the step arguments, an empty loader, another loop running).
  class iterator;
  iterator begin();
  iterator end();

 private:
  // Batches of one epoch summed over the workers (-1 when a worker's source is unsized).
  int64_t batches_per_epoch();
  struct Item {
    enum Kind { Data, End, Failure } kind = Data;
    int64_t epoch = 0;
    Batch batch;
    std::shared_ptr<const State> state;  // worker state after this item (restartable loaders)
    std::string error;
  };
  struct Worker {
    std::thread thread;
    std::deque<Item> queue;
    // Per-worker signals, so a push wakes only the client and a pop only this worker.
    std::shared_ptr<std::condition_variable> cv_item = std::make_shared<std::condition_variable>();
    std::shared_ptr<std::condition_variable> cv_space = std::make_shared<std::condition_variable>();
    bool created = false;  // loader built (or failed)
    int64_t size = -1;
    bool restartable = false;
    std::string loader_failure;  // input_fn error, reported by size()/next()
    // Client side: state after the last item taken, counts.
    std::shared_ptr<const State> consumed;
    bool done = false;  // its epoch ended (in the client's current epoch)
    int64_t batches = 0, samples = 0;
    std::shared_ptr<const State> pending;  // state to load when the worker starts
  };
  struct Position {  // client position, for state_dict()
    int64_t epoch, batches_in_epoch, total, next;
    std::vector<std::shared_ptr<const State>> consumed;
    std::vector<bool> done;
    std::vector<int64_t> batches, samples;
  };
  void start();
  void stop();
  void run_worker(int w);
  void raise(const std::string& msg);
  Position position() const;
  State to_state(const Position& p) const;

  InputFn fn_;
  Config args_;
  Config description_;  // null: none
  StepArgs steps_;
  int num_workers_ = 1, prefetch_ = 4;
  int num_replicas_ = 1, replica_ = 0, total_workers_ = 1;
  std::vector<int> worker_ids_;  // global id of each local worker
  std::vector<Worker> workers_;
  bool started_ = false;
  std::mutex m_;
  std::condition_variable cv_created_;  // a worker built its loader (or failed)
  bool stop_ = false;
  int64_t min_epoch_ = 0;  // workers skip to this epoch (after a truncated epoch)
  std::string error_;      // sticky failure
  // Client position.
  int64_t epoch_ = 0, batches_in_epoch_ = 0, total_batches_ = 0;
  int next_ = 0;
  double wait_s_ = 0;
  int64_t waits_ = 0;
  // States recorded per step for closures (bounded).
  std::mutex snap_m_;
  std::map<int64_t, Position> snapshots_;
};

struct ExecutorOptions {
  int64_t num_steps = -1;  // -1: from the DataLoader's step arguments
  // k > 0: checkpoints at steps k-1, 2k-1, ... and the last step; 0: the last step only. Not
  // given: the checkpoint_steps of cstorch::configure(), or 0 when it was not called.
  std::optional<int64_t> checkpoint_steps;
};

// Drives a training loop: `for (const Batch& b : executor)` yields num_steps batches, numbering
// them initial_step, initial_step + 1, ... (initial_step from the DataLoader's arguments); the
// loader is re-iterated when an epoch ends. Only one DataExecutor may run at a time.
class DataExecutor {
 public:
  // Errors: num_steps < 1 (given or computed), checkpoint_steps < 0, another DataExecutor
  // running, and the step-argument errors of compute_num_steps.
  DataExecutor(DataLoader& loader, ExecutorOptions opts = {});
  DataExecutor(DataLoader& loader, int64_t num_steps,
               std::optional<int64_t> checkpoint_steps = std::nullopt);
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
  // Fetches the first batch. An empty loader (an epoch without batches) is an error.
  iterator begin();
  iterator end() { return iterator(this, true); }

  int64_t step() const { return step_; }  // step number of the current batch
  int64_t initial_step() const { return initial_; }
  int64_t num_steps() const { return num_steps_; }
  int64_t last_step() const { return initial_ + num_steps_ - 1; }
  // Global step numbers s with (s + 1) % checkpoint_steps == 0, and the last step (for the loop
  // of a range-for over a DataLoader: s % checkpoint_steps == 0, and the last step).
  bool is_checkpoint_step(int64_t step) const;
  std::vector<int64_t> checkpoint_steps() const;
  // Seconds the client waited for the loader during this run (0 when batches were ready).
  double data_wait_seconds() const { return wait_s_; }
  // Steps of this run whose batch was not ready when the client asked for it.
  int64_t data_waits() const { return waits_; }
  // The checkpoint_steps in force, the offset of its rule (checkpoint steps are the s with
  // (s + offset) % checkpoint_steps == 0: 1 here, 0 for a range-for over a DataLoader), and
  // whether it was given in the options or came from cstorch::configure() (neither: 0).
  int64_t checkpoint_interval() const { return ckpt_; }
  int64_t checkpoint_offset() const { return ckpt_offset_; }
  bool checkpoint_given() const { return ckpt_given_; }
  bool checkpoint_from_configure() const { return ckpt_from_configure_; }
  DataLoader& loader() { return loader_; }
  // The running loop (a DataExecutor, or the one of a range-for over a DataLoader), or null.
  static DataExecutor* current();

 private:
  friend class DataLoader;
  // The loop of a range-for over `loader`: checkpoint steps 0, k, 2k, ...
  struct LoaderLoop {};
  DataExecutor(DataLoader& loader, LoaderLoop);
  DataExecutor(DataLoader& loader, ExecutorOptions opts, int64_t checkpoint_offset);
  bool fetch();
  void finish();
  DataLoader& loader_;
  int64_t num_steps_, ckpt_, initial_;
  int64_t ckpt_offset_ = 1;  // checkpoint steps: (s + offset) % ckpt_ == 0
  bool ckpt_given_ = false, ckpt_from_configure_ = false;
  int64_t step_;
  double wait_s_ = 0;
  int64_t waits_ = 0;
  Batch batch_;
};

// The iterator of a range-for over a DataLoader; it owns the loop (see DataLoader::begin).
class DataLoader::iterator {
 public:
  iterator(std::shared_ptr<DataExecutor> loop, DataExecutor::iterator it)
      : loop_(std::move(loop)), it_(it) {}
  const Batch& operator*() const { return *it_; }
  iterator& operator++() {
    ++it_;
    return *this;
  }
  bool operator!=(const iterator& o) const { return it_ != o.it_; }

 private:
  std::shared_ptr<DataExecutor> loop_;
  DataExecutor::iterator it_;
};

}  // namespace cstorch::utils::data

namespace cstorch {

// Runs fn(args...) as a step closure at checkpoint steps of the running loop (a DataExecutor or
// a range-for over a DataLoader); calling it at any other step, or outside such a loop, is an
// error that lists the checkpoint steps and says why weights are fetched only there.
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
