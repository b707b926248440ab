// What the CUDA backend's kernels run, answered in plain C++ so that the answers are compiled and
// tested in every build (tests/unit/device/test_cuda_host.cpp), GPU or not. The CUDA backend
// object (device.cu) answers DeviceBackend's capability questions with these functions; the
// tests answer them the same way from a stand-in backend to prove, on the CPU, which graphs a
// CUDA build would compile (FC-MNIST's training step) and which it refuses.
#pragma once
#include <cstdint>
#include <string>

#include "ir/node.h"

namespace cstorch::cuda {

// Bit (1 << DType) for each output dtype the op's CUDA kernel writes; 0: no CUDA kernel.
uint32_t op_dtypes(ir::OpCode op);
// Whether the CUDA backend has a kernel for `op` writing `t`.
bool supports(ir::OpCode op, DType t);
// Empty when the CUDA kernel runs this node (op, output and input dtypes, ranks and layouts);
// otherwise why not, for the compile-time error ("matmul: batch dims of A must ...").
std::string unsupported(const ir::Node& n);
// The ops the CUDA build can run: the number listed in cuda_ops.def.
int num_ops();

// The most dims the kernels walk (broadcasting index arrays).
inline constexpr int kCudaMaxRank = 8;
// Planned scratch bytes the CUDA kernel of `n` needs (attention's backward keeps its row
// statistics there, a 16-bit linear with a bias its f32 product); 0 for the rest. cuBLASLt's
// workspace is the backend's own buffer (CudaBackend::gemm_workspace), not planned scratch.
size_t workspace_bytes(const ir::Node& n);
// Whether the Fused kernel (an elementwise program interpreter) runs `op` as an instruction.
bool fuses(ir::OpCode op);
// The Fused kernel reads bf16 inputs (widened exactly) and stores a bf16 result (rounded as the
// Cast kernel rounds): DeviceBackend::fused_reads_bf16 / fused_stores_bf16.
inline bool fused_reads_bf16() {
  return true;
}
inline bool fused_stores_bf16() {
  return true;
}
// No GEMM epilogues yet: the compiler keeps bias, relu and updates separate on CUDA.
inline bool gemm_epilogue_applies(int64_t, int64_t, int64_t, bool) {
  return false;
}

}  // namespace cstorch::cuda
