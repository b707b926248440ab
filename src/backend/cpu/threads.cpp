// Thread-count control for the shared OpenMP/OpenBLAS pool.
#include <cstdlib>
#include <string_view>

#include "backend/cpu/isa.h"
#include "backend/cpu/parallel.h"

#if defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace cstorch::cpu {

bool cpu_has_avx512() {
  // CSTORCH_CPU_KERNELS=generic leaves the AVX-512 kernels out (OpenBLAS and the generic loops
  // only): to measure what they bring, or to run the path CPUs without AVX-512 take.
  static const bool generic = [] {
    const char* v = std::getenv("CSTORCH_CPU_KERNELS");
    return v && std::string_view(v) == "generic";
  }();
  if (generic) return false;
#if defined(__AVX512F__)
  return true;
#elif CSTORCH_AVX512_KERNELS
  static const bool yes = __builtin_cpu_supports("avx512f");  // checks the OS saves zmm state
  return yes;
#else
  return false;
#endif
}

// OpenBLAS is always called single-threaded from inside our OpenMP team (linalg.cpp splits
// large GEMMs), so the OpenMP thread count is the only setting.
void set_num_threads(int n) {
  if (n <= 0) return;
  omp_set_num_threads(n);
}
int get_num_threads() {
  return omp_get_max_threads();
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
