// The CUDA backend object (CUDA builds only): one per device, holding its stream, its caching
// allocator, its pinned staging ring, its cuBLASLt handle and the mapped word kernels report bad
// input through. Kernels reach it through KernelContext::backend.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <compare>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backend/cuda/block_cache.h"
#include "ir/device.h"

namespace cstorch::cuda {

// Throws cstorch::Error naming the device and the call when a CUDA runtime call failed.
void check_cuda(cudaError_t e, int device, const char* what);
void check_cublas(cublasStatus_t s, int device, const char* what);

class CudaBackend;
const CudaBackend& cuda_backend(const ir::KernelContext& ctx);

class CudaBackend final : public ir::DeviceBackend {
 public:
  explicit CudaBackend(int index);
  ~CudaBackend() override;
  std::string name() const override { return "GPU"; }
  void* allocate(size_t nbytes) const override;
  void deallocate(void* p, size_t nbytes) const override;
  bool host_accessible() const override { return false; }
  void copy_to_host(void* dst, const void* src, size_t n) const override;
  void copy_from_host(void* dst, const void* src, size_t n) const override;
  void copy_on_device(void* dst, const void* src, size_t n) const override;
  void fill_zero(void* dst, size_t n) const override;
  void synchronize() const override;
  // The stream kernels queue on: while the calling thread records (begin_recording), the
  // capture stream, else the device's stream.
  void* stream() const override { return active_stream(); }
  // cudaEvents recorded on the device's stream (the profile does not record graphs).
  std::unique_ptr<ir::KernelClock> kernel_clock() const override;
  ir::Kernel kernel(ir::OpCode op) const override;
  size_t workspace_bytes(const ir::Node& n) const override;
  bool supports(ir::OpCode op, DType t) const override;
  std::string cannot_run(const ir::Node& n) const override;
  bool fuses(ir::OpCode op) const override;
  bool fused_reads_bf16() const override;
  bool fused_stores_bf16() const override;
  bool gemm_epilogue_applies(int64_t m, int64_t n, int64_t k, bool trans_b) const override;
  bool gemm_addend_exact(int64_t) const override { return false; }
  int max_rank() const override;
  // Recording is CUDA graph capture: a program's kernels are captured on a stream of their own
  // (capture mode thread-local, so other threads' work on the device is not swept in) and the
  // instantiated graph is launched on the device's stream. Off with CSTORCH_CUDA_GRAPHS=0.
  bool records() const override;
  void begin_recording() const override;
  std::unique_ptr<ir::Recording> end_recording(bool keep) const override;
  void replay(const ir::Recording& r) const override;

  int index() const { return index_; }
  cudaStream_t cuda_stream() const { return active_stream(); }
  cublasLtHandle_t lt() const { return lt_; }
  // The device address of the mapped host word kernels set on bad input (nll_loss targets).
  int* error_word() const { return error_dev_; }
  // cuBLASLt's workspace (a budget that lets it pick split-K and stream-K plans): the backend's
  // own buffer, zeroed once and used by nothing else, as PyTorch keeps one per stream; not
  // planned scratch shared with other values, since those plans keep partial sums and counters
  // there. 256-byte aligned, used by one product at a time (every product is queued on the one
  // stream); 32 MiB on sm_90 and later, 4 MiB before, the sizes NVIDIA recommends.
  void* gemm_workspace() const { return gemm_ws_; }
  size_t gemm_workspace_bytes() const { return gemm_ws_bytes_; }
  // After launching a kernel: a launch error becomes a cstorch::Error naming the op.
  void check_launch(const char* op) const;
  // Makes this backend's device current on the calling thread.
  void make_current() const;
  // Cached cuBLASLt plans (descriptors and the chosen algorithm) by shape, layout, operand
  // alignment and element types (cudaDataType_t of A and B, and of C); looked up without
  // allocating (a step's kernels never allocate).
  struct GemmKey {
    int64_t m, n, k, batch, stride_a, stride_b;
    bool trans_a, trans_b, tf32;
    uint32_t align_a, align_b, align_c;
    int ab_type, c_type;
    auto operator<=>(const GemmKey&) const = default;
  };
  struct GemmPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    GemmPlan() = default;
    GemmPlan(const GemmPlan&) = delete;
    GemmPlan& operator=(const GemmPlan&) = delete;
    ~GemmPlan() {
      if (op) cublasLtMatmulDescDestroy(op);
      if (a) cublasLtMatrixLayoutDestroy(a);
      if (b) cublasLtMatrixLayoutDestroy(b);
      if (c) cublasLtMatrixLayoutDestroy(c);
    }
  };
  std::mutex& gemm_mu() const { return gemm_mu_; }
  std::map<GemmKey, std::unique_ptr<GemmPlan>>& gemm_plans() const { return gemm_plans_; }

 private:
  // Waits for the stream, then reports a kernel's bad-input word as an error.
  void sync_and_check() const;
  cudaStream_t active_stream() const;
  int index_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t capture_stream_ = nullptr;
  mutable std::mutex record_mu_;  // one recording at a time on this device
  cublasLtHandle_t lt_ = nullptr;
  int* error_host_ = nullptr;
  int* error_dev_ = nullptr;
  void* gemm_ws_ = nullptr;
  size_t gemm_ws_bytes_ = 0;
  std::unique_ptr<RawAllocator> raw_;
  std::unique_ptr<BlockCache> cache_;
  // Pinned host staging: a ring of slots, each reused only after its copy's event completed.
  struct Staging {
    void* host = nullptr;
    cudaEvent_t done = nullptr;
    bool pending = false;
  };
  static constexpr size_t kStagingSlotBytes = size_t{8} << 20;
  static constexpr int kStagingSlots = 4;
  mutable std::mutex staging_mu_;
  mutable Staging staging_[kStagingSlots];
  mutable int next_slot_ = 0;
  mutable std::mutex gemm_mu_;
  mutable std::map<GemmKey, std::unique_ptr<GemmPlan>> gemm_plans_;
};

}  // namespace cstorch::cuda
