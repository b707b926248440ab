// Counts the heap allocations that compiled steps make, on every thread that works for them:
// the executor thread and the threads of the parallel regions its kernels start (OpenMP
// workers). The counting allocator hooks live in the test binary (tests/alloc), which installs
// them and attributes each allocation with alloc_counted_thread(); without hooks count() is -1.
#pragma once
#include <atomic>
#include <cstdint>

namespace cstorch::runtime {

bool alloc_hooks_installed();
// The process-wide count the hooks increment (only while an AllocCounter is alive).
std::atomic<int64_t>& alloc_count();
// Whether an AllocCounter is alive anywhere.
bool alloc_counting();
// Whether an allocation by the calling thread belongs to a compiled step: the executor thread,
// or a thread inside a parallel region (`in_parallel_region`, as the hook reads it from the
// threading runtime) while a step is counted. The client thread, running ahead, is not counted.
bool alloc_counted_thread(bool in_parallel_region);

class AllocCounter {
 public:
  AllocCounter();
  ~AllocCounter();
  AllocCounter(const AllocCounter&) = delete;
  AllocCounter& operator=(const AllocCounter&) = delete;
  int64_t count() const;

 private:
  int64_t start_;
};

}  // namespace cstorch::runtime
