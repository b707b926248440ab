// cstorch's own f32 GEMM (gemm.cpp), used by linalg.cpp ahead of OpenBLAS where it applies.
#pragma once
#include <cstdint>

namespace cstorch::cpu {

// C[M, N] = alpha * op(A)[M, K] @ op(B)[K, N] + beta * C (+ bias[j] on every row when bias is
// not null), row-major (op = transpose when ta / tb), on a team of `threads` OpenMP threads
// (1: the calling thread only; call with 1 from inside a parallel region). beta == 0 never
// reads C. Returns false, doing nothing, when the build has no AVX-512 (callers then use
// OpenBLAS).
bool sgemm_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                  int threads, const float* bias = nullptr);

}  // namespace cstorch::cpu
