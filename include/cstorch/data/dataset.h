// Composable datasets: map-style (random access by index) and iterable (a stream), sample
// transforms, sharding by worker, seeded shuffling and batching into a restartable Loader that
// a DataLoader worker owns.
//
//   auto ds = data::map(std::make_shared<data::MnistDataset>(dir, "train"), augment);
//   return std::make_shared<data::DatasetLoader>(ds, data::LoaderOptions{
//       .batch_size = 64, .shuffle = true, .seed = 1, .drop_last = true, .worker = worker});
//
// A sample is a Batch without the batch dimension (name -> tensor); batching stacks samples
// along a new first dimension. Sources: mnist.h (IDX), tokens.h (HDF5 and flat binary token
// files), csv.h.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cstorch/runtime.h"
#include "cstorch/state.h"
#include "cstorch/utils/data.h"

namespace cstorch::data {

using utils::data::WorkerInfo;
using Sample = Batch;  // one sample: name -> tensor, no batch dimension

// Map-style dataset: samples 0..size()-1 by index. Implementations must be safe to call from
// one thread at a time per object (each DataLoader worker builds its own).
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Sample `index` (0 <= index < size(); an error otherwise, naming the index).
  virtual Sample get(int64_t index) const = 0;
  // The samples at `indices`, stacked (each tensor gains a leading batch dimension). The
  // default calls get() for each and collate(); sources override it to fill the batch directly.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const;
};

// Stacks samples along a new first dimension. Errors: no samples, samples with different keys,
// or a key whose tensors differ in shape or dtype (naming the key and the sample position).
Batch collate(const std::vector<Sample>& samples);

// Rows of in-memory tensors (first dimension = sample); tensors must agree on the row count.
class TensorDataset : public Dataset {
 public:
  explicit TensorDataset(Batch tensors);
  int64_t size() const override { return n_; }
  Sample get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

 private:
  Batch data_;
  int64_t n_ = 0;
};

using Transform = std::function<Sample(Sample)>;

// `fn` applied to every sample of `inner` (sample by sample, also when batching).
std::shared_ptr<Dataset> map(std::shared_ptr<Dataset> inner, Transform fn);

// Iterable dataset: a stream of samples, one epoch at a time. A restartable one records its
// position in state_dict() (same contract as utils::data::Loader). After the end of an epoch,
// next() keeps returning nullopt until reset().
class IterableDataset {
 public:
  virtual ~IterableDataset() = default;
  virtual std::optional<Sample> next() = 0;  // nullopt at the end of the epoch
  virtual void reset() = 0;                  // starts the next epoch
  virtual bool restartable() const { return false; }
  virtual State state_dict() const;  // default: error (not restartable)
  virtual void load_state_dict(const State& state);
};

// The stream's samples number i with i % num_workers == worker.id (its shard of each epoch).
// Restartable when `inner` is.
std::shared_ptr<IterableDataset> shard(std::shared_ptr<IterableDataset> inner, WorkerInfo worker);
// `fn` applied to every sample of the stream.
std::shared_ptr<IterableDataset> map(std::shared_ptr<IterableDataset> inner, Transform fn);
// An iterable view of a map-style dataset: samples 0, 1, ..., size()-1 every epoch
// (restartable).
std::shared_ptr<IterableDataset> as_iterable(std::shared_ptr<Dataset> inner);

// Indices worker `w` visits in epoch `epoch` of a data set of n samples: all indices 0..n-1, in a
// permutation drawn from (seed, epoch) when `shuffle`, then every num_workers-th from position
// w.id (the same permutation for every worker, so the shards are disjoint and cover the set).
std::vector<int64_t> epoch_indices(int64_t n, bool shuffle, uint64_t seed, int64_t epoch,
                                   WorkerInfo w);

struct LoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;  // map-style only
  uint64_t seed = 0;
  bool drop_last = false;  // drop a last batch smaller than batch_size
  WorkerInfo worker;       // shard of this loader (map-style; use shard() for streams)
  // Applied to each collated batch (after sample transforms).
  std::function<Batch(Batch)> batch_transform;
};

// Batches of a map-style dataset (see epoch_indices for order and sharding). Restartable:
// state {epoch, position, samples_streamed, num_samples, batch_size}. A failing sample read
// raises an error naming the sample index (the source names its file).
class DatasetLoader : public utils::data::Loader {
 public:
  // Errors: null dataset, batch_size < 1, an invalid worker.
  DatasetLoader(std::shared_ptr<Dataset> dataset, LoaderOptions opts);
  std::optional<Batch> next() override;
  void reset() override;
  int64_t size() const override;
  bool restartable() const override { return true; }
  State state_dict() const override;
  void load_state_dict(const State& state) override;

 protected:
  // For loaders that make their batches themselves (override fetch): `num_samples` samples,
  // `name` in error messages.
  DatasetLoader(int64_t num_samples, LoaderOptions opts, const char* name);
  // The batch of samples `indices` in epoch `epoch` (before batch_transform). The default reads
  // the dataset (the epoch is not needed: a dataset is the same every epoch).
  virtual Batch fetch(const std::vector<int64_t>& indices, int64_t epoch) const;

 private:
  std::shared_ptr<Dataset> ds_;
  int64_t n_;
  LoaderOptions o_;
  const char* name_;
  int64_t epoch_ = 0, pos_ = 0, samples_ = 0;
  std::vector<int64_t> order_;
};

// Batches of a stream: batch_size consecutive samples; at the end of the stream's epoch a
// partial batch is returned unless drop_last. Size unknown (-1). Restartable when the stream
// is: its state is the stream's state after the last batch returned.
class IterableLoader : public utils::data::Loader {
 public:
  IterableLoader(std::shared_ptr<IterableDataset> stream, LoaderOptions opts);
  std::optional<Batch> next() override;
  void reset() override;
  bool restartable() const override { return stream_->restartable(); }
  State state_dict() const override;
  void load_state_dict(const State& state) override;

 private:
  std::shared_ptr<IterableDataset> stream_;
  LoaderOptions o_;
  int64_t samples_ = 0;
};

// Makes sure a data set is in `dir` when every process of a run may want it at once (the
// first multi-replica run on an empty folder): `present()` says whether it is there, `write()`
// writes it. Returns whether this process wrote it. In a replica group of more than one
// (cstorch/distributed.h), replica 0 checks and writes while the others wait at a barrier, then
// each checks for itself (a folder local to another machine gets its own copy); every member
// must call it (replica 0's error is rethrown after the barrier, so nobody is left waiting).
// Checking and writing happen under an exclusive lock on `dir`/.cstorch_data.lock (flock), so
// separate processes that are not one MPI job, and threads, write it once too and never read it
// half written (a read-only folder, where the lock file cannot be created, is only checked). `dir`
// is created if missing. Errors: the folder or lock file cannot be created (naming it); whatever
// write() or present() throws.
bool write_once(const std::string& dir, const std::function<bool()>& present,
                const std::function<void()>& write);

}  // namespace cstorch::data
