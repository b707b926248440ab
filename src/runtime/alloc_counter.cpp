// Allocation counting for the zero-allocation guarantee of compiled steps (alloc_counter.h).
#include "runtime/alloc_counter.h"

#include "runtime/sync.h"

namespace cstorch::runtime {

namespace {
std::atomic<int64_t> g_allocs{0};
std::atomic<int> g_active{0};
std::atomic<bool> g_hooks{false};
}  // namespace

std::atomic<int64_t>& alloc_count() {
  return g_allocs;
}
bool alloc_counting() {
  return g_active.load(std::memory_order_relaxed) > 0;
}
bool alloc_counted_thread(bool in_parallel_region) {
  return alloc_counting() && (on_executor_thread() || in_parallel_region);
}
bool alloc_hooks_installed() {
  return g_hooks.load(std::memory_order_relaxed);
}
void set_alloc_hooks_installed(bool on) {
  g_hooks = on;
}

AllocCounter::AllocCounter() : start_(g_allocs.load()) {
  g_active.fetch_add(1);
}
AllocCounter::~AllocCounter() {
  g_active.fetch_sub(1);
}
int64_t AllocCounter::count() const {
  return alloc_hooks_installed() ? g_allocs.load() - start_ : -1;
}

}  // namespace cstorch::runtime
