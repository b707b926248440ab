// The CUDA backend object (see backend.h) and the registry entry points of a CUDA build
// (backend/cuda/device.h). Everything here is host code over the CUDA runtime API; kernels are
// in ../kernels/*.cu, the node-reading wrappers in ops.cpp.
#include <cstdlib>
#include <cstring>

#include "backend/cuda/capabilities.h"
#include "backend/cuda/device.h"
#include "backend/cuda/device_table.h"
#include "backend/cuda/kernels/launch.h"
#include "backend/cuda/runtime/backend.h"
#include "cstorch/core/error.h"

namespace cstorch::cuda {

// ops.cpp: the kernel table, from cuda_ops.def.
ir::Kernel kernel_of(ir::OpCode op);

void check_cuda(cudaError_t e, int device, const char* what) {
  if (e != cudaSuccess)
    fail("device GPU:{}: {} failed: {} ({})", device, what, cudaGetErrorString(e),
         cudaGetErrorName(e));
}

void check_cublas(cublasStatus_t s, int device, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail("device GPU:{}: {} failed: cuBLAS status {}", device, what, static_cast<int>(s));
}

const CudaBackend& cuda_backend(const ir::KernelContext& ctx) {
  return *static_cast<const CudaBackend*>(ctx.backend);
}

namespace {

// cudaMalloc / cudaFree for the block cache; out of memory is a null return (the cache then
// gives back its cached blocks and retries).
class CudaRaw final : public RawAllocator {
 public:
  explicit CudaRaw(int device) : device_(device) {}
  void* raw_allocate(size_t n) override {
    check_cuda(cudaSetDevice(device_), device_, "cudaSetDevice");
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clear the sticky-free error so later calls do not see it
      return nullptr;
    }
    check_cuda(e, device_, "cudaMalloc");
    return p;
  }
  void raw_free(void* p, size_t) override {
    (void)cudaSetDevice(device_);
    (void)cudaFree(p);  // at exit the driver may already be gone: nothing to report then
  }

 private:
  int device_;
};

// The backend the calling thread is recording on (begin_recording .. end_recording), if any.
thread_local const CudaBackend* t_recording = nullptr;

// A captured program, instantiated.
struct CudaRecording final : ir::Recording {
  cudaGraphExec_t exec = nullptr;
  ~CudaRecording() override {
    if (exec) (void)cudaGraphExecDestroy(exec);
  }
};

// Freed blocks kept per device for reuse (beyond this they go back to cudaFree).
constexpr size_t kCacheLimit = size_t{2} << 30;

}  // namespace

CudaBackend::CudaBackend(int index) : index_(index) {
  make_current();
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), index_,
             "cudaStreamCreate");
  check_cuda(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking), index_,
             "cudaStreamCreate (capture)");
  check_cublas(cublasLtCreate(&lt_), index_, "cublasLtCreate");
  check_cuda(
      cudaHostAlloc(reinterpret_cast<void**>(&error_host_), sizeof(int), cudaHostAllocMapped),
      index_, "cudaHostAlloc (error word)");
  *error_host_ = 0;
  check_cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&error_dev_), error_host_, 0),
             index_, "cudaHostGetDevicePointer");
  for (auto& s : staging_) {
    check_cuda(cudaHostAlloc(&s.host, kStagingSlotBytes, cudaHostAllocDefault), index_,
               "cudaHostAlloc (staging)");
    check_cuda(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), index_,
               "cudaEventCreate");
  }
  int major = 0;
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index_), index_,
             "cudaDeviceGetAttribute (compute capability)");
  gemm_ws_bytes_ = (major >= 9 ? size_t{32} : size_t{4}) << 20;
  check_cuda(cudaMalloc(&gemm_ws_, gemm_ws_bytes_), index_, "cudaMalloc (cuBLASLt workspace)");
  check_cuda(cudaMemsetAsync(gemm_ws_, 0, gemm_ws_bytes_, stream_), index_,
             "cudaMemsetAsync (cuBLASLt workspace)");
  raw_ = std::make_unique<CudaRaw>(index_);
  cache_ = std::make_unique<BlockCache>(*raw_, fmt::format("GPU:{}", index_), kCacheLimit);
}

CudaBackend::~CudaBackend() {
  // Backends live for the process; this runs only if one is replaced. Errors are ignored: the
  // driver may be shutting down.
  (void)cudaSetDevice(index_);
  (void)cudaStreamSynchronize(stream_);
  gemm_plans_.clear();
  cache_.reset();
  if (gemm_ws_) (void)cudaFree(gemm_ws_);
  for (auto& s : staging_) {
    if (s.done) (void)cudaEventDestroy(s.done);
    if (s.host) (void)cudaFreeHost(s.host);
  }
  if (error_host_) (void)cudaFreeHost(error_host_);
  if (lt_) (void)cublasLtDestroy(lt_);
  if (capture_stream_) (void)cudaStreamDestroy(capture_stream_);
  if (stream_) (void)cudaStreamDestroy(stream_);
}

cudaStream_t CudaBackend::active_stream() const {
  return t_recording == this ? capture_stream_ : stream_;
}

bool CudaBackend::records() const {
  static const bool on = [] {
    const char* e = std::getenv("CSTORCH_CUDA_GRAPHS");
    return !(e && std::string(e) == "0");
  }();
  return on;
}

void CudaBackend::begin_recording() const {
  make_current();
  record_mu_.lock();
  t_recording = this;
  const cudaError_t e = cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    t_recording = nullptr;
    record_mu_.unlock();
    check_cuda(e, index_, "cudaStreamBeginCapture (recording a step)");
  }
}

std::unique_ptr<ir::Recording> CudaBackend::end_recording(bool keep) const {
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(capture_stream_, &graph);
  t_recording = nullptr;
  record_mu_.unlock();
  if (!keep) {  // after an error: discard what was captured, and the capture's error
    if (graph) (void)cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    return nullptr;
  }
  check_cuda(e, index_,
             "cudaStreamEndCapture (recording a step; CSTORCH_CUDA_GRAPHS=0 runs steps kernel by "
             "kernel)");
  auto r = std::make_unique<CudaRecording>();
  e = cudaGraphInstantiateWithFlags(&r->exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  check_cuda(e, index_,
             "cudaGraphInstantiateWithFlags (recording a step; CSTORCH_CUDA_GRAPHS=0 runs steps "
             "kernel by kernel)");
  return r;
}

void CudaBackend::replay(const ir::Recording& r) const {
  make_current();
  check_cuda(cudaGraphLaunch(static_cast<const CudaRecording&>(r).exec, stream_), index_,
             "cudaGraphLaunch (a recorded step)");
}

void CudaBackend::make_current() const {
  check_cuda(cudaSetDevice(index_), index_, "cudaSetDevice");
}

void* CudaBackend::allocate(size_t nbytes) const {
  return cache_->allocate(nbytes);
}

void CudaBackend::deallocate(void* p, size_t nbytes) const {
  // Stream-ordered reuse (block_cache.h): work queued on p before this runs before any work
  // queued on it by its next owner, since both are on this device's one stream.
  cache_->deallocate(p, nbytes);
}

void CudaBackend::check_launch(const char* op) const {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail("device GPU:{}: launching the {} kernel failed: {}", index_, op, cudaGetErrorString(e));
}

void CudaBackend::sync_and_check() const {
  check_cuda(cudaStreamSynchronize(stream_), index_, "cudaStreamSynchronize (queued kernels)");
  const int code = *static_cast<volatile int*>(error_host_);
  if (code != 0) {
    *error_host_ = 0;
    // Kernels cannot throw: they store what they found (kernels/launch.h) and skip the element.
    fail("device GPU:{}: a kernel found {} (reported when the host next waited for the device)",
         index_,
         code == k::kErrorIndex
             ? "an index outside the indexed dim in index_select / index_add / gather / "
               "scatter_add (an embedding's token id outside the vocabulary, for example)"
             : "a class index outside [0, classes) in the targets of nll_loss / cross_entropy");
  }
}

void CudaBackend::synchronize() const {
  make_current();
  sync_and_check();
}

namespace {
// The profile's clock: one event per timestamp, made on first use and reused by every later
// execution (an execution queues the same number of kernels).
class CudaClock final : public ir::KernelClock {
 public:
  explicit CudaClock(const CudaBackend& b) : b_(b) {}
  ~CudaClock() override {
    for (cudaEvent_t e : events_) (void)cudaEventDestroy(e);
  }
  void start() override {
    used_ = 0;
    mark();
  }
  void mark() override {
    b_.make_current();
    if (used_ == events_.size()) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreate(&e), b_.index(), "cudaEventCreate (the profile's clock)");
      events_.push_back(e);
    }
    check_cuda(cudaEventRecord(events_[used_++], b_.cuda_stream()), b_.index(),
               "cudaEventRecord (the profile's clock)");
  }
  std::vector<double> seconds() override {
    std::vector<double> s;
    if (used_ == 0) return s;
    b_.synchronize();
    for (size_t i = 1; i < used_; ++i) {
      float ms = 0.f;
      check_cuda(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]), b_.index(),
                 "cudaEventElapsedTime (the profile's clock)");
      s.push_back(1e-3 * static_cast<double>(ms));
    }
    used_ = 0;
    return s;
  }

 private:
  const CudaBackend& b_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};
}  // namespace

std::unique_ptr<ir::KernelClock> CudaBackend::kernel_clock() const {
  return std::make_unique<CudaClock>(*this);
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t n) const {
  if (n == 0) return;
  make_current();
  check_cuda(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_), index_,
             "cudaMemcpyAsync (device to host)");
  sync_and_check();
}

void CudaBackend::copy_from_host(void* dst, const void* src, size_t n) const {
  if (n == 0) return;
  make_current();
  if (n <= kStagingSlotBytes) {
    // Through a pinned slot: the caller's memory is free again when this returns, and the copy
    // itself runs asynchronously, after the kernels queued before it (a batch upload overlaps
    // the previous step).
    std::lock_guard<std::mutex> l(staging_mu_);
    Staging& s = staging_[next_slot_];
    next_slot_ = (next_slot_ + 1) % kStagingSlots;
    if (s.pending)
      check_cuda(cudaEventSynchronize(s.done), index_, "cudaEventSynchronize (staging slot)");
    std::memcpy(s.host, src, n);
    check_cuda(cudaMemcpyAsync(dst, s.host, n, cudaMemcpyHostToDevice, stream_), index_,
               "cudaMemcpyAsync (host to device)");
    check_cuda(cudaEventRecord(s.done, stream_), index_, "cudaEventRecord");
    s.pending = true;
    return;
  }
  check_cuda(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_), index_,
             "cudaMemcpyAsync (host to device)");
  check_cuda(cudaStreamSynchronize(stream_), index_, "cudaStreamSynchronize (upload)");
}

void CudaBackend::copy_on_device(void* dst, const void* src, size_t n) const {
  if (n == 0 || dst == src) return;
  make_current();
  check_cuda(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, active_stream()), index_,
             "cudaMemcpyAsync (device to device)");
}

void CudaBackend::fill_zero(void* dst, size_t n) const {
  if (n == 0) return;
  make_current();
  check_cuda(cudaMemsetAsync(dst, 0, n, active_stream()), index_, "cudaMemsetAsync");
}

ir::Kernel CudaBackend::kernel(ir::OpCode op) const {
  return kernel_of(op);
}
bool CudaBackend::supports(ir::OpCode op, DType t) const {
  return cuda::supports(op, t);
}
std::string CudaBackend::cannot_run(const ir::Node& n) const {
  return cuda::unsupported(n);
}
size_t CudaBackend::workspace_bytes(const ir::Node& n) const {
  return cuda::workspace_bytes(n);
}

bool CudaBackend::fuses(ir::OpCode op) const {
  return cuda::fuses(op);
}
bool CudaBackend::fused_reads_bf16() const {
  return cuda::fused_reads_bf16();
}
bool CudaBackend::fused_stores_bf16() const {
  return cuda::fused_stores_bf16();
}
bool CudaBackend::gemm_epilogue_applies(int64_t m, int64_t n, int64_t k, bool trans_b) const {
  return cuda::gemm_epilogue_applies(m, n, k, trans_b);
}
int CudaBackend::max_rank() const {
  return kCudaMaxRank;
}

namespace {

DeviceTable& table() {
  static DeviceTable* t = new DeviceTable(  // never destroyed: buffers may outlive statics
      [](std::string* why) {
        int n = 0;
        const cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) {
          *why = fmt::format("cudaGetDeviceCount: {}", cudaGetErrorString(e));
          return -1;
        }
        return n;
      },
      [](int index) -> std::shared_ptr<const ir::DeviceBackend> {
        return std::make_shared<CudaBackend>(index);
      });
  return *t;
}

}  // namespace

bool built() {
  return true;
}

const ir::DeviceBackend& backend(int index) {
  return table().get(index);
}

const ir::DeviceBackend* find_backend(int index) {
  try {
    return &table().get(index);
  } catch (const Error&) {
    return nullptr;
  }
}

int device_count() {
  return table().count();
}

}  // namespace cstorch::cuda
