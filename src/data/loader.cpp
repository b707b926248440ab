// TensorLoader, DataLoader and DataExecutor.
#include <algorithm>
#include <numeric>

#include "core/internal.h"
#include "core/splitmix.h"
#include "cstorch/utils/data.h"

namespace cstorch::detail {
void end_step_numbering(int64_t next);
}

namespace cstorch::utils::data {

namespace {
DataExecutor* g_current = nullptr;
}  // namespace

TensorLoader::TensorLoader(Batch tensors, int64_t batch_size, bool shuffle, uint64_t seed,
                           bool drop_last, WorkerInfo shard)
    : data_(std::move(tensors)),
      batch_(batch_size),
      shuffle_(shuffle),
      drop_last_(drop_last),
      seed_(seed) {
  CS_CHECK(!data_.empty(), "TensorLoader: no tensors given");
  CS_CHECK(batch_size > 0, "TensorLoader: batch_size must be positive, got {}", batch_size);
  int64_t n = -1;
  for (auto& [k, t] : data_) {
    CS_CHECK(t.dim() >= 1, "TensorLoader: tensor '{}' is 0-d; need a sample dimension", k);
    if (n < 0) n = t.size(0);
    CS_CHECK(t.size(0) == n, "TensorLoader: tensor '{}' has {} samples, others have {}", k,
             t.size(0), n);
  }
  CS_CHECK(shard.num_workers >= 1 && shard.id >= 0 && shard.id < shard.num_workers,
           "TensorLoader: invalid worker {} of {}", shard.id, shard.num_workers);
  for (int64_t i = shard.id; i < n; i += shard.num_workers) order_.push_back(i);
  n_ = static_cast<int64_t>(order_.size());
  reset();
}

void TensorLoader::reset() {
  pos_ = 0;
  if (shuffle_) {
    std::sort(order_.begin(), order_.end());
    uint64_t s = seed_ * 1000003ull + static_cast<uint64_t>(epoch_);
    for (int64_t i = n_ - 1; i > 0; --i)
      std::swap(order_[i], order_[splitmix64_next(s) % static_cast<uint64_t>(i + 1)]);
  }
  ++epoch_;
}

int64_t TensorLoader::size() const {
  return drop_last_ ? n_ / batch_ : (n_ + batch_ - 1) / batch_;
}

std::optional<Batch> TensorLoader::next() {
  if (pos_ >= n_ || (drop_last_ && pos_ + batch_ > n_)) return std::nullopt;
  int64_t b = std::min(batch_, n_ - pos_);
  std::vector<int64_t> idx(order_.begin() + pos_, order_.begin() + pos_ + b);
  pos_ += b;
  Batch out;
  Tensor index = from_vector(idx, {b});
  for (auto& [k, t] : data_) out[k] = index_select(t, 0, index);
  return out;
}

DataLoader::DataLoader(InputFn fn, Config args) : fn_(std::move(fn)), args_(std::move(args)) {
  CS_CHECK(fn_ != nullptr, "DataLoader: input_fn is empty");
}

Loader& DataLoader::loader() {
  if (!loader_) {
    loader_ = fn_(args_, WorkerInfo{0, 1});
    CS_CHECK(loader_ != nullptr, "DataLoader: input_fn returned no loader");
  }
  return *loader_;
}

DataExecutor::DataExecutor(DataLoader& loader, ExecutorOptions o)
    : loader_(loader), num_steps_(o.num_steps), ckpt_(o.checkpoint_steps) {
  CS_CHECK(num_steps_ > 0, "DataExecutor: num_steps must be positive, got {}", num_steps_);
  CS_CHECK(ckpt_ >= 0, "DataExecutor: checkpoint_steps must be >= 0, got {}", ckpt_);
  CS_CHECK(g_current == nullptr, "DataExecutor: another DataExecutor is already running");
  g_current = this;
}
DataExecutor::~DataExecutor() {
  finish();
}
// Stops being the current executor and hands step numbering back to the runtime's counter.
void DataExecutor::finish() {
  if (g_current != this) return;
  g_current = nullptr;
  detail::end_step_numbering(step_ + 1);
}
DataExecutor* DataExecutor::current() {
  return g_current;
}

bool DataExecutor::is_checkpoint_step(int64_t s) const {
  if (s == num_steps_ - 1) return true;
  return ckpt_ > 0 && (s + 1) % ckpt_ == 0;
}
std::vector<int64_t> DataExecutor::checkpoint_steps() const {
  std::vector<int64_t> r;
  if (ckpt_ > 0)
    for (int64_t s = ckpt_ - 1; s < num_steps_; s += ckpt_) r.push_back(s);
  if (r.empty() || r.back() != num_steps_ - 1) r.push_back(num_steps_ - 1);
  return r;
}

bool DataExecutor::fetch() {
  if (step_ + 1 >= num_steps_) return false;
  auto& l = loader_.loader();
  auto b = l.next();
  if (!b) {  // re-iterate when the loader runs out
    l.reset();
    b = l.next();
    CS_CHECK(b.has_value(), "DataExecutor: the data loader produced no batches (it is empty)");
  }
  batch_ = std::move(*b);
  ++step_;
  set_current_step(step_);
  return true;
}

DataExecutor::iterator DataExecutor::begin() {
  CS_CHECK(step_ == -1, "DataExecutor: can only be iterated once");
  bool ok = fetch();
  if (!ok) synchronize();
  return iterator(this, !ok);
}

DataExecutor::iterator& DataExecutor::iterator::operator++() {
  if (!ex_->fetch()) {
    end_ = true;
    synchronize();  // the run is over when every step and closure has run
    ex_->finish();
  }
  return *this;
}

}  // namespace cstorch::utils::data

namespace cstorch::detail {
void check_checkpoint_step(const char* what) {
  auto* ex = utils::data::DataExecutor::current();
  CS_CHECK(ex != nullptr,
           "{}: no DataExecutor is running; checkpoint closures run inside a DataExecutor loop",
           what);
  int64_t s = ex->step();
  if (!ex->is_checkpoint_step(s)) {
    auto steps = ex->checkpoint_steps();
    std::string list;
    for (size_t i = 0; i < steps.size() && i < 20; ++i)
      list += (i ? ", " : "") + std::to_string(steps[i]);
    if (steps.size() > 20) list += ", ...";
    fail("{}: step {} is not a checkpoint step; checkpoints can be taken at steps {}", what, s,
         list);
  }
}
}  // namespace cstorch::detail
