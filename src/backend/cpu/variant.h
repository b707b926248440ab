// The CPU kernels are compiled more than once, each copy (a variant) for one instruction set:
// a portable x86-64 build holds "avx512" (x86-64-v4), "avx2" (x86-64-v3, with FMA) and "x86-64"
// (the baseline) and runs the best one the CPU and OS support; a native build
// (CSTORCH_NATIVE=ON) holds one, "native", tuned for the build machine. Each variant is linked
// into the library with every symbol made local but its entry point (CMakeLists.txt:
// cstorch_cpu_variant), so the inline functions and templates one variant compiles (its own and
// those of the standard library) can never stand in for another's.
//
// Everything outside the variants (the CPU backend object, thread settings, the compiler, tests)
// reaches the kernels through kernels() only. One process runs one variant throughout, so its
// results are those of one set of kernels: a fused GEMM epilogue rounds as the separate
// elementwise kernel of the same variant.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/cpu/gemm.h"
#include "ir/device.h"

namespace cstorch::cpu {

struct KernelVariant {
  const char* name;           // "avx512", "avx2", "x86-64", "native", "generic"
  const ir::Kernel* kernels;  // cpu_<Name> for every op of ops.def (null: no CPU kernel)
  // Scratch bytes a kernel needs for node n on a team of at most `threads` threads.
  size_t (*workspace_bytes)(const ir::Node& n, int threads);
  // The own GEMM's answers (gemm.h): whether it runs a product and applies a fused epilogue,
  // whether an addend epilogue is bitwise the separate addcmul, its scratch and the GEMM.
  bool (*own_gemm_applies)(int64_t M, int64_t N, int64_t K, bool tb);
  bool (*own_gemm_one_k_block)(int64_t K);
  size_t (*sgemm_scratch_floats)(int64_t N, int64_t K, bool ta, bool tb, bool addend);
  bool (*sgemm)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                int threads, const Scratch& ws, const GemmEpilogue& ep);
  // The short-side f32 product of the OpenBLAS path (gemm.h: false where it does not apply).
  bool (*sgemm_small)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A,
                      int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                      int threads);
  // The bf16 GEMM (gemm.h): whether it runs here, its scratch and the GEMM.
  bool (*bf16_gemm_runs_here)();
  size_t (*sgemm_bf16_scratch_floats)();
  bool (*bf16_gemm_amx)(int mode);
  bool (*bf16_gemm_widened)(int mode);
  bool (*sgemm_bf16)(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A,
                     int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc,
                     int threads, const Scratch& ws, const Bf16Result& out);
  // The Fused kernel's group form (ir::FusedGroupKernel).
  ir::FusedGroupKernel fused_group;
  // Which straight-line loop the Fused kernel runs for a node (null: its interpreter).
  const char* (*fused_line)(const ir::Node& n);
  // The counter-based generator of the random kernels (random.cpp), for its known-answer test.
  void (*philox4x32_10)(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
};

// The variant this process runs, chosen at the first call: the first built variant the CPU and
// OS support, in the order of built_variants(); or the one named by the environment variable
// CSTORCH_CPU_KERNELS ("avx512", "avx2", "x86-64", "native"; "generic" is the last built), to
// measure a variant or run the path other CPUs take. Errors: CSTORCH_CPU_KERNELS names a
// variant this build does not hold, or one this CPU cannot run (the message lists both sets).
const KernelVariant& kernels();

// The kernel of `op` in the running variant (null when the CPU has none).
inline ir::Kernel kernel(ir::OpCode op) {
  return kernels().kernels[static_cast<int>(op)];
}

// Every variant this build holds, best first.
std::span<const KernelVariant* const> built_variants();
// Whether this CPU and its OS run the variant's instructions.
bool runs_here(const KernelVariant& v);

}  // namespace cstorch::cpu
