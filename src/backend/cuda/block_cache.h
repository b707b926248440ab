// The CUDA backend's caching allocator policy, written against an abstract raw allocator so that
// it is plain C++: compiled and unit-tested in every build (tests/unit/device/test_cuda_host.cpp)
// while the raw allocator of a CUDA build is cudaMalloc / cudaFree (device.cu).
//
// Why a cache: cudaMalloc and cudaFree are slow and cudaFree synchronizes the whole device, so a
// training loop must not call them per step. Freed blocks are kept by rounded size and handed out
// again. Reuse is stream-ordered: every kernel and copy of a device runs on that device's one
// stream, so work queued on a block before it was freed runs before any work queued on it after
// it is handed out again; no event per block is needed while there is one stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace cstorch::cuda {

// Where the cache's blocks come from. raw_allocate returns null when the device is out of memory
// (any other failure throws cstorch::Error); raw_free gets back the exact size it was given.
class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  virtual void* raw_allocate(size_t nbytes) = 0;
  virtual void raw_free(void* p, size_t nbytes) = 0;
};

struct BlockCacheStats {
  int64_t raw_allocations = 0;  // calls of raw_allocate that returned memory
  int64_t raw_frees = 0;        // calls of raw_free
  int64_t hits = 0;             // allocations served from the cache
  size_t bytes_in_use = 0;      // rounded bytes handed out and not returned
  size_t bytes_cached = 0;      // rounded bytes of freed blocks kept for reuse
};

class BlockCache {
 public:
  // `device` names the device in errors ("GPU:0"). `cache_limit`: the most bytes of freed
  // blocks kept; beyond it freed blocks go back to the raw allocator.
  BlockCache(RawAllocator& raw, std::string device, size_t cache_limit);
  ~BlockCache();  // returns the cached blocks (blocks in use are the owners' to return)
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // The size a request is served with: 512-byte granularity up to 1 MiB (kernels and cuBLASLt
  // want 256-byte aligned operands; small sizes recur exactly), then 2 MiB granularity (the
  // driver's page size for large allocations), so that a size that varies a little (the last,
  // smaller batch) still hits the cache.
  static size_t round_size(size_t nbytes);

  // A block of at least nbytes. A miss asks the raw allocator; when that reports out of memory,
  // the cached blocks are returned to it and the request tried once more; then the error names
  // the device, the size and the bytes in use.
  void* allocate(size_t nbytes);
  // Returns a block from allocate with the same nbytes.
  void deallocate(void* p, size_t nbytes);
  // Returns every cached block to the raw allocator.
  void release_cached();
  BlockCacheStats stats() const;

 private:
  void release_cached_locked();
  RawAllocator& raw_;
  std::string device_;
  size_t limit_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // rounded size -> freed blocks
  BlockCacheStats stats_;
};

}  // namespace cstorch::cuda
