// The device layer, proven on the checking device (tests/support/checking_device.h): tensors
// and compiled programs that live on a device whose memory host code must not touch. Results
// must be bitwise those of the CPU, since the device runs the CPU kernels through the device ABI.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <set>
#include <tuple>

#include <cstorch/amp.h>
#include <cstorch/checkpoint.h>
#include <cstorch/cstorch.h>

#include "backend/cuda/device.h"
#include "core/internal.h"
#include "ir/device.h"
#include "modelzoo/model.h"
#include "modelzoo/registry.h"
#include "runtime/run_mode.h"
#include "support/checking_device.h"
#include "support/lm_steps.h"
#include "unit/test_util.h"

namespace {

using namespace cstorch;
using cstorch::testing::checking_device_stats;
using cstorch::testing::lm_yaml;
using cstorch::testing::register_checking_device;
using cstorch::testing::rt;
using cstorch::testing::text_batch;
using cstorch::testing::zoo_model;

Device check() {
  return register_checking_device();
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  auto x = detail::host_bytes(a, "test"), y = detail::host_bytes(b, "test");
  return std::memcmp(x.data(), y.data(), x.size()) == 0;
}

TEST(Device, IdentityAndTransfers) {
  const Device d = check();
  EXPECT_EQ(device_str(d), "check:0");
  EXPECT_EQ(parse_device("check"), d);
  EXPECT_EQ(parse_device("CPU"), Device{});
  Tensor x = rt({3, 4});
  EXPECT_EQ(x.device(), Device{});
  Tensor y = x.to(d);
  EXPECT_EQ(y.device(), d);
  EXPECT_TRUE(y.to(d).node() == y.node());  // already there: the same tensor
  const auto before = checking_device_stats();
  EXPECT_EQ(y.to_vector<float>(), x.to_vector<float>());  // through the transfer function
  EXPECT_GT(checking_device_stats().to_host, before.to_host);
  EXPECT_FLOAT_EQ(y.sum().item<float>(), x.sum().item<float>());
  EXPECT_TRUE(bitwise_equal(y.to(Device{}), x));
}

TEST(Device, HostCodeTouchingDeviceMemoryFaults) {
  const Device d = check();
  Tensor y = rt({64}).to(d);
  const float* p = static_cast<const float*>(y.node()->buffer->data);
  // A stray host read (what a forgotten transfer would do) faults at once and is named.
  EXPECT_DEATH(
      {
        volatile float v = p[0];
        (void)v;
      },
      "host code touched device memory");
  EXPECT_ERROR(y.data_ptr(), "whose memory the host cannot read");
}

TEST(Device, MixedDevicesAreAnErrorNamingOpAndDevices) {
  const Device d = check();
  Tensor a = rt({2, 3}).to(d), b = rt({2, 3});
  EXPECT_ERROR(add(a, b), "add: input 1 is on device CPU but input 0 is on device check:0");
  EXPECT_ERROR(matmul(b, rt({3, 2}).to(d)), "matmul");
  // CPU scalars (0-d) join any device, as in PyTorch: hyper-parameters live on the CPU.
  Tensor s = scalar_tensor(2.0);
  EXPECT_EQ(mul(a, s).device(), d);
  EXPECT_TRUE(bitwise_equal(mul(a, s).to(Device{}), mul(a.to(Device{}), s)));
  EXPECT_EQ((a * 3.0).device(), d);
}

TEST(Device, GpuWithoutTheCudaBackendSaysHowToBuildIt) {
  if (cuda::built()) {  // a CUDA build: an unusable GPU is named with the reason instead
    EXPECT_ERROR(rt({2}).to(Device{DeviceType::GPU, 4096}), "device GPU:4096");
    return;
  }
  EXPECT_ERROR(rt({2}).to(Device{DeviceType::GPU, 0}),
               "built without the CUDA backend; configure with -DCSTORCH_CUDA=ON");
  nn::Linear lin(2, 2);
  EXPECT_ERROR(lin->to(Device{DeviceType::GPU, 0}), "built without the CUDA backend");
  EXPECT_ERROR(zeros({2}, DType::f32, Device{DeviceType::GPU, 0}), "CUDA backend");
}

TEST(Device, GradientsFlowBackAcrossATransfer) {
  const Device d = check();
  Tensor w = rt({4, 3}, 2).set_requires_grad();
  Tensor x = rt({5, 4}, 3).to(d);
  Tensor loss = (tanh(matmul(x, w.to(d))) * 0.5).sum();
  loss.backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(w.grad().device(), Device{});
  Tensor w2 = rt({4, 3}, 2).set_requires_grad();
  (tanh(matmul(x.to(Device{}), w2)) * 0.5).sum().backward();
  EXPECT_TRUE(bitwise_equal(w.grad(), w2.grad()));
}

TEST(Device, ModuleToMovesParametersAndOptimizerStateFollows) {
  const Device d = check();
  manual_seed(3);
  nn::Sequential m(nn::Linear(6, 8), nn::ReLU(), nn::Linear(8, 2));
  manual_seed(3);
  nn::Sequential ref(nn::Linear(6, 8), nn::ReLU(), nn::Linear(8, 2));
  m->to(d);
  for (auto& p : m->parameters()) {
    EXPECT_EQ(p.device(), d);
    EXPECT_TRUE(p.requires_grad() && p.is_leaf());
  }
  optim::Adam opt(m->parameters(), 1e-2), opt_ref(ref->parameters(), 1e-2);
  Tensor x = rt({4, 6}, 7), y = from_vector(std::vector<int64_t>{0, 1, 1, 0}, {4});
  for (int s = 0; s < 3; ++s) {
    Tensor l = cross_entropy(m(x.to(d)), y.to(d));
    l.backward();
    opt.step();
    opt.zero_grad();
    Tensor lr = cross_entropy(ref(x), y);
    lr.backward();
    opt_ref.step();
    opt_ref.zero_grad();
    EXPECT_EQ(l.item<float>(), lr.item<float>()) << "step " << s;
  }
  auto ps = m->parameters(), rs = ref->parameters();
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(bitwise_equal(ps[i], rs[i]));
}

// A traced training step on the device and on the CPU, from the same initial weights and
// batches: losses and final weights bitwise equal, and the device program really ran there.
template <class MakeModel, class MakeOpt, class Loss>
void compare_traced(MakeModel make_model, MakeOpt make_opt, Loss loss_fn,
                    const std::vector<Batch>& batches, int steps) {
  const Device d = check();
  auto run = [&](Device dev) {
    runtime::StepDeviceScope scope(dev);
    manual_seed(11);
    auto model = make_model();
    model->to(dev);
    auto opt = make_opt(*model);
    auto step = trace([&](const Batch& b) {
      Tensor l = loss_fn(*model, b);
      l.backward();
      opt->step();
      opt->zero_grad();
      return l;
    });
    std::vector<float> losses;
    for (int s = 0; s < steps; ++s)
      losses.push_back(step(batches[s % batches.size()]).template item<float>());
    std::vector<Tensor> params;
    for (auto& p : model->parameters()) params.push_back(p.to(Device{}));
    return std::make_pair(losses, params);
  };
  const auto before = checking_device_stats();
  auto [dev_losses, dev_params] = run(d);
  const auto after = checking_device_stats();
  auto [cpu_losses, cpu_params] = run(Device{});
  EXPECT_GT(after.kernels - before.kernels, steps * 5) << "the step did not run on the device";
  ASSERT_EQ(dev_losses.size(), cpu_losses.size());
  for (size_t s = 0; s < dev_losses.size(); ++s)
    EXPECT_EQ(dev_losses[s], cpu_losses[s]) << "step " << s;  // bitwise: same kernels, same order
  ASSERT_EQ(dev_params.size(), cpu_params.size());
  for (size_t i = 0; i < dev_params.size(); ++i)
    EXPECT_TRUE(bitwise_equal(dev_params[i], cpu_params[i])) << "parameter " << i;
}

Batch mnist_like_batch(uint32_t seed) {
  std::vector<int64_t> y(32);
  for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>((i * 7 + seed) % 10);
  return {{"x", rt({32, 784}, seed)}, {"y", from_vector(y, {32})}};
}

// CSTORCH_PROFILE on a device with a kernel clock (ir::KernelClock): the program's kernels are
// timed on the device's clock, one mark after each call, and the table says so; without the
// profile the clock is never used.
TEST(Device, TheProfileTimesADevicesKernelsOnItsClock) {
  const Device d = check();
  auto run_steps = [&](bool profile) {
    if (profile)
      setenv("CSTORCH_PROFILE", "1", 1);
    else
      unsetenv("CSTORCH_PROFILE");
    runtime::StepDeviceScope scope(d);
    manual_seed(5);
    auto model =
        std::make_shared<nn::SequentialImpl>(nn::Linear(784, 64), nn::ReLU(), nn::Linear(64, 10));
    model->to(d);
    optim::SGD opt(model->parameters(), 0.01, 0.9);
    const auto before = checking_device_stats();
    ::testing::internal::CaptureStderr();
    {
      auto step = trace([&](const Batch& b) {
        Tensor l = cross_entropy(model->forward(b.at("x")), b.at("y"));
        l.backward();
        opt.step();
        opt.zero_grad();
        return l;
      });
      for (int s = 0; s < 4; ++s) (void)step(mnist_like_batch(s)).item<float>();
    }  // the program prints its profile when it goes
    const std::string err = ::testing::internal::GetCapturedStderr();
    unsetenv("CSTORCH_PROFILE");
    const auto after = checking_device_stats();
    return std::make_tuple(err, after.clock_marks - before.clock_marks,
                           after.kernels - before.kernels);
  };
  const auto [err, marks, kernels] = run_steps(true);
  EXPECT_NE(err.find("3 executions after the first"), std::string::npos) << err;
  EXPECT_NE(err.find("check:0's clock"), std::string::npos) << err;
  EXPECT_NE(err.find("linear"), std::string::npos) << err;
  // One mark per kernel call of each of the 4 executions (a one-pass group is one call).
  EXPECT_GT(marks, 4 * 5);
  EXPECT_EQ(marks % 4, 0);
  EXPECT_LE(marks, kernels);
  const auto [quiet, no_marks, kernels_too] = run_steps(false);
  EXPECT_EQ(quiet.find("cstorch profile"), std::string::npos) << quiet;
  EXPECT_EQ(no_marks, 0);
  EXPECT_GT(kernels_too, 4 * 5);
}

TEST(Device, TracedFcStepWithSgdMomentumIsBitwiseTheCpus) {
  std::vector<Batch> batches = {mnist_like_batch(1), mnist_like_batch(2)};
  compare_traced(
      [] {
        return std::make_shared<nn::SequentialImpl>(nn::Linear(784, 256), nn::ReLU(),
                                                    nn::Dropout(0.1), nn::Linear(256, 256),
                                                    nn::ReLU(), nn::Linear(256, 10));
      },
      [](nn::Module& m) { return std::make_unique<optim::SGD>(m.parameters(), 0.01, 0.9); },
      [](nn::Module& m, const Batch& b) { return cross_entropy(m.forward(b.at("x")), b.at("y")); },
      batches, 6);
}

TEST(Device, TracedMixedPrecisionStepIsBitwiseTheCpus) {
  std::vector<Batch> batches = {mnist_like_batch(3), mnist_like_batch(4)};
  compare_traced(
      [] {
        return std::make_shared<nn::SequentialImpl>(nn::Linear(784, 64), nn::GELU(),
                                                    nn::Linear(64, 10));
      },
      [](nn::Module& m) { return std::make_unique<optim::AdamW>(m.parameters(), 1e-3); },
      [](nn::Module& m, const Batch& b) {
        Tensor logits;
        {
          amp::autocast ac(DType::bf16);
          logits = m.forward(b.at("x"));
        }
        return cross_entropy(logits, b.at("y"));
      },
      batches, 4);
}

class DeviceModels : public ::testing::TestWithParam<std::string> {};

// Every Model Zoo language model trains on the device exactly as on the CPU (dropout on, so the
// random draws are made on the device too).
TEST_P(DeviceModels, TracedAdamWStepsAreBitwiseTheCpus) {
  const std::string name = GetParam();
  const std::string yaml = lm_yaml(name, 0.1);
  compare_traced([&] { return zoo_model(name, yaml); },
                 [](nn::Module& m) { return std::make_unique<optim::AdamW>(m.parameters(), 3e-3); },
                 [](modelzoo::Model& m, const Batch& b) { return m.loss(b); }, {text_batch(name)},
                 3);
}

// A traced evaluation step of every language model on the device: its metrics (perplexity,
// accuracy; states made on the CPU) move to the device at their first update and accumulate
// there, bitwise as on the CPU. Before, the first in-place add of an unplaced state mixed
// devices and the eval step failed with "to(device): this tensor ... was computed inside a
// traced step".
TEST_P(DeviceModels, TracedEvalStepsUpdateTheMetricsAsOnTheCpu) {
  const std::string name = GetParam();
  const std::string yaml = lm_yaml(name, 0.0);
  auto run = [&](Device dev) {
    runtime::StepDeviceScope scope(dev);
    manual_seed(5);
    auto model = zoo_model(name, yaml);
    model->to(dev);
    model->eval();
    auto step = trace([&](const Batch& b) { return model->loss(b); });
    for (int s = 0; s < 2; ++s) step(text_batch(name)).template item<float>();
    std::vector<std::pair<std::string, double>> values;
    for (metrics::Metric* m : metrics::live_metrics()) values.emplace_back(m->name(), m->compute());
    return values;
  };
  const auto on_device = run(check());
  const auto on_cpu = run(Device{});
  ASSERT_FALSE(on_cpu.empty()) << "the model updated no metric";
  EXPECT_EQ(on_device, on_cpu);
}

TEST(Device, UnweightedThenWeightedMetricUpdatesInATracedStepAreTheCpus) {
  auto run = [](Device dev) {
    runtime::StepDeviceScope scope(dev);
    metrics::AccuracyMetric acc("acc");
    metrics::PerplexityMetric ppl("ppl");
    metrics::MeanMetric mean("mean");
    auto step = trace([&](const Batch& b) {
      Tensor labels = b.at("y").to(dev), logits = b.at("x").to(dev);
      Tensor pred = cast(argmax(logits, -1), labels.dtype()), w = ones({8}, DType::f32, dev);
      // Unweighted updates first (their states start on the CPU), then weighted ones.
      acc.update(labels, pred);
      acc.update(labels, pred, w);
      ppl.update(labels, sum(logits));
      ppl.update(labels, sum(logits), w);
      mean.update(logits);
      mean.update(logits, ones({8, 4}, DType::f32, dev));
      return sum(logits);
    });
    for (int s = 0; s < 3; ++s) {
      std::vector<int64_t> y(8);
      for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<int64_t>((i * 3 + s) % 4);
      step(Batch{{"x", rt({8, 4}, 40 + s)}, {"y", from_vector(y, {8})}}).template item<float>();
    }
    return std::vector<double>{acc.compute(), ppl.compute(), mean.compute()};
  };
  const auto on_device = run(check());
  EXPECT_EQ(on_device, run(Device{}));
}

INSTANTIATE_TEST_SUITE_P(Models, DeviceModels,
                         ::testing::Values("gpt2", "bert", "transformer", "t5"),
                         [](const auto& info) { return info.param; });

TEST(Device, CheckpointsSaveFromAndLoadToTheDevice) {
  const Device d = check();
  const std::string path = ::testing::TempDir() + "/device_ckpt.mdl";
  State s = State::map();
  Tensor w = rt({5, 7}, 9);
  s.set("w", State(w.to(d)));
  save(s, path);
  State back = load(path, d);
  Tensor t = back.at("w").as_tensor();
  EXPECT_EQ(t.device(), d);
  EXPECT_TRUE(bitwise_equal(t.to(Device{}), w));
  EXPECT_EQ(load(path).at("w").as_tensor().device(), Device{});
}

}  // namespace

namespace {

// A backend with host memory and no kernels at all, in the GPU slot for the length of a test:
// every op on it is an error naming the op and the device, eager or traced (no silent CPU
// fallback inside a step).
class NoKernels final : public ir::DeviceBackend {
 public:
  std::string name() const override { return "GPU"; }
  void* allocate(size_t n) const override {
    return std::aligned_alloc(64, (n + 63) / 64 * 64 + 64);
  }
  void deallocate(void* p, size_t) const override { std::free(p); }
  bool host_accessible() const override { return true; }
  void copy_to_host(void* d, const void* s, size_t n) const override { std::memcpy(d, s, n); }
  void copy_from_host(void* d, const void* s, size_t n) const override { std::memcpy(d, s, n); }
  void copy_on_device(void* d, const void* s, size_t n) const override { std::memmove(d, s, n); }
  void fill_zero(void* d, size_t n) const override { std::memset(d, 0, n); }
  ir::Kernel kernel(ir::OpCode) const override { return nullptr; }
};

TEST(Device, AMissingKernelIsAnErrorNamingTheOpAndTheDevice) {
  ir::register_device_backend(DeviceType::GPU, std::make_shared<NoKernels>());
  struct Unregister {
    ~Unregister() { ir::register_device_backend(DeviceType::GPU, nullptr); }
  } unregister;
  const Device gpu{DeviceType::GPU, 0};
  Tensor a = rt({2, 3}).to(gpu);  // transfers are the core's, not the backend's
  EXPECT_EQ(a.to_vector<float>(), rt({2, 3}).to_vector<float>());
  EXPECT_ERROR(add(a, a), "op 'add' has no kernel for device GPU:0");
  runtime::StepDeviceScope scope(gpu);
  auto step = trace([&](const Batch& b) { return mul(b.at("x"), b.at("x")); });
  EXPECT_ERROR(step(Batch{{"x", rt({2, 3})}}), "op 'mul' has no kernel for device GPU:0");
}

// The CPU's allocator staggers large blocks within their first page (cache colouring, see
// src/backend/cpu/device.cpp): consecutive large blocks start at different offsets, all on a
// cache line; every byte is usable; freeing returns the libc block (the sanitizer leg checks
// that nothing leaks or is freed twice), also past the cache of freed blocks.
TEST(Device, CpuLargeBlocksStartAtStaggeredLineAlignedOffsets) {
  const ir::DeviceBackend& cpu = ir::device_backend(Device{});
  // Odd sizes (rounded up inside) so that no freed block of the same size is in the cache.
  const size_t sizes[] = {(size_t{1} << 20) + 4 * 4096 + 12, (size_t{1} << 20) + 5 * 4096 + 12,
                          (size_t{1} << 20) + 6 * 4096 + 12, (size_t{1} << 20) + 7 * 4096 + 12};
  std::vector<void*> blocks;
  std::set<uintptr_t> offsets;
  for (size_t n : sizes) {
    void* p = cpu.allocate(n);
    ASSERT_NE(p, nullptr);
    const auto a = reinterpret_cast<uintptr_t>(p);
    EXPECT_EQ(a % 64, 0u) << n;
    offsets.insert(a % 4096);
    std::memset(p, 0xab, n);  // every byte of the block is usable
    EXPECT_EQ(static_cast<unsigned char*>(p)[n - 1], 0xab);
    blocks.push_back(p);
  }
  EXPECT_EQ(offsets.size(), std::size(sizes)) << "consecutive large blocks share a page offset";
  // Small blocks are not staggered: 64-byte aligned as before.
  void* small = cpu.allocate(1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  cpu.deallocate(small, 1000);
  for (size_t i = 0; i < blocks.size(); ++i) cpu.deallocate(blocks[i], sizes[i]);
  // A block larger than the cache of freed blocks (256 MiB) goes back to libc at once.
  const size_t huge = (size_t{300} << 20) + 12;
  void* h = cpu.allocate(huge);
  ASSERT_NE(h, nullptr);
  static_cast<char*>(h)[0] = 1;
  static_cast<char*>(h)[huge - 1] = 1;
  cpu.deallocate(h, huge);
}

}  // namespace
