// The CUDA backend's block cache (see block_cache.h): plain C++, built in every configuration.
#include "backend/cuda/block_cache.h"

#include "cstorch/core/error.h"

namespace cstorch::cuda {

BlockCache::BlockCache(RawAllocator& raw, std::string device, size_t cache_limit)
    : raw_(raw), device_(std::move(device)), limit_(cache_limit) {}

BlockCache::~BlockCache() {
  std::lock_guard<std::mutex> l(mu_);
  release_cached_locked();
}

size_t BlockCache::round_size(size_t nbytes) {
  constexpr size_t kSmall = 512, kLarge = size_t{2} << 20, kSmallLimit = size_t{1} << 20;
  if (nbytes == 0) return kSmall;
  if (nbytes <= kSmallLimit) return (nbytes + kSmall - 1) / kSmall * kSmall;
  return (nbytes + kLarge - 1) / kLarge * kLarge;
}

void* BlockCache::allocate(size_t nbytes) {
  const size_t n = round_size(nbytes);
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = free_.find(n); it != free_.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    stats_.bytes_cached -= n;
    stats_.bytes_in_use += n;
    stats_.hits++;
    return p;
  }
  void* p = raw_.raw_allocate(n);
  if (!p && stats_.bytes_cached > 0) {
    // Out of memory with blocks of other sizes cached: give them back and try once more.
    release_cached_locked();
    p = raw_.raw_allocate(n);
  }
  if (!p)
    fail("device {}: out of memory allocating {} bytes ({} bytes in use by tensors and programs)",
         device_, nbytes, stats_.bytes_in_use);
  stats_.raw_allocations++;
  stats_.bytes_in_use += n;
  return p;
}

void BlockCache::deallocate(void* p, size_t nbytes) {
  if (!p) return;
  const size_t n = round_size(nbytes);
  std::lock_guard<std::mutex> l(mu_);
  stats_.bytes_in_use -= n;
  if (stats_.bytes_cached + n <= limit_) {
    free_[n].push_back(p);
    stats_.bytes_cached += n;
    return;
  }
  raw_.raw_free(p, n);
  stats_.raw_frees++;
}

void BlockCache::release_cached() {
  std::lock_guard<std::mutex> l(mu_);
  release_cached_locked();
}

void BlockCache::release_cached_locked() {
  for (auto& [n, blocks] : free_) {
    for (void* p : blocks) {
      raw_.raw_free(p, n);
      stats_.raw_frees++;
    }
    stats_.bytes_cached -= n * blocks.size();
    blocks.clear();
  }
  free_.clear();
}

BlockCacheStats BlockCache::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return stats_;
}

}  // namespace cstorch::cuda
