// The CPU backend: host memory from a cache of freed blocks, memcpy transfers, the kernel table.
#include "backend/cpu/device.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/variant.h"
#include "cstorch/core/error.h"

namespace cstorch::cpu {

namespace {

// A cache of freed host blocks by rounded size. Eager training loops allocate the same sizes
// every step; reusing blocks avoids malloc and, for large tensors, the fresh pages (faults and
// zeroing) of an mmap per allocation. Bounded: beyond kCacheLimit freed blocks go back to libc.
constexpr size_t kCacheLimit = size_t{256} << 20;
struct BlockCache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free;
  size_t bytes = 0;
};
BlockCache& block_cache() {
  static BlockCache* c = new BlockCache();  // never destroyed: buffers may outlive statics
  return *c;
}
size_t block_size(size_t nbytes) {
  size_t n = nbytes < 4096 ? (nbytes + 63) / 64 * 64 : (nbytes + 4095) / 4096 * 4096;
  return n == 0 ? 64 : n;
}

class CpuBackend final : public ir::DeviceBackend {
 public:
  std::string name() const override { return "CPU"; }
  void* allocate(size_t nbytes) const override {
    const size_t n = block_size(nbytes);
    {
      auto& c = block_cache();
      std::lock_guard<std::mutex> l(c.mu);
      auto it = c.free.find(n);
      if (it != c.free.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        c.bytes -= n;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, n);
    if (!p) fail("out of host memory allocating {} bytes", nbytes);
    return p;
  }
  void deallocate(void* p, size_t nbytes) const override {
    const size_t n = block_size(nbytes);
    auto& c = block_cache();
    {
      std::lock_guard<std::mutex> l(c.mu);
      if (c.bytes + n <= kCacheLimit) {
        c.free[n].push_back(p);
        c.bytes += n;
        return;
      }
    }
    std::free(p);
  }
  bool host_accessible() const override { return true; }
  void copy_to_host(void* dst, const void* src, size_t n) const override {
    if (n) std::memcpy(dst, src, n);
  }
  void copy_from_host(void* dst, const void* src, size_t n) const override {
    if (n) std::memcpy(dst, src, n);
  }
  void copy_on_device(void* dst, const void* src, size_t n) const override {
    if (n && dst != src) std::memcpy(dst, src, n);
  }
  void fill_zero(void* dst, size_t n) const override {
    if (n) std::memset(dst, 0, n);
  }
  ir::Kernel kernel(ir::OpCode op) const override { return cpu::kernel(op); }
  size_t workspace_bytes(const ir::Node& n) const override {
    return cpu::workspace_bytes(n, workspace_threads());
  }
  bool apply_thread_settings(const ir::HostThreadSettings& s) const override {
    if (s.num_threads > 0) set_num_threads(s.num_threads);
    bool ok = true;
    if (s.flush_denormal >= 0) ok = set_flush_denormal(s.flush_denormal != 0);
    return ok;
  }
  int host_threads() const override { return get_num_threads(); }
  void release_idle_host_threads() const override { release_thread_pool(); }
  ir::FusedGroupKernel fused_group_kernel() const override { return kernels().fused_group; }
  bool fused_stores_bf16() const override { return true; }
  bool fused_reads_bf16() const override { return true; }
  bool gemm_epilogue_applies(int64_t m, int64_t n, int64_t k, bool trans_b) const override {
    return kernels().own_gemm_applies(m, n, k, trans_b);
  }
  bool gemm_addend_exact(int64_t k) const override { return kernels().own_gemm_one_k_block(k); }
};

}  // namespace

size_t workspace_bytes(const ir::Node& n, int threads) {
  return kernels().workspace_bytes(n, threads);
}

const ir::DeviceBackend& backend() {
  static const CpuBackend* b = new CpuBackend();  // never destroyed: buffers may outlive statics
  return *b;
}

int workspace_threads() {
  return std::max(get_num_threads(), omp_get_num_procs());
}

}  // namespace cstorch::cpu

namespace cstorch::cpu {

// A transfer whose both sides are this backend's memory (ir::kernel_for runs the core's
// transfer kernel for ToDevice; this entry keeps the CPU's table complete).
void cpu_ToDevice(const ir::KernelContext&, const ir::Node& n, const void* const* in, void* out) {
  if (out != in[0]) std::memcpy(out, in[0], n.nbytes());
}

}  // namespace cstorch::cpu
