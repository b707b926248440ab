// A recording that behaves as CUDA stream capture does, for backends in tests that run the CPU's
// kernels (the CUDA stand-in, the recording tests): between begin and end, the recording
// thread's kernel calls are kept (kernel, node, context and the pointers they were given)
// instead of run, and replay runs them again in order. Counters say what happened.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "ir/device.h"

namespace cstorch::testing {

struct TapeCounters {
  std::atomic<int64_t> direct{0}, recorded{0}, replayed{0};  // kernel calls
  std::atomic<int> recordings{0}, replays{0}, aborted{0};
  void reset() {
    direct = recorded = replayed = 0;
    recordings = replays = aborted = 0;
  }
};
inline TapeCounters& tape_counters() {
  static TapeCounters c;
  return c;
}

struct TapeRecording final : ir::Recording {
  std::vector<std::function<void()>> calls;
};
inline TapeRecording*& current_tape() {
  thread_local TapeRecording* t = nullptr;
  return t;
}

// Runs kernel k now, or keeps the call on the calling thread's tape while it records.
inline void tape_or_run(ir::Kernel k, const ir::KernelContext& ctx, const ir::Node& n,
                        const void* const* in, void* out) {
  TapeRecording* tape = current_tape();
  if (!tape) {
    tape_counters().direct++;
    k(ctx, n, in, out);
    return;
  }
  tape_counters().recorded++;
  std::vector<const void*> ins(in, in + n.inputs.size());
  tape->calls.push_back([k, ctx, &n, ins = std::move(ins), out] {
    tape_counters().replayed++;
    k(ctx, n, ins.data(), out);
  });
}

inline void tape_begin() {
  EXPECT_EQ(current_tape(), nullptr) << "recordings do not nest";
  current_tape() = new TapeRecording;
}
inline std::unique_ptr<ir::Recording> tape_end(bool keep) {
  std::unique_ptr<TapeRecording> r(current_tape());
  current_tape() = nullptr;
  if (!keep) {
    tape_counters().aborted++;
    return nullptr;
  }
  tape_counters().recordings++;
  return r;
}
inline void tape_replay(const ir::Recording& r) {
  tape_counters().replays++;
  for (const auto& c : static_cast<const TapeRecording&>(r).calls) c();
}

}  // namespace cstorch::testing
