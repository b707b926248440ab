// The entry point of one variant of the CPU kernels (variant.h): compiled with the variant's
// instruction set and CSTORCH_CPU_VARIANT=<its symbol suffix>, CSTORCH_CPU_VARIANT_NAME=<name>.
#include "backend/cpu/variant.h"

#include "backend/cpu/kernels.h"

#if !defined(CSTORCH_CPU_VARIANT) || !defined(CSTORCH_CPU_VARIANT_NAME)
#error "variant.cpp is compiled once per variant of the CPU kernels (see CMakeLists.txt)"
#endif
#define CSTORCH_CAT2(a, b) a##b
#define CSTORCH_CAT(a, b) CSTORCH_CAT2(a, b)

namespace cstorch::cpu {

size_t attention_workspace_bytes(const ir::Node& n, int threads);                   // attention.cpp
size_t linalg_workspace_bytes(const ir::Node& n, int threads);                      // linalg.cpp
size_t norm_workspace_bytes(const ir::Node& n, int threads);                        // norm.cpp
void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);  // random.cpp

namespace {

const ir::Kernel kTable[ir::kNumOps] = {
#define OP(Name, str, Attr, tr) &cpu_##Name,
#include "ir/ops.def"
#undef OP
};

size_t workspace_bytes(const ir::Node& n, int threads) {
  switch (n.op) {
    case ir::OpCode::Attention:
    case ir::OpCode::AttentionGrad:
      return attention_workspace_bytes(n, threads);
    case ir::OpCode::Matmul:
    case ir::OpCode::Linear:
    case ir::OpCode::Gemm:
      return linalg_workspace_bytes(n, threads);
    case ir::OpCode::LayerNormParamGrad:
      return norm_workspace_bytes(n, threads);
    default:
      return 0;
  }
}

const KernelVariant kVariant{CSTORCH_CPU_VARIANT_NAME,
                             kTable,
                             &workspace_bytes,
                             &own_gemm_applies,
                             &own_gemm_one_k_block,
                             &sgemm_avx512_scratch_floats,
                             &sgemm_avx512,
                             &sgemm_small,
                             &bf16_gemm_runs_here,
                             &sgemm_bf16_scratch_floats,
                             &bf16_gemm_amx,
                             &bf16_gemm_widened,
                             &sgemm_bf16,
                             &cpu_fused_group,
                             &cpu_fused_line,
                             &philox4x32_10};

}  // namespace
}  // namespace cstorch::cpu

// The one symbol of the variant left global.
extern "C" const cstorch::cpu::KernelVariant* CSTORCH_CAT(cstorch_cpu_variant_,
                                                          CSTORCH_CPU_VARIANT)() {
  return &cstorch::cpu::kVariant;
}
