// Recorded programs (DeviceBackend::records: CUDA graphs on the GPU), proven on the CPU through
// a backend that records as CUDA stream capture does: between begin_recording and end_recording
// the recording thread's kernels are queued into the recording instead of running, and replay
// runs them again with the pointers they were given. A program's third and later executions are
// replays; replays compute bitwise what running kernel by kernel computes; a program whose
// buffers change (a state dict loaded mid-run) records again; an error while recording is
// reported and the next step records afresh; a program with a collective or a transfer is never
// recorded.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include <cstorch/cstorch.h>

#include "ir/device.h"
#include "runtime/run_mode.h"
#include "support/fc_steps.h"
#include "support/lm_steps.h"
#include "support/tape_recording.h"
#include "unit/test_util.h"

namespace {

using namespace cstorch;

using cstorch::testing::tape_counters;

std::atomic<bool> g_fail_while_recording{false};

const ir::DeviceBackend& cpu() {
  return ir::device_backend(Device{});
}

void tape_kernel(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                 void* out) {
  if (cstorch::testing::current_tape() && g_fail_while_recording.exchange(false))
    fail("tape: a failure while recording (injected by the test)");
  cstorch::testing::tape_or_run(cpu().kernel(n.op), ctx, n, in, out);
}

std::atomic<int64_t> g_uploads{0};  // copy_from_host calls

// Host memory and the CPU's kernels and answers, but a device of its own that records.
class TapeBackend final : public ir::DeviceBackend {
 public:
  explicit TapeBackend(bool records) : records_(records) {}
  std::string name() const override { return "GPU"; }
  void* allocate(size_t n) const override { return cpu().allocate(n); }
  void deallocate(void* p, size_t n) const override { cpu().deallocate(p, n); }
  bool host_accessible() const override { return false; }
  void copy_to_host(void* d, const void* s, size_t n) const override { std::memcpy(d, s, n); }
  void copy_from_host(void* d, const void* s, size_t n) const override {
    g_uploads.fetch_add(1, std::memory_order_relaxed);
    std::memcpy(d, s, n);
  }
  void copy_on_device(void* d, const void* s, size_t n) const override { std::memmove(d, s, n); }
  void fill_zero(void* d, size_t n) const override { std::memset(d, 0, n); }
  ir::Kernel kernel(ir::OpCode op) const override {
    return cpu().kernel(op) ? &tape_kernel : nullptr;
  }
  size_t workspace_bytes(const ir::Node& n) const override { return cpu().workspace_bytes(n); }
  bool supports(ir::OpCode op, DType t) const override { return cpu().supports(op, t); }
  std::string cannot_run(const ir::Node& n) const override { return cpu().cannot_run(n); }
  bool fuses(ir::OpCode op) const override { return cpu().fuses(op); }
  bool gemm_epilogue_applies(int64_t m, int64_t n, int64_t k, bool tb) const override {
    return cpu().gemm_epilogue_applies(m, n, k, tb);
  }
  bool gemm_addend_exact(int64_t k) const override { return cpu().gemm_addend_exact(k); }
  bool records() const override { return records_; }
  void begin_recording() const override { cstorch::testing::tape_begin(); }
  std::unique_ptr<ir::Recording> end_recording(bool keep) const override {
    return cstorch::testing::tape_end(keep);
  }
  void replay(const ir::Recording& r) const override { cstorch::testing::tape_replay(r); }

 private:
  bool records_;
};

struct TapeScope {
  explicit TapeScope(bool records) {
    tape_counters().reset();
    g_fail_while_recording = false;
    g_uploads = 0;
    ir::register_device_backend(DeviceType::GPU, std::make_shared<TapeBackend>(records));
  }
  ~TapeScope() { ir::register_device_backend(DeviceType::GPU, nullptr); }
};

const Device kDev{DeviceType::GPU, 0};

// The values of tensors, taken while their device is registered: a result tensor may still
// reference the device's buffers, which must be released before the test's device goes away.
std::vector<std::vector<float>> values_of(std::vector<Tensor>& ts) {
  std::vector<std::vector<float>> v;
  for (auto& t : ts) v.push_back(t.to_vector<float>());
  ts.clear();
  return v;
}

bool bitwise_equal(const std::vector<std::vector<float>>& a,
                   const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

// FC-MNIST's traced training (9 steps) and evaluation (2 steps): recorded from the third
// execution of each program on, replayed after, and bitwise what kernel-by-kernel runs give.
TEST(Recording, ReplaysAreBitwiseTheKernelByKernelRun) {
  cstorch::testing::FcRun direct, taped;
  std::vector<std::vector<float>> direct_params, taped_params;
  int64_t direct_uploads = 0, taped_uploads = 0;
  {
    TapeScope scope(false);
    direct = cstorch::testing::fc_mnist_run(kDev, "adamw", 9, 32, "[64, 32]", 2);
    direct_params = values_of(direct.params);
    EXPECT_EQ(tape_counters().recordings.load(), 0);
    EXPECT_EQ(tape_counters().replays.load(), 0);
    direct_uploads = g_uploads.load();
  }
  {
    TapeScope scope(true);
    taped = cstorch::testing::fc_mnist_run(kDev, "adamw", 9, 32, "[64, 32]", 2);
    taped_params = values_of(taped.params);
    // Training: executions 1-2 kernel by kernel, 3 recorded and replayed, 4-9 replayed. The
    // two evaluation steps run kernel by kernel (a program records from its third execution).
    EXPECT_EQ(tape_counters().recordings.load(), 1);
    EXPECT_EQ(tape_counters().replays.load(), 7);
    EXPECT_EQ(tape_counters().replayed.load(), 7 * tape_counters().recorded.load());
    EXPECT_GT(tape_counters().recorded.load(), 10);
    taped_uploads = g_uploads.load();
  }
  // A recording program gathers its prologue's uploads of host values (AdamW's step sizes and
  // bias corrections, 3 for each of the 6 parameters) into one transfer a step: 17 fewer in
  // each of the 9 training steps (224 transfers against 71 when written).
  EXPECT_GE(direct_uploads - taped_uploads, 9 * 17);
  EXPECT_EQ(taped.train_losses, direct.train_losses);
  EXPECT_EQ(taped.eval_losses, direct.eval_losses);
  EXPECT_TRUE(bitwise_equal(taped_params, direct_params));
}

struct LmTrace {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
};

// GPT-2 tiny (dropout on, so the generator state advances inside the recording) for 10 steps;
// after step 5 the model's state dict is loaded from a copy taken after step 1, which gives the
// parameters new buffers: the program must notice and record again. With `fail_at` > 0, a
// failure is injected while the program records at that step.
LmTrace gpt2_run(int fail_at = 0) {
  runtime::StepDeviceScope scope(kDev);
  manual_seed(11);
  const std::string yaml = cstorch::testing::lm_yaml("gpt2", 0.1);
  auto model = cstorch::testing::zoo_model("gpt2", yaml);
  model->to(kDev);
  optim::SGD opt(model->parameters(), 0.05, 0.9);
  auto step = trace([&](const Batch& b) {
    Tensor l = model->loss(b);
    l.backward();
    opt.step();
    opt.zero_grad();
    return l;
  });
  LmTrace r;
  nn::StateDict saved;
  for (int s = 0; s < 10; ++s) {
    if (s == 5) model->load_state_dict(saved);
    if (s + 1 == fail_at) g_fail_while_recording = true;
    const Batch b = cstorch::testing::text_batch("gpt2", s % 3);
    if (s + 1 == fail_at) {
      EXPECT_ERROR(step(b).item<float>(), "injected by the test");
      continue;
    }
    r.losses.push_back(step(b).item<float>());
    if (s == 1)
      for (auto& [k, v] : model->state_dict()) saved.insert(k, v.to(Device{}).to(kDev));
  }
  for (auto& p : model->parameters()) r.params.push_back(p.to_vector<float>());
  return r;
}

TEST(Recording, NewBuffersAreRecordedAgain) {
  LmTrace direct, taped;
  {
    TapeScope scope(false);
    direct = gpt2_run();
  }
  {
    TapeScope scope(true);
    taped = gpt2_run();
    // Recorded at step 3; the loaded state dict's buffers differ from the recorded ones, so
    // step 6 records again; the rest replay.
    EXPECT_EQ(tape_counters().recordings.load(), 2);
    EXPECT_EQ(tape_counters().replays.load(), 8);
  }
  EXPECT_EQ(taped.losses, direct.losses);
  EXPECT_TRUE(bitwise_equal(taped.params, direct.params));
}

TEST(Recording, AnErrorWhileRecordingIsReportedAndTheNextStepRecordsAfresh) {
  TapeScope scope(true);
  const LmTrace r = gpt2_run(3);  // step 3 (the first recording) fails
  EXPECT_EQ(tape_counters().aborted.load(), 1);
  EXPECT_EQ(tape_counters().recordings.load(), 2);  // steps 4 and 6
  ASSERT_EQ(r.losses.size(), 9u);
  for (float l : r.losses) EXPECT_TRUE(std::isfinite(l));
}

// Work off the step's device runs outside the recording: a CPU tensor the step reads, and host
// arithmetic on it, run before each replay (they see the tensor's new value each time); a
// device value taken through the host and back in the middle of the step makes a program that
// cannot be split so, and it is never recorded.
TEST(Recording, HostWorkRunsAroundTheRecordingARoundTripPreventsIt) {
  TapeScope scope(true);
  runtime::StepDeviceScope step_scope(kDev);
  Tensor w = cstorch::testing::rt({4, 4}).to(kDev);
  Tensor bias = cstorch::testing::rt({4});  // stays on the CPU
  auto host = trace([&](const Batch& b) {
    return (matmul(b.at("x"), w) + bias.to(kDev) + (bias * 2.0).to(kDev)).sum();
  });
  for (int s = 0; s < 5; ++s) {
    const Tensor x = cstorch::testing::rt({3, 4}, s);
    const Tensor want = (matmul(x, w.to(Device{})) + bias + bias * 2.0).sum();
    EXPECT_EQ(host(Batch{{"x", x}}).item<float>(), want.item<float>()) << "step " << s;
    bias.add_(full({4}, 1.0));  // read again before the next replay
  }
  EXPECT_EQ(tape_counters().recordings.load(), 1);
  EXPECT_EQ(tape_counters().replays.load(), 3);
  auto round_trip = trace(
      [&](const Batch& b) { return (matmul(b.at("x"), w).to(Device{}) * 2.0).to(kDev).sum(); });
  for (int s = 0; s < 5; ++s)
    round_trip(Batch{{"x", cstorch::testing::rt({3, 4}, s)}}).item<float>();
  EXPECT_EQ(tape_counters().recordings.load(), 1)
      << "a program with a host round trip was recorded";
  EXPECT_EQ(tape_counters().replays.load(), 3);
}

}  // namespace
