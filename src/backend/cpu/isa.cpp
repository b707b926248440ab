// Whether this CPU runs the AVX-512 kernels (see isa.h).
#include "backend/cpu/isa.h"

#include <cstdlib>
#include <string_view>

namespace cstorch::cpu {

bool cpu_has_avx512() {
  static const bool yes = [] {
    // CSTORCH_CPU_KERNELS=generic leaves the AVX-512 kernels out (OpenBLAS and the generic loops
    // only): to measure what they bring, or to run the path CPUs without AVX-512 take.
    const char* v = std::getenv("CSTORCH_CPU_KERNELS");
    if (v && std::string_view(v) == "generic") return false;
#if defined(__AVX512F__)
    return true;
#elif CSTORCH_AVX512_KERNELS
    return static_cast<bool>(__builtin_cpu_supports("avx512f"));  // checks the OS saves zmm state
#else
    return false;
#endif
  }();
  return yes;
}

}  // namespace cstorch::cpu
