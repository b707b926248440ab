// GEMM entry points shared by kernels of other families (defined in linalg.cpp).
#pragma once
#include <cstdint>

#include "backend/cpu/gemm.h"

namespace cstorch::cpu {

// C[M, N] = alpha * op(A) @ op(B) + beta * C, row-major, on the calling thread only (OpenBLAS
// never starts its own team). For kernels that parallelise over their own tasks. Scratch: area
// omp_get_thread_num() of `ws`, of sgemm_avx512_scratch_floats(N, K, ta, tb, false) floats (the
// own GEMM's packed B^T panels; none when B is not transposed).
void sgemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                  const Scratch& ws);

}  // namespace cstorch::cpu
