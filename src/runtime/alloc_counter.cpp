// Per-thread allocation counter used to check that compiled steps run allocation-free.
#include "runtime/alloc_counter.h"

#include <atomic>

namespace cstorch::runtime {

namespace {
thread_local int64_t t_allocs = 0;
thread_local bool t_counted = false;
std::atomic<bool> g_hooks{false};
}  // namespace

int64_t* thread_alloc_counter() {
  return &t_allocs;
}
bool* thread_in_counted_region() {
  return &t_counted;
}
bool alloc_hooks_installed() {
  return g_hooks.load(std::memory_order_relaxed);
}
void set_alloc_hooks_installed(bool on) {
  g_hooks = on;
}

}  // namespace cstorch::runtime
