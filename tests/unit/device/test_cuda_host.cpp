// The CUDA backend's host-side logic, tested in every build (no GPU, no toolkit needed): the
// caching allocator's policy over a fake raw allocator, the device table (selection, index and
// driver errors), the capability table against ops.def, and, through a stand-in backend that
// answers every question as the CUDA backend does but runs the CPU kernels, proof that the graphs
// a CUDA build compiles for FC-MNIST's training and evaluation steps (SGD + momentum, Adam, AdamW)
// need only ops that have CUDA kernels, and that everything else is refused at compile time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include <cstorch/amp.h>
#include <cstorch/cstorch.h>

#include "backend/cuda/block_cache.h"
#include "backend/cuda/capabilities.h"
#include "backend/cuda/device.h"
#include "backend/cuda/device_table.h"
#include "ir/device.h"
#include "modelzoo/registry.h"
#include "modelzoo/trainer.h"
#include "support/fc_steps.h"
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
  int listed = 0;
  for (int i = 0; i < ir::kNumOps; ++i) {
    const auto op = static_cast<ir::OpCode>(i);
    const uint32_t m = cuda::op_dtypes(op);
    if (!m) continue;
    ++listed;
    // Leaves, aliases and ToDevice run no backend kernel; collectives and Fused have none yet.
    EXPECT_FALSE(ir::has_trait(op, ir::kLeaf) || ir::has_trait(op, ir::kAlias) ||
                 ir::has_trait(op, ir::kCollective))
        << ir::op_info(op).name;
    EXPECT_NE(op, ir::OpCode::ToDevice);
    EXPECT_FALSE(cuda::supports(op, DType::bf16)) << ir::op_info(op).name << ": no 16-bit kernels";
    EXPECT_FALSE(cuda::supports(op, DType::f16)) << ir::op_info(op).name;
  }
  EXPECT_EQ(listed, cuda::num_ops()) << "an op is listed twice in cuda_ops.def";
  EXPECT_EQ(cuda::op_dtypes(ir::OpCode::Fused), 0u);
  EXPECT_EQ(cuda::op_dtypes(ir::OpCode::Gemm), 0u);
  EXPECT_EQ(cuda::op_dtypes(ir::OpCode::Attention), 0u);
  for (int i = 0; i < ir::kNumOps; ++i) EXPECT_FALSE(cuda::fuses(static_cast<ir::OpCode>(i)));
  EXPECT_FALSE(cuda::gemm_epilogue_applies(64, 256, 784, true));
  EXPECT_TRUE(cuda::supports(ir::OpCode::Linear, DType::f32));
  EXPECT_TRUE(cuda::supports(ir::OpCode::Argmax, DType::i64));
  EXPECT_FALSE(cuda::supports(ir::OpCode::Argmax, DType::f32));
  EXPECT_TRUE(cuda::supports(ir::OpCode::Eq, DType::boolean));
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
  EXPECT_NE(cuda::unsupported(*node(O::Tri, ir::TriAttrs{}, {f}, {4, 5, 6}, DType::f32))
                .find("tri: no CUDA kernel"),
            std::string::npos);
  // A reduction over dims that are not adjacent.
  EXPECT_NE(cuda::unsupported(*node(O::Sum, ir::AxesAttrs{{0, 2}, false}, {f}, {5}, DType::f32))
                .find("one run of adjacent dims"),
            std::string::npos);
  EXPECT_EQ(cuda::unsupported(*node(O::Sum, ir::AxesAttrs{{1, 2}, false}, {f}, {4}, DType::f32)),
            "");
  // Comparisons of two dtypes; a cast from bf16.
  auto i = leaf({4, 5, 6}, DType::i64);
  EXPECT_NE(cuda::unsupported(*node(O::Eq, ir::NoAttrs{}, {f, i}, {4, 5, 6}, DType::boolean)), "");
  EXPECT_EQ(cuda::unsupported(*node(O::Eq, ir::NoAttrs{}, {i, i}, {4, 5, 6}, DType::boolean)), "");
  EXPECT_NE(cuda::unsupported(*node(O::Cast, ir::CastAttrs{}, {h}, {4, 5, 6}, DType::f32)), "");
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
}

// ---- the stand-in: the CUDA backend's answers over host memory and the CPU kernels ----

std::atomic<int64_t> g_calls[ir::kNumOps];

void counted_cpu_kernel(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                        void* out) {
  g_calls[static_cast<int>(n.op)]++;
  // What the CUDA kernels check before queuing work (runtime/ops.cpp).
  const std::string why = cuda::unsupported(n);
  if (!why.empty()) fail("stand-in: the CUDA kernel would refuse {}", why);
  ir::device_backend(Device{}).kernel(n.op)(ctx, n, in, out);
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
  ir::Kernel kernel(ir::OpCode op) const override {
    return cuda::op_dtypes(op) ? &counted_cpu_kernel : nullptr;
  }
  size_t workspace_bytes(const ir::Node& n) const override {
    // The CPU kernels' scratch (they run here; CUDA's kernels plan none).
    return ir::device_backend(Device{}).workspace_bytes(n);
  }
  bool supports(ir::OpCode op, DType t) const override { return cuda::supports(op, t); }
  std::string cannot_run(const ir::Node& n) const override { return cuda::unsupported(n); }
  bool fuses(ir::OpCode op) const override { return cuda::fuses(op); }
  bool gemm_epilogue_applies(int64_t m, int64_t n, int64_t k, bool tb) const override {
    return cuda::gemm_epilogue_applies(m, n, k, tb);
  }
  int max_rank() const override { return cuda::kCudaMaxRank; }
};

struct StandInScope {
  StandInScope() {
    for (auto& c : g_calls) c = 0;
    ir::register_device_backend(DeviceType::GPU, std::make_shared<CudaStandIn>());
  }
  ~StandInScope() { ir::register_device_backend(DeviceType::GPU, nullptr); }
};

class CudaFcMnist : public ::testing::TestWithParam<std::string> {};

// Every op of FC-MNIST's traced training and evaluation steps has a CUDA kernel for its dtypes,
// in the graph the CUDA backend's answers make the compiler build (no fusion, no GEMM epilogues);
// and that graph computes what the CPU's does (to fp32 rounding: the CPU's graph is fused).
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
  for (auto op : {ir::OpCode::Linear, ir::OpCode::Matmul, ir::OpCode::NllLoss,
                  ir::OpCode::NllLossGrad, ir::OpCode::LogSoftmax, ir::OpCode::LogSoftmaxGrad,
                  ir::OpCode::ReluGrad, ir::OpCode::Argmax})
    EXPECT_GT(g_calls[static_cast<int>(op)].load(), 0) << ir::op_info(op).name;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CudaFcMnist, ::testing::Values("sgd", "adam", "adamw"),
                         [](const auto& info) { return info.param; });

TEST(CudaFcMnistRefusals, OpsAndDtypesWithoutCudaKernelsFailAtCompileNotAtRun) {
  StandInScope scope;
  const Device gpu{DeviceType::GPU, 0};
  runtime::StepDeviceScope step_scope(gpu);
  // An op with no CUDA kernel: the traced step fails when it is compiled, naming op and device.
  auto tri_step = trace([&](const Batch& b) { return tril(b.at("x")).sum(); });
  EXPECT_ERROR(tri_step(Batch{{"x", rt({4, 8})}}), "op 'tri' has no kernel for device GPU:0");
  EXPECT_EQ(g_calls[static_cast<int>(ir::OpCode::Sum)].load(), 0)
      << "a kernel ran before the error";
  // A dtype no CUDA kernel writes (bf16 autocast).
  auto bf16_step = trace([&](const Batch& b) {
    amp::autocast ac(DType::bf16);
    return matmul(b.at("x"), b.at("x"));
  });
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
                  ir::OpCode::NllLossGrad, ir::OpCode::Argmax})
    EXPECT_GT(g_calls[static_cast<int>(op)].load(), 0) << ir::op_info(op).name;
}

}  // namespace
