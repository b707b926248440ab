// The CUDA backend's host-side logic, tested in every build (no GPU, no toolkit needed): the
// caching allocator's policy over a fake raw allocator, the device table (selection, index and
// driver errors), the capability table against ops.def, and, through a stand-in backend that
// answers every question as the CUDA backend does but runs the CPU kernels, proof that the graphs
// a CUDA build compiles for FC-MNIST's training and evaluation steps (SGD + momentum, Adam, AdamW)
// and for the Model Zoo's language models (GPT-2, BERT, Transformer, T5, with dropout), and
// FC-MNIST's and GPT-2's under bf16 and f16 autocast, need only ops that have CUDA kernels for
// their dtypes, and that everything else is refused at compile time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include <cstorch/amp.h>
#include <cstorch/cstorch.h>

#include "backend/cuda/block_cache.h"
#include "backend/cuda/capabilities.h"
#include "backend/cuda/device.h"
#include "backend/cuda/device_table.h"
#include "backend/cuda/fused_plan.h"
#include "ir/device.h"
#include "modelzoo/registry.h"
#include "modelzoo/trainer.h"
#include "support/fc_steps.h"
#include "support/lm_steps.h"
#include "support/tape_recording.h"
#include "unit/test_util.h"

namespace {

using namespace cstorch;
using cstorch::testing::rt;

// ---- the block cache ----

// Hands out distinct fake addresses, up to `capacity` bytes at once (then "out of memory").
class FakeRaw final : public cuda::RawAllocator {
 public:
  explicit FakeRaw(size_t capacity = size_t{1} << 40) : capacity_(capacity) {}
  void* raw_allocate(size_t n) override {
    if (live_ + n > capacity_) return nullptr;
    live_ += n;
    ++allocs;
    next_ += n + 4096;
    sizes[next_] = n;
    return reinterpret_cast<void*>(next_);
  }
  void raw_free(void* p, size_t n) override {
    auto it = sizes.find(reinterpret_cast<uintptr_t>(p));
    ASSERT_NE(it, sizes.end()) << "freed a block it never gave";
    EXPECT_EQ(it->second, n) << "freed with another size";
    sizes.erase(it);
    live_ -= n;
    ++frees;
  }
  int allocs = 0, frees = 0;
  std::map<uintptr_t, size_t> sizes;

 private:
  size_t capacity_, live_ = 0;
  uintptr_t next_ = 1 << 20;
};

TEST(CudaBlockCache, RoundsSmallSizesTo512AndLargeTo2MiB) {
  using cuda::BlockCache;
  EXPECT_EQ(BlockCache::round_size(0), 512u);
  EXPECT_EQ(BlockCache::round_size(1), 512u);
  EXPECT_EQ(BlockCache::round_size(513), 1024u);
  EXPECT_EQ(BlockCache::round_size(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(BlockCache::round_size((size_t{1} << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(BlockCache::round_size((size_t{5} << 20) + 7), size_t{6} << 20);
}

TEST(CudaBlockCache, ATrainingLoopStopsCallingTheRawAllocatorAfterItsFirstStep) {
  FakeRaw raw;
  cuda::BlockCache cache(raw, "GPU:0", size_t{1} << 30);
  const size_t sizes[] = {64 * 784 * 4, 256 * 4, 64 * 10 * 4, 4, (size_t{3} << 20) + 100};
  for (int step = 0; step < 50; ++step) {
    std::vector<std::pair<void*, size_t>> live;
    for (size_t s : sizes) live.push_back({cache.allocate(s), s});
    if (step == 0) {
      EXPECT_EQ(raw.allocs, 5);
    }
    for (auto& [p, s] : live) cache.deallocate(p, s);
  }
  EXPECT_EQ(raw.allocs, 5);  // every later step is served from the cache
  EXPECT_EQ(raw.frees, 0);
  const auto st = cache.stats();
  EXPECT_EQ(st.hits, 49 * 5);
  EXPECT_EQ(st.bytes_in_use, 0u);
  EXPECT_GT(st.bytes_cached, 0u);
}

TEST(CudaBlockCache, ALiveBlockIsNeverHandedOutTwice) {
  FakeRaw raw;
  cuda::BlockCache cache(raw, "GPU:0", size_t{1} << 30);
  void* a = cache.allocate(1000);
  void* b = cache.allocate(1000);
  EXPECT_NE(a, b);
  cache.deallocate(a, 1000);
  EXPECT_EQ(cache.allocate(900), a);  // same rounded size: the freed block
  EXPECT_NE(cache.allocate(1000), b);
}

TEST(CudaBlockCache, FreedBlocksBeyondTheLimitGoBackToTheRawAllocator) {
  FakeRaw raw;
  cuda::BlockCache cache(raw, "GPU:0", 4096);
  void* a = cache.allocate(4096);
  void* b = cache.allocate(4096);
  cache.deallocate(a, 4096);  // kept: 4096 cached
  cache.deallocate(b, 4096);  // over the limit: freed
  EXPECT_EQ(raw.frees, 1);
  EXPECT_EQ(cache.stats().bytes_cached, 4096u);
}

TEST(CudaBlockCache, OutOfMemoryReleasesTheCacheRetriesThenNamesDeviceAndSize) {
  FakeRaw raw(8192);
  {
    cuda::BlockCache cache(raw, "GPU:1", size_t{1} << 30);
    void* a = cache.allocate(4096);
    void* b = cache.allocate(2048);
    cache.deallocate(a, 4096);
    cache.deallocate(b, 2048);
    // 6144 bytes cached, 8192 capacity: 6000 bytes (rounded 6144) fits only after a release.
    void* c = cache.allocate(6000);
    EXPECT_NE(c, nullptr);
    EXPECT_EQ(raw.frees, 2);
    EXPECT_ERROR(cache.allocate(4096), "device GPU:1: out of memory allocating 4096 bytes",
                 "6144 bytes in use");
    cache.deallocate(c, 6000);
  }
  EXPECT_TRUE(raw.sizes.empty()) << "the cache's destructor returns its cached blocks";
}

// ---- the device table ----

class DummyBackend final : public ir::DeviceBackend {
 public:
  explicit DummyBackend(int i) : index(i) {}
  std::string name() const override { return "GPU"; }
  void* allocate(size_t) const override { return nullptr; }
  void deallocate(void*, size_t) const override {}
  bool host_accessible() const override { return false; }
  void copy_to_host(void*, const void*, size_t) const override {}
  void copy_from_host(void*, const void*, size_t) const override {}
  void copy_on_device(void*, const void*, size_t) const override {}
  void fill_zero(void*, size_t) const override {}
  ir::Kernel kernel(ir::OpCode) const override { return nullptr; }
  int index;
};

TEST(CudaDeviceTable, MakesEachDeviceOnceAndNamesAnIndexOutOfRange) {
  int probes = 0, made = 0;
  cuda::DeviceTable t([&](std::string*) { return ++probes, 2; },
                      [&](int i) { return ++made, std::make_shared<DummyBackend>(i); });
  const auto& b1 = t.get(1);
  EXPECT_EQ(static_cast<const DummyBackend&>(b1).index, 1);
  EXPECT_EQ(&t.get(1), &b1);
  EXPECT_EQ(made, 1);
  EXPECT_EQ(t.count(), 2);
  EXPECT_ERROR(t.get(2), "device GPU:2: out of range; this machine has 2 CUDA devices",
               "GPU:0 to GPU:1");
  EXPECT_ERROR(t.get(-1), "device GPU:-1: out of range");
  EXPECT_EQ(probes, 1);
}

TEST(CudaDeviceTable, NoUsableDeviceSaysWhy) {
  cuda::DeviceTable t(
      [](std::string* why) {
        *why = "cudaGetDeviceCount: no CUDA-capable device is detected";
        return -1;
      },
      [](int i) { return std::make_shared<DummyBackend>(i); });
  EXPECT_EQ(t.count(), 0);
  EXPECT_ERROR(t.get(0), "device GPU:0: this binary has the CUDA backend, but no CUDA device",
               "no CUDA-capable device is detected");
}

TEST(CudaDeviceTable, ABuildWithoutCudaSaysHowToGetIt) {
  if (cuda::built()) {
    // A CUDA build: GPU:99 is out of range on any machine, or there is no usable device.
    EXPECT_ERROR(rt({2}).to(Device{DeviceType::GPU, 99}), "device GPU:99");
    return;
  }
  EXPECT_EQ(cuda::find_backend(0), nullptr);
  EXPECT_ERROR(rt({2}).to(Device{DeviceType::GPU, 0}), "built without the CUDA backend",
               "-DCSTORCH_CUDA=ON");
}

// ---- the capability table ----

TEST(CudaCapabilities, TheTableNamesOnlyOpsWithKernelsAndAnswersHonestly) {
  using O = ir::OpCode;
  // The 16-bit kernels: what bf16 and f16 autocast's training graphs run in 16-bit (CudaAmp
  // below proves they need no more), and the data movement ops, which copy elements by size
  // (an eager transpose of a 16-bit operand needs Permute).
  const std::set<O> half = {O::Bernoulli, O::Relu,     O::Gelu, O::Cast,    O::Mul,
                            O::ReluGrad,  O::GeluGrad, O::Sum,  O::Matmul,  O::Linear,
                            O::Slice,     O::Cat,      O::Copy, O::Permute, O::Expand};
  int listed = 0;
  for (int i = 0; i < ir::kNumOps; ++i) {
    const auto op = static_cast<ir::OpCode>(i);
    const uint32_t m = cuda::op_dtypes(op);
    if (!m) continue;
    ++listed;
    // Leaves, aliases and ToDevice run no backend kernel.
    EXPECT_FALSE(ir::has_trait(op, ir::kLeaf) || ir::has_trait(op, ir::kAlias))
        << ir::op_info(op).name;
    EXPECT_NE(op, ir::OpCode::ToDevice);
    // Fused programs read and store bf16 (a cast to or from bf16 joins them), not f16.
    EXPECT_EQ(cuda::supports(op, DType::bf16), half.count(op) > 0 || op == O::Fused)
        << ir::op_info(op).name;
    EXPECT_EQ(cuda::supports(op, DType::f16), half.count(op) > 0) << ir::op_info(op).name;
  }
  EXPECT_TRUE(cuda::fused_reads_bf16() && cuda::fused_stores_bf16());
  EXPECT_EQ(listed, cuda::num_ops()) << "an op is listed twice in cuda_ops.def";
  EXPECT_EQ(cuda::op_dtypes(ir::OpCode::Gemm), 0u);
  // The Fused kernel runs every op the CPU's interpreter does.
  EXPECT_TRUE(cuda::supports(ir::OpCode::Fused, DType::f32));
  for (int i = 0; i < ir::kNumOps; ++i)
    EXPECT_EQ(cuda::fuses(static_cast<ir::OpCode>(i)),
              ir::has_trait(static_cast<ir::OpCode>(i), ir::kFusable))
        << ir::op_info(static_cast<ir::OpCode>(i)).name;
  EXPECT_FALSE(cuda::gemm_epilogue_applies(64, 256, 784, true));
  EXPECT_TRUE(cuda::supports(ir::OpCode::Linear, DType::f32));
  EXPECT_TRUE(cuda::supports(ir::OpCode::Argmax, DType::i64));
  EXPECT_FALSE(cuda::supports(ir::OpCode::Argmax, DType::f32));
  EXPECT_TRUE(cuda::supports(ir::OpCode::Eq, DType::boolean));
  // Integer add and sub (the loss scaler's counters) on i64 only.
  EXPECT_TRUE(cuda::supports(O::Add, DType::i64));
  EXPECT_TRUE(cuda::supports(O::Sub, DType::i64));
  EXPECT_FALSE(cuda::supports(O::Add, DType::i32));
  EXPECT_FALSE(cuda::supports(O::Mul, DType::i64));
}

ir::NodePtr leaf(Shape s, DType t) {
  auto n = std::make_shared<ir::Node>();
  n->op = ir::OpCode::Input;
  n->shape = std::move(s);
  n->dtype = t;
  return n;
}
ir::NodePtr node(ir::OpCode op, ir::Attrs a, std::vector<ir::NodePtr> in, Shape s, DType t) {
  auto n = std::make_shared<ir::Node>();
  n->op = op;
  n->attrs = std::move(a);
  n->inputs = std::move(in);
  n->shape = std::move(s);
  n->dtype = t;
  return n;
}

TEST(CudaCapabilities, NodesTheKernelsCannotRunAreNamedWithTheReason) {
  using O = ir::OpCode;
  auto f = leaf({4, 5, 6}, DType::f32);
  EXPECT_EQ(cuda::unsupported(*node(O::Add, ir::NoAttrs{}, {f, f}, {4, 5, 6}, DType::f32)), "");
  auto h = leaf({4, 5, 6}, DType::bf16);
  EXPECT_NE(cuda::unsupported(*node(O::Add, ir::NoAttrs{}, {h, h}, {4, 5, 6}, DType::bf16))
                .find("does not write dtype bf16"),
            std::string::npos);
  EXPECT_NE(cuda::unsupported(*node(O::Gemm, ir::GemmAttrs{}, {f, f}, {4, 5, 6}, DType::f32))
                .find("gemm: no CUDA kernel"),
            std::string::npos);
  // A reduction over dims that are not adjacent.
  EXPECT_NE(cuda::unsupported(*node(O::Sum, ir::AxesAttrs{{0, 2}, false}, {f}, {5}, DType::f32))
                .find("one run of adjacent dims"),
            std::string::npos);
  EXPECT_EQ(cuda::unsupported(*node(O::Sum, ir::AxesAttrs{{1, 2}, false}, {f}, {4}, DType::f32)),
            "");
  // Attention over a packed q, k, v ([B, T, 3H, D], AttentionAttrs::qkv): the CUDA kernels read
  // three tensors, so the compiler keeps the slices for a CUDA node.
  auto qkv = leaf({2, 4, 6, 8}, DType::f32), q = leaf({2, 4, 2, 8}, DType::f32);
  ir::AttentionAttrs at;
  at.bthd = true;
  EXPECT_EQ(cuda::unsupported(*node(O::Attention, at, {q, q, q}, {2, 4, 2, 8}, DType::f32)), "");
  at.qkv = true;
  EXPECT_NE(cuda::unsupported(*node(O::Attention, at, {qkv, qkv, qkv}, {2, 4, 2, 8}, DType::f32))
                .find("not one packed [B, T, 3H, D] tensor"),
            std::string::npos);
  // Comparisons of two dtypes; casts from and to bf16 and f16.
  auto i = leaf({4, 5, 6}, DType::i64);
  EXPECT_NE(cuda::unsupported(*node(O::Eq, ir::NoAttrs{}, {f, i}, {4, 5, 6}, DType::boolean)), "");
  EXPECT_EQ(cuda::unsupported(*node(O::Eq, ir::NoAttrs{}, {i, i}, {4, 5, 6}, DType::boolean)), "");
  EXPECT_EQ(cuda::unsupported(*node(O::Cast, ir::CastAttrs{}, {h}, {4, 5, 6}, DType::f32)), "");
  EXPECT_EQ(cuda::unsupported(*node(O::Cast, ir::CastAttrs{}, {i}, {4, 5, 6}, DType::f16)), "");
  // 16-bit elementwise ops, sums and products read their own dtype only.
  auto g = leaf({4, 5, 6}, DType::f16);
  EXPECT_EQ(cuda::unsupported(*node(O::Mul, ir::NoAttrs{}, {h, h}, {4, 5, 6}, DType::bf16)), "");
  EXPECT_NE(cuda::unsupported(*node(O::Mul, ir::NoAttrs{}, {h, f}, {4, 5, 6}, DType::bf16))
                .find("does not read input 1 of dtype f32"),
            std::string::npos);
  EXPECT_EQ(cuda::unsupported(*node(O::Sum, ir::AxesAttrs{{0}, false}, {g}, {5, 6}, DType::f16)),
            "");
  EXPECT_NE(cuda::unsupported(*node(O::Sum, ir::AxesAttrs{{0}, false}, {g}, {5, 6}, DType::f32)),
            "");
  EXPECT_NE(cuda::unsupported(*node(O::Mean, ir::AxesAttrs{{0}, false}, {h}, {5, 6}, DType::bf16))
                .find("does not write dtype bf16"),
            std::string::npos);
  auto hm = leaf({6, 5}, DType::bf16), hb = leaf({6}, DType::bf16);
  EXPECT_EQ(cuda::unsupported(*node(O::Matmul, ir::MatmulAttrs{}, {h, hm}, {4, 5, 5}, DType::bf16)),
            "");
  EXPECT_NE(cuda::unsupported(*node(O::Matmul, ir::MatmulAttrs{}, {h, leaf({6, 5}, DType::f16)},
                                    {4, 5, 5}, DType::bf16)),
            "");
  // A 16-bit linear with a bias adds it to its f32 product in the node's workspace.
  auto lx = leaf({4, 5}, DType::bf16), lw = leaf({6, 5}, DType::bf16);
  EXPECT_EQ(
      cuda::workspace_bytes(*node(O::Linear, ir::NoAttrs{}, {lx, lw, hb}, {4, 6}, DType::bf16)),
      4u * 6u * sizeof(float));
  EXPECT_EQ(cuda::workspace_bytes(*node(O::Linear, ir::NoAttrs{}, {lx, lw}, {4, 6}, DType::bf16)),
            0u);
  // Batched products: equal batch dims or a 2-d operand.
  auto a = leaf({3, 4, 5}, DType::f32), b2 = leaf({5, 6}, DType::f32),
       b3 = leaf({3, 5, 6}, DType::f32), b1 = leaf({1, 5, 6}, DType::f32);
  EXPECT_EQ(cuda::unsupported(*node(O::Matmul, ir::MatmulAttrs{}, {a, b2}, {3, 4, 6}, DType::f32)),
            "");
  EXPECT_EQ(cuda::unsupported(*node(O::Matmul, ir::MatmulAttrs{}, {a, b3}, {3, 4, 6}, DType::f32)),
            "");
  EXPECT_NE(cuda::unsupported(*node(O::Matmul, ir::MatmulAttrs{}, {a, b1}, {3, 4, 6}, DType::f32))
                .find("equal batch dims"),
            std::string::npos);
  // nll_loss's targets: i32 or i64, not f32.
  auto lp = leaf({8, 10}, DType::f32), t32 = leaf({8}, DType::i32), tf = leaf({8}, DType::f32);
  EXPECT_EQ(cuda::unsupported(*node(O::NllLoss, ir::LossAttrs{}, {lp, t32}, {}, DType::f32)), "");
  EXPECT_NE(cuda::unsupported(*node(O::NllLoss, ir::LossAttrs{}, {lp, tf}, {}, DType::f32)), "");
  // Fused programs: bf16 inputs (widened) and a bf16 result (rounded) run, f16 does not; the
  // node's dtype must be the program's result type.
  auto fx = leaf({4, 5}, DType::bf16), fy = leaf({4, 5}, DType::f32), fh = leaf({4, 5}, DType::f16);
  auto program = [](DType out) {
    ir::FusedAttrs fa;
    ir::FusedInstr mul;
    mul.op = static_cast<uint16_t>(O::Mul);
    mul.nargs = 2;
    mul.args[0] = 0;
    mul.args[1] = 1;
    fa.code = {mul};
    fa.shape = {4, 5};
    fa.out = out;
    return fa;
  };
  EXPECT_EQ(cuda::unsupported(*node(O::Fused, program(DType::bf16), {fx, fy}, {4, 5}, DType::bf16)),
            "");
  EXPECT_EQ(cuda::unsupported(*node(O::Fused, program(DType::f32), {fx, fy}, {4, 5}, DType::f32)),
            "");
  EXPECT_NE(cuda::unsupported(*node(O::Fused, program(DType::f32), {fh, fy}, {4, 5}, DType::f32))
                .find("input 0 is f16"),
            std::string::npos);
  EXPECT_NE(cuda::unsupported(*node(O::Fused, program(DType::f16), {fx, fy}, {4, 5}, DType::f16))
                .find("f16"),
            std::string::npos);
  EXPECT_NE(cuda::unsupported(*node(O::Fused, program(DType::bf16), {fx, fy}, {4, 5}, DType::f32))
                .find("f32 or bf16"),
            std::string::npos);
  // The program the kernel gets marks the bf16 input and result.
  const auto fp =
      cuda::fused_program(*node(O::Fused, program(DType::bf16), {fx, fy}, {4, 5}, DType::bf16));
  EXPECT_EQ(fp.bf16_inputs, 1u);
  EXPECT_EQ(fp.bool_inputs, 0u);
  EXPECT_EQ(fp.out_bf16, 1);
}

// ---- the stand-in: the CUDA backend's answers over host memory and the CPU kernels ----

std::atomic<int64_t> g_calls[ir::kNumOps];
// Calls whose output is bf16 or f16.
std::atomic<int64_t> g_half_calls[ir::kNumOps];

void counted_cpu_kernel(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                        void* out) {
  g_calls[static_cast<int>(n.op)]++;
  if (n.dtype == DType::bf16 || n.dtype == DType::f16) g_half_calls[static_cast<int>(n.op)]++;
  // What the CUDA kernels check before queuing work (runtime/ops.cpp).
  const std::string why = cuda::unsupported(n);
  if (!why.empty()) fail("stand-in: the CUDA kernel would refuse {}", why);
  // Recorded (kept, run at replay) while a program records, as CUDA graph capture does.
  cstorch::testing::tape_or_run(ir::device_backend(Device{}).kernel(n.op), ctx, n, in, out);
}

class CudaStandIn final : public ir::DeviceBackend {
 public:
  std::string name() const override { return "GPU"; }
  void* allocate(size_t n) const override {
    return std::aligned_alloc(64, (n + 63) / 64 * 64 + 64);
  }
  void deallocate(void* p, size_t) const override { std::free(p); }
  // Host memory, but claims otherwise so that the core goes through the copy functions.
  bool host_accessible() const override { return false; }
  void copy_to_host(void* d, const void* s, size_t n) const override { std::memcpy(d, s, n); }
  void copy_from_host(void* d, const void* s, size_t n) const override { std::memcpy(d, s, n); }
  void copy_on_device(void* d, const void* s, size_t n) const override { std::memmove(d, s, n); }
  void fill_zero(void* d, size_t n) const override { std::memset(d, 0, n); }
  // `hidden`: an op the stand-in answers as if the CUDA backend had no kernel for it, to prove
  // that a missing kernel is refused at compile time.
  explicit CudaStandIn(std::optional<ir::OpCode> hidden = std::nullopt) : hidden_(hidden) {}
  ir::Kernel kernel(ir::OpCode op) const override {
    return cuda::op_dtypes(op) && op != hidden_ ? &counted_cpu_kernel : nullptr;
  }
  size_t workspace_bytes(const ir::Node& n) const override {
    // The CPU kernels' scratch (they run here; CUDA's kernels plan none).
    return ir::device_backend(Device{}).workspace_bytes(n);
  }
  bool supports(ir::OpCode op, DType t) const override {
    return op != hidden_ && cuda::supports(op, t);
  }
  std::string cannot_run(const ir::Node& n) const override { return cuda::unsupported(n); }
  bool fuses(ir::OpCode op) const override { return cuda::fuses(op); }
  bool fused_reads_bf16() const override { return cuda::fused_reads_bf16(); }
  bool fused_stores_bf16() const override { return cuda::fused_stores_bf16(); }
  bool gemm_epilogue_applies(int64_t m, int64_t n, int64_t k, bool tb) const override {
    return cuda::gemm_epilogue_applies(m, n, k, tb);
  }
  int max_rank() const override { return cuda::kCudaMaxRank; }
  // Programs record and replay, as on the GPU (CUDA graphs, on unless CSTORCH_CUDA_GRAPHS=0).
  bool records() const override { return true; }
  void begin_recording() const override { cstorch::testing::tape_begin(); }
  std::unique_ptr<ir::Recording> end_recording(bool keep) const override {
    return cstorch::testing::tape_end(keep);
  }
  void replay(const ir::Recording& r) const override { cstorch::testing::tape_replay(r); }

 private:
  std::optional<ir::OpCode> hidden_;
};

struct StandInScope {
  explicit StandInScope(std::optional<ir::OpCode> hidden = std::nullopt) {
    for (auto& c : g_calls) c = 0;
    cstorch::testing::tape_counters().reset();
    for (auto& c : g_half_calls) c = 0;
    ir::register_device_backend(DeviceType::GPU, std::make_shared<CudaStandIn>(hidden));
  }
  ~StandInScope() { ir::register_device_backend(DeviceType::GPU, nullptr); }
};

class CudaFcMnist : public ::testing::TestWithParam<std::string> {};

// Every op of FC-MNIST's traced training and evaluation steps has a CUDA kernel for its dtypes,
// in the graph the CUDA backend's answers make the compiler build (elementwise fusion, no GEMM
// epilogues); and that graph computes what the CPU's does (to fp32 rounding: the CPU's GEMMs
// carry epilogues).
TEST_P(CudaFcMnist, TheStepsNeedOnlyOpsWithCudaKernels) {
  const std::string opt = GetParam();
  StandInScope scope;
  const Device gpu{DeviceType::GPU, 0};
  auto dev = cstorch::testing::fc_mnist_run(gpu, opt, 4, 32, "[64, 32]");
  auto cpu = cstorch::testing::fc_mnist_run(Device{}, opt, 4, 32, "[64, 32]");
  ASSERT_EQ(dev.train_losses.size(), cpu.train_losses.size());
  for (size_t s = 0; s < dev.train_losses.size(); ++s)
    EXPECT_NEAR(dev.train_losses[s], cpu.train_losses[s], 1e-5 * std::abs(cpu.train_losses[s]))
        << "step " << s;
  for (size_t s = 0; s < dev.eval_losses.size(); ++s)
    EXPECT_NEAR(dev.eval_losses[s], cpu.eval_losses[s], 1e-5 * std::abs(cpu.eval_losses[s]));
  std::string ran;
  for (int i = 0; i < ir::kNumOps; ++i)
    if (g_calls[i] > 0)
      ran += std::string(ran.empty() ? "" : " ") + ir::op_info(ir::OpCode(i)).name;
  std::printf("ops run on the stand-in (%s): %s\n", opt.c_str(), ran.c_str());
  // The steps really ran on the stand-in, products and loss included.
  // (The loss's gradient is the fused cross_entropy_grad, which the CUDA backend has.)
  for (auto op :
       {ir::OpCode::Linear, ir::OpCode::Matmul, ir::OpCode::NllLoss, ir::OpCode::CrossEntropyGrad,
        ir::OpCode::LogSoftmax, ir::OpCode::ReluGrad, ir::OpCode::Argmax})
    EXPECT_GT(g_calls[static_cast<int>(op)].load(), 0) << ir::op_info(op).name;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CudaFcMnist, ::testing::Values("sgd", "adam", "adamw"),
                         [](const auto& info) { return info.param; });

TEST(CudaFcMnistRefusals, OpsAndDtypesWithoutCudaKernelsFailAtCompileNotAtRun) {
  StandInScope scope(ir::OpCode::Tri);  // as if tri had no CUDA kernel
  const Device gpu{DeviceType::GPU, 0};
  runtime::StepDeviceScope step_scope(gpu);
  // An op with no CUDA kernel: the traced step fails when it is compiled, naming op and device.
  auto tri_step = trace([&](const Batch& b) { return tril(b.at("x")).sum(); });
  EXPECT_ERROR(tri_step(Batch{{"x", rt({4, 8})}}), "op 'tri' has no kernel for device GPU:0");
  EXPECT_EQ(g_calls[static_cast<int>(ir::OpCode::Sum)].load(), 0)
      << "a kernel ran before the error";
  // A dtype no CUDA kernel writes (exp has f32 kernels only).
  auto bf16_step = trace([&](const Batch& b) { return exp(cast(b.at("x"), DType::bf16)); });
  EXPECT_ERROR(bf16_step(Batch{{"x", rt({4, 4})}}), "no kernel for dtype bf16 on device GPU:0");
  // Eager: the same errors before any kernel runs.
  Tensor x = rt({4, 8}).to(gpu);
  EXPECT_ERROR(tril(x), "op 'tri' has no kernel for device GPU:0");
  EXPECT_NEAR(sum(x, {0, 1}).item<float>(), rt({4, 8}).sum().item<float>(), 1e-5);
  EXPECT_ERROR(sum(rt({2, 3, 4}).to(gpu), {0, 2}), "op 'sum' cannot run on device GPU:0",
               "one run of adjacent dims");
}

// The Model Zoo Trainer with `device: GPU` on the stand-in: FC-MNIST's fit (SGD + momentum,
// with validation and checkpoints) uses only ops with CUDA kernels, and learns. (One Trainer per
// process: the per-step comparison with the CPU is the traced test above.)
TEST(CudaFcMnistRefusals, TheTrainersFitAndValidateNeedOnlyOpsWithCudaKernels) {
  StandInScope scope;
  auto tiny = [](int64_t batches) {
    Config c = {{"data_processor", "TinyData"}, {"batches", batches}, {"batch_size", 8}};
    return modelzoo::data_processors().create("TinyData", modelzoo::ConfigView(c, "x"), "x");
  };
  const auto dir = cstorch::testing::temp_dir("cuda_standin", "trainer");
  Config c = parse_config("device: GPU\nmodel_dir: " + dir.string() +
                          "\nseed: 3\nmodel: {name: fc_mnist, depth: 2, hidden_size: 16}\n"
                          "optimizer: {SGD: {lr: 0.05, momentum: 0.9}}\n"
                          "loop: {max_steps: 24, eval_frequency: 12, eval_steps: 2}\n"
                          "checkpoint: {steps: 12}\nlogging: {log_steps: 4}\n");
  modelzoo::Trainer t(modelzoo::ConfigView(c, "trainer.init"));
  const double before = t.validate(tiny(2));
  t.fit(tiny(8), tiny(2));
  const double after = t.validate(tiny(2));
  EXPECT_LT(after, before);
  EXPECT_TRUE(std::filesystem::exists(dir / "checkpoint_24.mdl"));
  EXPECT_EQ(t.model().parameters()[0].device(), (Device{DeviceType::GPU, 0}));
  for (auto op : {ir::OpCode::Linear, ir::OpCode::Matmul, ir::OpCode::Addcmul,
                  ir::OpCode::CrossEntropyGrad, ir::OpCode::Argmax})
    EXPECT_GT(g_calls[static_cast<int>(op)].load(), 0) << ir::op_info(op).name;
}

// ---- the language models ----

class CudaModels : public ::testing::TestWithParam<std::string> {};

// Every Model Zoo language model's traced AdamW step, dropout on, compiles on the CUDA backend's
// answers with only ops that have CUDA kernels, and computes what the CPU's graph computes (to
// fp32 rounding: the CPU's GEMMs carry epilogues that the CUDA graph keeps as separate ops). The
// embeddings' lookups and gradients, attention forward and backward, the dropout draws and
// Fused programs are among the ops that ran.
TEST_P(CudaModels, TracedTrainingStepsNeedOnlyOpsWithCudaKernels) {
  const std::string name = GetParam();
  const std::string yaml = cstorch::testing::lm_yaml(name, 0.1);
  const std::vector<Batch> batches = {cstorch::testing::text_batch(name, 0),
                                      cstorch::testing::text_batch(name, 5)};
  auto adamw = [](nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(m.parameters(), 3e-3);
  };
  StandInScope scope;
  const auto dev =
      cstorch::testing::lm_run(Device{DeviceType::GPU, 0}, name, yaml, adamw, batches, 4);
  const auto cpu = cstorch::testing::lm_run(Device{}, name, yaml, adamw, batches, 4);
  ASSERT_EQ(dev.losses.size(), cpu.losses.size());
  for (size_t s = 0; s < dev.losses.size(); ++s)
    EXPECT_NEAR(dev.losses[s], cpu.losses[s], 1e-5 * std::abs(cpu.losses[s])) << "step " << s;
  std::string ran;
  for (int i = 0; i < ir::kNumOps; ++i)
    if (g_calls[i] > 0)
      ran += std::string(ran.empty() ? "" : " ") + ir::op_info(ir::OpCode(i)).name;
  std::printf("ops run on the stand-in (%s): %s\n", name.c_str(), ran.c_str());
  for (auto op : {ir::OpCode::IndexSelect, ir::OpCode::IndexAdd, ir::OpCode::Attention,
                  ir::OpCode::AttentionGrad, ir::OpCode::Bernoulli, ir::OpCode::Fused})
    EXPECT_GT(g_calls[static_cast<int>(op)].load(), 0) << ir::op_info(op).name;
  if (name != "t5") {  // layer norm's variance (T5's RMS norm has none)
    EXPECT_GT(g_calls[static_cast<int>(ir::OpCode::Var)].load(), 0);
  }
  // The device's training step was recorded at its third execution and replayed then and at the
  // fourth (the CPU's runs record nothing), as a CUDA graph would be.
  EXPECT_EQ(cstorch::testing::tape_counters().recordings.load(), 1);
  EXPECT_EQ(cstorch::testing::tape_counters().replays.load(), 2);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModels, ::testing::Values("gpt2", "bert", "transformer", "t5"),
                         [](const auto& info) { return info.param; });

// ---- mixed precision ----

// `steps` traced AdamW steps of a Model Zoo model under autocast(dt) on `dev`, from the weights
// seed 11 gives: the forward pass in autocast, the backward and the update through
// amp::optimizer_step, with a dynamic GradScaler for f16 (its narrow exponent needs the loss
// scaled) and none for bf16. The per-step losses.
std::vector<float> amp_losses(Device dev, const std::string& name, const std::string& yaml,
                              DType dt, const std::vector<Batch>& batches, int steps) {
  runtime::StepDeviceScope scope(dev);
  manual_seed(11);
  auto model = cstorch::testing::zoo_model(name, yaml);
  model->to(dev);
  optim::AdamW opt(model->parameters(), 1e-3);
  std::optional<amp::GradScaler> scaler;
  if (dt == DType::f16) scaler.emplace("dynamic");
  auto step = trace([&](const Batch& b) {
    Tensor l;
    {
      amp::autocast ac(dt);
      l = model->loss(b);
    }
    amp::optimizer_step(l, opt, scaler ? &*scaler : nullptr);
    opt.zero_grad();
    return l;
  });
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) losses.push_back(step(batches[s % batches.size()]).item<float>());
  return losses;
}

struct AmpCase {
  std::string model;
  DType dtype;
};

class CudaAmp : public ::testing::TestWithParam<AmpCase> {};

// FC-MNIST's and GPT-2's traced training steps under bf16 and f16 autocast (f16 with dynamic loss
// scaling) compile on the CUDA backend's answers with only ops that have CUDA kernels for the
// dtypes they write and read, and compute what the CPU's graphs compute (the stand-in runs the
// CPU's kernels; only the graph differs: no GEMM epilogues, the CUDA backend's fusion).
TEST_P(CudaAmp, AutocastTrainingStepsNeedOnlyOpsWithCudaKernels) {
  const AmpCase c = GetParam();
  const std::string yaml = c.model == "gpt2" ? cstorch::testing::lm_yaml("gpt2", 0.1)
                                             : std::string("hidden_sizes: [64, 32]\n");
  std::vector<Batch> batches;
  for (int i = 0; i < 2; ++i)
    batches.push_back(c.model == "gpt2" ? cstorch::testing::text_batch("gpt2", 5 * i)
                                        : cstorch::testing::fc_batch(16, static_cast<uint32_t>(i)));
  StandInScope scope;
  const auto dev = amp_losses(Device{DeviceType::GPU, 0}, c.model, yaml, c.dtype, batches, 4);
  std::string ran, half;
  for (int i = 0; i < ir::kNumOps; ++i) {
    if (g_calls[i] > 0)
      ran += std::string(ran.empty() ? "" : " ") + ir::op_info(ir::OpCode(i)).name;
    if (g_half_calls[i] > 0)
      half += std::string(half.empty() ? "" : " ") + ir::op_info(ir::OpCode(i)).name;
  }
  std::printf("ops run on the stand-in (%s, %s): %s\n  of which in 16-bit: %s\n", c.model.c_str(),
              dtype_name(c.dtype), ran.c_str(), half.c_str());
  // The products, the casts around them, the activations, their gradients and the bias
  // gradients' sums ran in 16-bit: the graphs need the 16-bit kernels, not only their absence.
  using O = ir::OpCode;
  std::vector<O> want = {O::Cast, O::Linear, O::Matmul, O::Sum};
  for (O op : c.model == "gpt2" ? std::vector<O>{O::Gelu, O::GeluGrad, O::Mul, O::Bernoulli}
                                : std::vector<O>{O::Relu, O::ReluGrad})
    want.push_back(op);
  for (O op : want) EXPECT_GT(g_half_calls[static_cast<int>(op)].load(), 0) << ir::op_info(op).name;
  const auto cpu = amp_losses(Device{}, c.model, yaml, c.dtype, batches, 4);
  ASSERT_EQ(dev.size(), cpu.size());
  for (size_t s = 0; s < dev.size(); ++s) {
    EXPECT_TRUE(std::isfinite(cpu[s])) << "step " << s;
    EXPECT_NEAR(dev[s], cpu[s], 1e-5 * std::abs(cpu[s])) << "step " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Autocast, CudaAmp,
    ::testing::Values(AmpCase{"fc_mnist", DType::bf16}, AmpCase{"fc_mnist", DType::f16},
                      AmpCase{"gpt2", DType::bf16}, AmpCase{"gpt2", DType::f16}),
    [](const auto& info) { return info.param.model + "_" + dtype_name(info.param.dtype); });

}  // namespace
