// The checking device (see checking_device.h).
#include "support/checking_device.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "cstorch/core/error.h"
#include "ir/device.h"

namespace cstorch::testing {

namespace {

// A virtual reservation from which every buffer of the device comes; only its used prefix is
// ever made accessible.
constexpr size_t kReserve = size_t{64} << 30;
constexpr size_t kAlign = 256;
constexpr size_t kGiveBackBytes = size_t{64} << 10;

std::atomic<int64_t> g_kernels{0}, g_to_host{0}, g_from_host{0}, g_in_use{0};
std::atomic<int64_t> g_kernels_by_op[ir::kNumOps] = {};

class Pool {
 public:
  Pool() {
    base_ = static_cast<char*>(
        mmap(nullptr, kReserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (base_ == MAP_FAILED) {
      std::perror("checking device: mmap");
      std::abort();
    }
    page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  }
  char* base() const { return base_; }
  bool contains(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + kReserve;
  }

  void* allocate(size_t nbytes) {
    const size_t n = round(nbytes);
    std::lock_guard<std::mutex> l(mu_);
    auto it = free_.find(n);
    if (it != free_.end() && !it->second.empty()) {
      size_t off = it->second.back();
      it->second.pop_back();
      return base_ + off;
    }
    if (used_ + n > kReserve) fail("device check: out of memory allocating {} bytes", nbytes);
    const size_t off = used_;
    const size_t old_pages = page_round(used_);
    used_ += n;
    // Newly reached pages follow the current protection.
    if (open_ > 0 && page_round(used_) > old_pages) protect(old_pages, page_round(used_), true);
    return base_ + off;
  }
  void deallocate(void* p, size_t nbytes) {
    const size_t off = static_cast<size_t>(static_cast<char*>(p) - base_), n = round(nbytes);
    // The whole pages of a large free block are given back (read as zeros when reused): every
    // window changes the protection of each page in use, so few resident pages keep it cheap.
    const size_t from = page_round(off), to = (off + n) / page_ * page_;
    if (n >= kGiveBackBytes && to > from) madvise(base_ + from, to - from, MADV_DONTNEED);
    std::lock_guard<std::mutex> l(mu_);
    free_[n].push_back(off);
  }

  // The device's memory is accessible while at least one window is open.
  void open() {
    std::lock_guard<std::mutex> l(mu_);
    if (open_++ == 0 && used_ > 0) protect(0, page_round(used_), true);
  }
  void close() {
    std::lock_guard<std::mutex> l(mu_);
    if (--open_ == 0 && used_ > 0) protect(0, page_round(used_), false);
  }

 private:
  static size_t round(size_t n) { return n == 0 ? kAlign : (n + kAlign - 1) / kAlign * kAlign; }
  size_t page_round(size_t n) const { return (n + page_ - 1) / page_ * page_; }
  void protect(size_t from, size_t to, bool rw) {
    if (mprotect(base_ + from, to - from, rw ? PROT_READ | PROT_WRITE : PROT_NONE) != 0) {
      std::perror("checking device: mprotect");
      std::abort();
    }
  }

  char* base_ = nullptr;
  size_t page_ = 4096;
  std::mutex mu_;
  size_t used_ = 0;
  int open_ = 0;
  std::map<size_t, std::vector<size_t>> free_;
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: buffers may outlive statics
  return *p;
}

// Scope in which the device's own code may touch its memory.
struct Window {
  Window() { pool().open(); }
  ~Window() { pool().close(); }
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;
};

// A host access to device memory faults: say so before dying.
struct sigaction g_previous;
void on_fault(int sig, siginfo_t* info, void* uctx) {
  if (info && pool().contains(info->si_addr)) {
    char msg[160];
    const int n =
        std::snprintf(msg, sizeof msg,
                      "checking device: host code touched device memory at offset %zu "
                      "outside the device's kernels and transfer functions\n",
                      static_cast<size_t>(static_cast<char*>(info->si_addr) - pool().base()));
    if (n > 0) (void)!write(2, msg, static_cast<size_t>(n));
  }
  sigaction(SIGSEGV, &g_previous, nullptr);
  raise(sig);
  (void)uctx;
}

const ir::DeviceBackend& cpu() {
  return ir::device_backend(Device{});
}

// Every kernel: the CPU's, with the device's memory open for its duration.
void checked_kernel(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                    void* out) {
  g_kernels.fetch_add(1, std::memory_order_relaxed);
  g_kernels_by_op[static_cast<int>(n.op)].fetch_add(1, std::memory_order_relaxed);
  const ir::Kernel k = cpu().kernel(n.op);
  Window w;
  k(ctx, n, in, out);
}

// The CPU's one-pass group of Fused nodes (Program::plan_groups), the same way.
void checked_group_kernel(const ir::KernelContext& ctx, const ir::Node* const* nodes,
                          const void* const* const* ins, void* const* outs, int count) {
  g_kernels.fetch_add(count, std::memory_order_relaxed);
  g_kernels_by_op[static_cast<int>(ir::OpCode::Fused)].fetch_add(count, std::memory_order_relaxed);
  const ir::FusedGroupKernel k = cpu().fused_group_kernel();
  Window w;
  k(ctx, nodes, ins, outs, count);
}

// The profile's clock (ir::KernelClock). The checking device's kernels run on the host within
// their calls, so the host's clock between marks is the kernels' time.
std::atomic<int64_t> g_clock_marks{0};
class HostClock final : public ir::KernelClock {
 public:
  void start() override {
    t_.clear();
    t_.push_back(std::chrono::steady_clock::now());
  }
  void mark() override {
    g_clock_marks.fetch_add(1, std::memory_order_relaxed);
    t_.push_back(std::chrono::steady_clock::now());
  }
  std::vector<double> seconds() override {
    std::vector<double> s;
    for (size_t i = 1; i < t_.size(); ++i)
      s.push_back(std::chrono::duration<double>(t_[i] - t_[i - 1]).count());
    t_.clear();
    return s;
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> t_;
};

class CheckingBackend final : public ir::DeviceBackend {
 public:
  std::string name() const override { return "check"; }
  void* allocate(size_t nbytes) const override {
    g_in_use.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
    return pool().allocate(nbytes);
  }
  void deallocate(void* p, size_t nbytes) const override {
    g_in_use.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
    pool().deallocate(p, nbytes);
  }
  bool host_accessible() const override { return false; }
  void copy_to_host(void* dst, const void* src, size_t n) const override {
    g_to_host.fetch_add(1, std::memory_order_relaxed);
    Window w;
    if (n) std::memcpy(dst, src, n);
  }
  void copy_from_host(void* dst, const void* src, size_t n) const override {
    g_from_host.fetch_add(1, std::memory_order_relaxed);
    Window w;
    if (n) std::memcpy(dst, src, n);
  }
  void copy_on_device(void* dst, const void* src, size_t n) const override {
    Window w;
    if (n && dst != src) std::memmove(dst, src, n);
  }
  void fill_zero(void* dst, size_t n) const override {
    Window w;
    if (n) std::memset(dst, 0, n);
  }
  ir::Kernel kernel(ir::OpCode op) const override {
    return cpu().kernel(op) ? &checked_kernel : nullptr;
  }
  ir::FusedGroupKernel fused_group_kernel() const override {
    return cpu().fused_group_kernel() ? &checked_group_kernel : nullptr;
  }
  size_t workspace_bytes(const ir::Node& n) const override { return cpu().workspace_bytes(n); }
  std::unique_ptr<ir::KernelClock> kernel_clock() const override {
    return std::make_unique<HostClock>();
  }
  // The same answers as the CPU, so that programs compile to the same nodes and results are
  // bitwise those of the CPU.
  bool gemm_epilogue_applies(int64_t m, int64_t n, int64_t k, bool trans_b) const override {
    return cpu().gemm_epilogue_applies(m, n, k, trans_b);
  }
  bool gemm_addend_exact(int64_t k) const override { return cpu().gemm_addend_exact(k); }
};

}  // namespace

Device register_checking_device() {
  static std::once_flag once;
  std::call_once(once, [] {
    pool();
    struct sigaction sa {};
    sa.sa_sigaction = &on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous);
    ir::register_device_backend(DeviceType::Plugin, std::make_shared<CheckingBackend>());
  });
  return Device{DeviceType::Plugin, 0};
}

CheckingDeviceStats checking_device_stats() {
  return {g_kernels.load(), g_to_host.load(), g_from_host.load(), g_in_use.load(),
          g_clock_marks.load()};
}

std::vector<int64_t> checking_device_kernel_calls() {
  std::vector<int64_t> v(ir::kNumOps);
  for (int i = 0; i < ir::kNumOps; ++i) v[static_cast<size_t>(i)] = g_kernels_by_op[i].load();
  return v;
}

}  // namespace cstorch::testing
