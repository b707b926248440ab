// Datasets, transforms, sharding, shuffling and batching (see cstorch/data/dataset.h).
#include "cstorch/data/dataset.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "core/splitmix.h"
#include "data/host_tensor.h"

namespace cstorch::data {

namespace {

int64_t st_int(const State& s, const char* key, const char* what) {
  try {
    const State& v = s.at(key);
    CS_CHECK(v.is_int(), "'{}' must be an integer, got {}", key, v.repr());
    return v.as_int();
  } catch (const Error& e) {
    fail("{}: {}", what, e.what());
  }
}

// Row `i` of every tensor of a sample-major batch, as a sample.
Sample row_of(const Batch& data, int64_t i) {
  Sample s;
  for (auto& [k, t] : data) {
    Shape shape(t.shape().begin() + 1, t.shape().end());
    size_t row = static_cast<size_t>(numel(shape)) * itemsize(t.dtype());
    uint8_t* dst = nullptr;
    Tensor o = detail::host_tensor(shape, t.dtype(), &dst);
    std::memcpy(dst, static_cast<const uint8_t*>(t.data_ptr()) + static_cast<size_t>(i) * row, row);
    s[k] = std::move(o);
  }
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

namespace {
Batch collate_named(const std::vector<Sample>& samples, const std::vector<int64_t>* indices);
}  // namespace

Batch Dataset::get_batch(const std::vector<int64_t>& indices) const {
  std::vector<Sample> samples;
  samples.reserve(indices.size());
  for (int64_t i : indices) {
    try {
      samples.push_back(get(i));
    } catch (const std::exception& e) {
      fail("sample {}: {}", i, e.what());
    }
  }
  return collate_named(samples, &indices);
}

namespace {
// collate with each sample named by where it came from: its dataset index and batch position
// when `indices` is given (a map-style dataset's batch: the index finds the bad sample), else
// its position.
Batch collate_named(const std::vector<Sample>& samples, const std::vector<int64_t>* indices) {
  CS_CHECK(!samples.empty(), "collate: no samples");
  auto name = [&](size_t i) {
    return indices ? fmt::format("sample {} (position {} in the batch)", (*indices)[i], i)
                   : fmt::format("sample {}", i);
  };
  const Sample& first = samples[0];
  Batch out;
  for (auto& [k, t0] : first) {
    CS_CHECK(t0.defined(), "collate: {} has an undefined tensor '{}'", name(0), k);
    Shape shape = t0.shape();
    size_t bytes = static_cast<size_t>(t0.numel()) * itemsize(t0.dtype());
    Shape bshape = shape;
    bshape.insert(bshape.begin(), static_cast<int64_t>(samples.size()));
    uint8_t* dst = nullptr;
    Tensor o = detail::host_tensor(bshape, t0.dtype(), &dst);
    for (size_t i = 0; i < samples.size(); ++i) {
      auto it = samples[i].find(k);
      CS_CHECK(it != samples[i].end(), "collate: {} has no '{}' ({} has it)", name(i), k, name(0));
      const Tensor& t = it->second;
      CS_CHECK(t.defined() && t.shape() == shape && t.dtype() == t0.dtype(),
               "collate: '{}' of {} is {}{} but {} has {}{}", k, name(i),
               t.defined() ? dtype_name(t.dtype()) : "undefined",
               t.defined() ? shape_str(t.shape()) : "", name(0), dtype_name(t0.dtype()),
               shape_str(shape));
      std::memcpy(dst + i * bytes, t.data_ptr(), bytes);
    }
    out[k] = std::move(o);
  }
  for (size_t i = 1; i < samples.size(); ++i)
    CS_CHECK(samples[i].size() == first.size(), "collate: {} has {} entries but {} has {}", name(i),
             samples[i].size(), name(0), first.size());
  return out;
}
}  // namespace

Batch collate(const std::vector<Sample>& samples) {
  return collate_named(samples, nullptr);
}

// ---------------------------------------------------------------------------------------------

TensorDataset::TensorDataset(Batch tensors) : data_(std::move(tensors)) {
  CS_CHECK(!data_.empty(), "TensorDataset: no tensors given");
  n_ = -1;
  for (auto& [k, t] : data_) {
    CS_CHECK(t.defined() && t.dim() >= 1, "TensorDataset: tensor '{}' needs a sample dimension", k);
    if (n_ < 0) n_ = t.size(0);
    CS_CHECK(t.size(0) == n_, "TensorDataset: tensor '{}' has {} samples, others have {}", k,
             t.size(0), n_);
    t.data_ptr();  // materialise on the building thread
  }
}

Sample TensorDataset::get(int64_t i) const {
  CS_CHECK(i >= 0 && i < n_, "TensorDataset: index {} is outside 0..{}", i, n_ - 1);
  return row_of(data_, i);
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& idx) const {
  Batch out;
  for (auto& [k, t] : data_) {
    Shape s = t.shape();
    size_t row = static_cast<size_t>(t.numel() / std::max<int64_t>(s[0], 1)) * itemsize(t.dtype());
    s[0] = static_cast<int64_t>(idx.size());
    uint8_t* dst = nullptr;
    Tensor o = detail::host_tensor(s, t.dtype(), &dst);
    auto* src = static_cast<const uint8_t*>(t.data_ptr());
    for (size_t j = 0; j < idx.size(); ++j) {
      CS_CHECK(idx[j] >= 0 && idx[j] < n_, "TensorDataset: index {} is outside 0..{}", idx[j],
               n_ - 1);
      std::memcpy(dst + j * row, src + static_cast<size_t>(idx[j]) * row, row);
    }
    out[k] = std::move(o);
  }
  return out;
}

namespace {
class MappedDataset : public Dataset {
 public:
  MappedDataset(std::shared_ptr<Dataset> inner, Transform fn)
      : inner_(std::move(inner)), fn_(std::move(fn)) {}
  int64_t size() const override { return inner_->size(); }
  Sample get(int64_t i) const override { return fn_(inner_->get(i)); }

 private:
  std::shared_ptr<Dataset> inner_;
  Transform fn_;
};
}  // namespace

std::shared_ptr<Dataset> map(std::shared_ptr<Dataset> inner, Transform fn) {
  CS_CHECK(inner != nullptr, "data::map: dataset is null");
  CS_CHECK(fn != nullptr, "data::map: transform is empty");
  return std::make_shared<MappedDataset>(std::move(inner), std::move(fn));
}

// ---------------------------------------------------------------------------------------------
// Iterable datasets

State IterableDataset::state_dict() const {
  fail("IterableDataset::state_dict: this stream is not restartable");
}
void IterableDataset::load_state_dict(const State&) {
  fail("IterableDataset::load_state_dict: this stream is not restartable");
}

namespace {
class ShardedStream : public IterableDataset {
 public:
  ShardedStream(std::shared_ptr<IterableDataset> inner, WorkerInfo w)
      : inner_(std::move(inner)), w_(w) {}
  std::optional<Sample> next() override {
    for (;;) {
      auto s = inner_->next();
      if (!s) return std::nullopt;
      if (i_++ % w_.num_workers == w_.id) return s;
    }
  }
  void reset() override {
    inner_->reset();
    i_ = 0;
  }
  bool restartable() const override { return inner_->restartable(); }
  State state_dict() const override {
    return State::map({{"index", i_}, {"inner", inner_->state_dict()}});
  }
  void load_state_dict(const State& s) override {
    i_ = st_int(s, "index", "shard.load_state_dict");
    inner_->load_state_dict(s.at("inner"));
  }

 private:
  std::shared_ptr<IterableDataset> inner_;
  WorkerInfo w_;
  int64_t i_ = 0;
};

class MappedStream : public IterableDataset {
 public:
  MappedStream(std::shared_ptr<IterableDataset> inner, Transform fn)
      : inner_(std::move(inner)), fn_(std::move(fn)) {}
  std::optional<Sample> next() override {
    auto s = inner_->next();
    if (!s) return std::nullopt;
    return fn_(std::move(*s));
  }
  void reset() override { inner_->reset(); }
  bool restartable() const override { return inner_->restartable(); }
  State state_dict() const override { return inner_->state_dict(); }
  void load_state_dict(const State& s) override { inner_->load_state_dict(s); }

 private:
  std::shared_ptr<IterableDataset> inner_;
  Transform fn_;
};

class DatasetStream : public IterableDataset {
 public:
  explicit DatasetStream(std::shared_ptr<Dataset> ds) : ds_(std::move(ds)) {}
  std::optional<Sample> next() override {
    if (pos_ >= ds_->size()) return std::nullopt;
    int64_t i = pos_++;
    try {
      return ds_->get(i);
    } catch (const std::exception& e) {
      fail("sample {}: {}", i, e.what());
    }
  }
  void reset() override { pos_ = 0; }
  bool restartable() const override { return true; }
  State state_dict() const override { return State::map({{"position", pos_}}); }
  void load_state_dict(const State& s) override {
    pos_ = st_int(s, "position", "as_iterable.load_state_dict");
  }

 private:
  std::shared_ptr<Dataset> ds_;
  int64_t pos_ = 0;
};
}  // namespace

std::shared_ptr<IterableDataset> shard(std::shared_ptr<IterableDataset> inner, WorkerInfo w) {
  CS_CHECK(inner != nullptr, "data::shard: stream is null");
  CS_CHECK(w.num_workers >= 1 && w.id >= 0 && w.id < w.num_workers,
           "data::shard: invalid worker {} of {}", w.id, w.num_workers);
  return std::make_shared<ShardedStream>(std::move(inner), w);
}
std::shared_ptr<IterableDataset> map(std::shared_ptr<IterableDataset> inner, Transform fn) {
  CS_CHECK(inner != nullptr, "data::map: stream is null");
  CS_CHECK(fn != nullptr, "data::map: transform is empty");
  return std::make_shared<MappedStream>(std::move(inner), std::move(fn));
}
std::shared_ptr<IterableDataset> as_iterable(std::shared_ptr<Dataset> inner) {
  CS_CHECK(inner != nullptr, "data::as_iterable: dataset is null");
  return std::make_shared<DatasetStream>(std::move(inner));
}

// ---------------------------------------------------------------------------------------------
// Order and loaders

std::vector<int64_t> epoch_indices(int64_t n, bool shuffle, uint64_t seed, int64_t epoch,
                                   WorkerInfo w) {
  CS_CHECK(w.num_workers >= 1 && w.id >= 0 && w.id < w.num_workers,
           "epoch_indices: invalid worker {} of {}", w.id, w.num_workers);
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), int64_t{0});
  if (shuffle) {
    uint64_t s = mix64(seed ^ mix64(static_cast<uint64_t>(epoch) + kGoldenGamma));
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(all[static_cast<size_t>(i)],
                all[static_cast<size_t>(splitmix64_next(s) % static_cast<uint64_t>(i + 1))]);
  }
  if (w.num_workers == 1) return all;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(n / w.num_workers + 1));
  for (int64_t i = w.id; i < n; i += w.num_workers) mine.push_back(all[static_cast<size_t>(i)]);
  return mine;
}

DatasetLoader::DatasetLoader(std::shared_ptr<Dataset> ds, LoaderOptions o)
    : DatasetLoader(ds ? ds->size() : 0, std::move(o), "DatasetLoader") {
  CS_CHECK(ds != nullptr, "DatasetLoader: dataset is null");
  ds_ = std::move(ds);
}

DatasetLoader::DatasetLoader(int64_t n, LoaderOptions o, const char* name)
    : n_(n), o_(std::move(o)), name_(name) {
  CS_CHECK(o_.batch_size > 0, "{}: batch_size must be positive, got {}", name_, o_.batch_size);
  CS_CHECK(n_ >= 0, "{}: negative sample count {}", name_, n_);
  order_ = epoch_indices(n_, o_.shuffle, o_.seed, 0, o_.worker);
}

Batch DatasetLoader::fetch(const std::vector<int64_t>& indices, int64_t) const {
  return ds_->get_batch(indices);
}

void DatasetLoader::reset() {
  ++epoch_;
  pos_ = 0;
  order_ = epoch_indices(n_, o_.shuffle, o_.seed, epoch_, o_.worker);
}

int64_t DatasetLoader::size() const {
  int64_t n = static_cast<int64_t>(order_.size());
  return o_.drop_last ? n / o_.batch_size : (n + o_.batch_size - 1) / o_.batch_size;
}

std::optional<Batch> DatasetLoader::next() {
  int64_t n = static_cast<int64_t>(order_.size());
  if (pos_ >= n || (o_.drop_last && pos_ + o_.batch_size > n)) return std::nullopt;
  int64_t b = std::min(o_.batch_size, n - pos_);
  std::vector<int64_t> idx(order_.begin() + pos_, order_.begin() + pos_ + b);
  Batch batch = fetch(idx, epoch_);
  if (o_.batch_transform) batch = o_.batch_transform(std::move(batch));
  pos_ += b;
  samples_ += b;
  return batch;
}

State DatasetLoader::state_dict() const {
  return State::map({{"epoch", epoch_},
                     {"position", pos_},
                     {"samples_streamed", samples_},
                     {"num_samples", n_},
                     {"batch_size", o_.batch_size}});
}

void DatasetLoader::load_state_dict(const State& s) {
  const std::string what = fmt::format("{}.load_state_dict", name_);
  int64_t n = st_int(s, "num_samples", what.c_str()), b = st_int(s, "batch_size", what.c_str());
  CS_CHECK(n == n_ && b == o_.batch_size,
           "{}: the state is of a loader over {} samples in batches of {}, this one has {} "
           "samples in batches of {}",
           what, n, b, n_, o_.batch_size);
  int64_t e = st_int(s, "epoch", what.c_str()), p = st_int(s, "position", what.c_str());
  CS_CHECK(e >= 0, "{}: 'epoch' must be >= 0, got {}", what, e);
  epoch_ = e;
  order_ = epoch_indices(n_, o_.shuffle, o_.seed, epoch_, o_.worker);
  CS_CHECK(p >= 0 && p <= static_cast<int64_t>(order_.size()), "{}: 'position' {} is outside 0..{}",
           what, p, order_.size());
  pos_ = p;
  samples_ = st_int(s, "samples_streamed", what.c_str());
}

IterableLoader::IterableLoader(std::shared_ptr<IterableDataset> stream, LoaderOptions o)
    : stream_(std::move(stream)), o_(std::move(o)) {
  CS_CHECK(stream_ != nullptr, "IterableLoader: stream is null");
  CS_CHECK(o_.batch_size > 0, "IterableLoader: batch_size must be positive, got {}", o_.batch_size);
  CS_CHECK(!o_.shuffle,
           "IterableLoader: shuffle is for map-style datasets (a stream has no random access)");
}

std::optional<Batch> IterableLoader::next() {
  std::vector<Sample> samples;
  while (static_cast<int64_t>(samples.size()) < o_.batch_size) {
    auto s = stream_->next();
    if (!s) break;
    samples.push_back(std::move(*s));
  }
  if (samples.empty()) return std::nullopt;
  if (o_.drop_last && static_cast<int64_t>(samples.size()) < o_.batch_size) return std::nullopt;
  samples_ += static_cast<int64_t>(samples.size());
  Batch batch = collate(samples);
  if (o_.batch_transform) batch = o_.batch_transform(std::move(batch));
  return batch;
}

void IterableLoader::reset() {
  stream_->reset();
}

State IterableLoader::state_dict() const {
  return State::map({{"samples_streamed", samples_}, {"stream", stream_->state_dict()}});
}

void IterableLoader::load_state_dict(const State& s) {
  samples_ = st_int(s, "samples_streamed", "IterableLoader.load_state_dict");
  stream_->load_state_dict(s.at("stream"));
}

}  // namespace cstorch::data
