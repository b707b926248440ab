// Which AVX-512 code a build holds, and whether the CPU it runs on can execute it.
//
// A build tuned for its machine (CSTORCH_NATIVE=ON, -march=native on an AVX-512 CPU) compiles
// every kernel for AVX-512. A portable build (CSTORCH_NATIVE=OFF) compiles the library for the
// x86-64 baseline and, with GCC, still compiles the AVX-512 kernels (the GEMM, short-row
// softmax) between CSTORCH_AVX512_BEGIN and CSTORCH_AVX512_END, which give those functions
// alone the AVX-512 target; they run only where cpu_has_avx512() says so, else the portable
// path (OpenBLAS, which picks its own kernels at run time, and the generic loops) runs.
// Functions inside the region are never called before that check: code outside it must not
// depend on the target (headers are included before the region, so the templates they define
// stay baseline code).
#pragma once

#if defined(__AVX512F__) || (defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__))
#define CSTORCH_AVX512_KERNELS 1
#include <immintrin.h>
#else
#define CSTORCH_AVX512_KERNELS 0
#endif

#if CSTORCH_AVX512_KERNELS && !defined(__AVX512F__)
#define CSTORCH_AVX512_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f\")")
#define CSTORCH_AVX512_END _Pragma("GCC pop_options")
#else
#define CSTORCH_AVX512_BEGIN
#define CSTORCH_AVX512_END
#endif

namespace cstorch::cpu {

// True when the AVX-512 kernels are compiled in and this CPU and OS run AVX-512F code (asked
// once), unless the environment sets CSTORCH_CPU_KERNELS=generic.
bool cpu_has_avx512();

}  // namespace cstorch::cpu
