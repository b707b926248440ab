// Thread-count control for the shared OpenMP/OpenBLAS pool.
#include "backend/cpu/parallel.h"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace cstorch::cpu {

// OpenBLAS is always called single-threaded from inside our OpenMP team (linalg.cpp splits
// large GEMMs), so the OpenMP thread count is the only setting.
void set_num_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
}
int get_num_threads() {
  return omp_get_max_threads();
}

void release_thread_pool() {
  // Only this thread's pool: libgomp's host pause frees the caller's pool and leaves every other
  // thread's team (the executor's, mid-step) alone. The thread-count setting is kept.
  if (!omp_in_parallel()) omp_pause_resource_all(omp_pause_soft);
}

bool set_flush_denormal(bool on) {
#if defined(__SSE2__)
  // MXCSR is per thread: set it on this thread and on every thread of its team.
  auto apply = [on] {
    const unsigned bits = 0x8040;  // FTZ (bit 15) | DAZ (bit 6)
    _mm_setcsr(on ? (_mm_getcsr() | bits) : (_mm_getcsr() & ~bits));
  };
  apply();
#pragma omp parallel
  apply();
  return true;
#else
  (void)on;
  return false;
#endif
}

}  // namespace cstorch::cpu
