// The CPU backend: host memory from a cache of freed blocks, memcpy transfers, the kernel table.
#include "backend/cpu/device.h"

#include <omp.h>
#include <sys/mman.h>

#include <atomic>
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

// Large blocks start at a rotating offset ("colour") within their first page instead of all at
// the same one. Blocks from libc's mmap path all start at the same offset in their pages, so
// element i of every large tensor maps to the same L1 sets: a kernel streaming several
// same-shape tensors at once (an optimizer's one-pass update reads the gradient and three
// states and writes three) then has its streams and its own scratch compete for the few ways
// of those sets. Staggering consecutive blocks by 17 cache lines (mod 63 lines: offsets of 1 to
// 63 lines) spreads them over the sets. GPT-2 124M at 2 threads (AMD EPYC Zen 4, 32 KiB L1):
// the step's Fused kernels went from 138-162 to 111-117 ms (f32) and from 141-189 to 122-128 ms
// (bf16), alternating runs (bench/README.md). Every block still starts on a cache line; the
// colour is at least one line, so the pointer to the libc block is kept just below the block.
// Costs one page per large block.
//
// Blocks of at least one 2 MiB page start on a 2 MiB boundary, and their whole 2 MiB pages are
// advised as transparent huge pages (MADV_HUGEPAGE: this system's THP setting, like Debian's
// default, is "madvise", so nothing gets huge pages unasked). With 4 KiB pages a product that
// reads a transposed operand (a weight gradient's rows, 3-200 KiB apart) or packs B touches a new
// page every few lines, and a KVM guest's page walks are two-dimensional. Measured on an Intel
// Xeon KVM guest, 2 threads, alternated pairs against 4 KiB pages: the GPT-2 124M step
// 791-810 -> 774-786 ms (five pairs, every pair faster, 1-3.5%); gpt2_tiny 146.2-149.3 ->
// 142.9-149.2 ms (four pairs, within noise). The product kernels alone gain 0-3% on cold
// operands (bench_peak). The partial 2 MiB page at a block's end is not advised, so no block
// is backed by more memory than it spans (a huge page is only made where the whole page lies
// in the block). Advice only: where THP is off, madvise fails and the block keeps 4 KiB pages.
constexpr size_t kColouredMin = size_t{64} << 10;
constexpr size_t kPage = 4096, kLine = 64, kHugePage = size_t{2} << 20;
void* allocate_block(size_t n) {
  if (n < kColouredMin) return std::aligned_alloc(kLine, n);
  static std::atomic<unsigned> next{0};
  const size_t lines = kPage / kLine;
  const size_t colour =
      kLine * (1 + (next.fetch_add(1, std::memory_order_relaxed) * 17) % (lines - 1));
  const size_t span = n + kPage;  // a multiple of kPage (block_size rounds n to pages)
  void* raw = nullptr;
  if (posix_memalign(&raw, span >= kHugePage ? kHugePage : kPage, span) != 0) return nullptr;
  char* base = static_cast<char*>(raw);
  if (span >= kHugePage) madvise(base, span / kHugePage * kHugePage, MADV_HUGEPAGE);
  char* p = base + colour;
  std::memcpy(p - sizeof(void*), &base, sizeof(void*));
  return p;
}
void free_block(void* p, size_t n) {
  if (n < kColouredMin) return std::free(p);
  void* base;
  std::memcpy(&base, static_cast<char*>(p) - sizeof(void*), sizeof(void*));
  std::free(base);
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
    void* p = allocate_block(n);
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
    free_block(p, n);
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
