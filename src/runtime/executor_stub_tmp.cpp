// TEMPORARY: replaced by executor.cpp
#include "runtime/sync.h"
namespace cstorch::runtime {
__attribute__((weak)) bool on_executor_thread() { return false; }
__attribute__((weak)) void synchronize() {}
__attribute__((weak)) void wait_for_job(int64_t) {}
__attribute__((weak)) bool executor_busy() { return false; }
}
