// Which vector code this copy of the CPU kernels holds. The kernels are compiled once per
// variant (variant.h), each with its own instruction set: inside the AVX-512 variant (and a
// native build on an AVX-512 CPU) __AVX512F__ is defined and the AVX-512 kernels (the own GEMM,
// the short-row softmax) are compiled in; the other variants take OpenBLAS and the generic loops.
#pragma once

#if defined(__AVX512F__)
#define CSTORCH_AVX512_KERNELS 1
#include <immintrin.h>
#else
#define CSTORCH_AVX512_KERNELS 0
#endif
