// Counts heap allocations made by the current thread between construction and count(), when
// the binary installs the counting allocator hooks (tests do; see alloc_hooks). Without the
// hooks count() returns -1.
#pragma once
#include <cstdint>

namespace cstorch::runtime {

// Incremented by the test allocator hooks (weak default: no hooks installed).
int64_t* thread_alloc_counter();
bool alloc_hooks_installed();
// True on this thread while an AllocCounter is alive (hooks may report the call site).
bool* thread_in_counted_region();

class AllocCounter {
 public:
  AllocCounter() : start_(alloc_hooks_installed() ? *thread_alloc_counter() : 0) {
    *thread_in_counted_region() = true;
  }
  ~AllocCounter() { *thread_in_counted_region() = false; }
  int64_t count() const { return alloc_hooks_installed() ? *thread_alloc_counter() - start_ : -1; }

 private:
  int64_t start_;
};

}  // namespace cstorch::runtime
