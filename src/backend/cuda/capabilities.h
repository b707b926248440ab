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
// cuBLASLt's workspace (a budget that lets it pick split-K and stream-K algorithms): one buffer
// per device, owned by the backend, zeroed once and used by nothing else, as PyTorch keeps one
// per stream; not planned scratch shared with other values, since those plans keep partial sums
// and counters there. 32 MiB on sm_90 and later, 4 MiB before, the sizes NVIDIA recommends.
inline constexpr size_t kGemmWorkspaceBytes = size_t{4} << 20;
inline constexpr size_t kGemmWorkspaceBytesSm90 = size_t{32} << 20;
// Planned scratch a node's kernel needs: none (see kGemmWorkspaceBytes).
size_t workspace_bytes(const ir::Node& n);
// No Fused kernel and no GEMM epilogues yet: the compiler keeps those ops separate on CUDA.
inline bool fuses(ir::OpCode) {
  return false;
}
inline bool gemm_epilogue_applies(int64_t, int64_t, int64_t, bool) {
  return false;
}

}  // namespace cstorch::cuda
