// Which vector code this copy of the CPU kernels holds. The kernels are compiled once per
// variant (variant.h), each with its own instruction set: inside the AVX-512 variant (and a
// native build on an AVX-512 CPU) __AVX512F__ is defined and the AVX-512 kernels (the own GEMM,
// the short-row softmax) are compiled in; the other variants take OpenBLAS and the generic
// loops, the AVX2 one with its own vector exp, tanh and gelu (below).
#pragma once

#if defined(__AVX512F__)
#define CSTORCH_AVX512_KERNELS 1
#include <immintrin.h>
#else
#define CSTORCH_AVX512_KERNELS 0
#endif

// Inside the AVX2 variant (AVX2 with FMA, no AVX-512; or a native build on such a CPU) the
// vector math of vec_math.h and elementwise_math.h (exp, tanh, gelu) is written out on 8 lanes:
// GCC 12 compiles their scalar forms there into scalar code with branches.
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
#define CSTORCH_AVX2_KERNELS 1
#include <immintrin.h>
#else
#define CSTORCH_AVX2_KERNELS 0
#endif

// GCC 12 reports the pass-through of _mm512_undefined_ps() that many AVX-512 intrinsics start
// from (unpack, shuffle, max, reduce, widening) as uninitialised once they are inlined: a false
// positive. Code written with them is wrapped in these, which silence it there only.
#if defined(__clang__)  // clang has no -Wmaybe-uninitialized group and would warn about it
#define CSTORCH_INTRINSICS_BEGIN \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#else
#define CSTORCH_INTRINSICS_BEGIN                                                       \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#endif
#define CSTORCH_INTRINSICS_END _Pragma("GCC diagnostic pop")
