// A compiled step: a flat list of kernel calls over values placed in one arena (planned once),
// the batch inputs, persistent state buffers, constants and per-execution output buffers.
// Running a program performs no heap allocation.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "compiler/graph.h"
#include "ir/device.h"

namespace cstorch::compiler {

// Packed: a small host value's upload in a recorded program's prologue, placed at a byte
// offset of the program's upload block (see Program::plan).
enum class Loc : uint8_t { Arena, Batch, State, Constant, Output, Packed };

struct ValuePlace {
  Loc loc = Loc::Arena;
  int64_t index = 0;  // arena byte offset, or batch / state / output index
  const void* constant = nullptr;
  uint32_t arena = 0;  // which device's arena (Loc::Arena)
};

struct ProgramStats {
  size_t nodes_traced = 0;    // kernel nodes before passes
  size_t nodes_compiled = 0;  // kernel calls per execution
  size_t arena_bytes = 0;     // planned intermediate memory
  size_t naive_bytes = 0;     // sum of all intermediate sizes (what no reuse would need)
  size_t state_bytes = 0;
  size_t inplace_state_writes = 0;
  size_t copied_state_writes = 0;
  size_t inplace_results = 0;  // results written over their input 0 (ir::kInPlaceInput0)
  double flops = 0;            // per execution (matmul/linear 2*M*N*K, others 1 per element)
  size_t fused_groups = 0;     // groups of Fused nodes run as one pass (Program::plan_groups)
  size_t fused_grouped = 0;    // the Fused nodes in them
};

// One buffer that a member of a one-pass group of Fused nodes reads or writes.
struct GroupAccess {
  const void* begin;
  size_t bytes;
  bool write;  // the member's output
  bool f32;
};
// Whether the members may run block by block (Program::plan_groups): every written range is
// disjoint from every other access, or read as exactly the same bytes in f32 (element for
// element, as the Fused kernel reads a same-shape input in place).
bool interleave_safe(const GroupAccess* a, size_t n);

// Every node runs on its own device (Node::device) with that device's kernel; values are placed
// in one arena per device. `device` is the step's device: batch inputs are read there (a batch
// that lives elsewhere is copied into a staging buffer of the program first).
class Program {
 public:
  // Builds from an optimised graph: plans memory and resolves kernels.
  Program(Graph g, Device device, ProgramStats traced_stats);
  // With CSTORCH_PROFILE set, prints the time spent per op kind over all executions.
  ~Program();

  // Executes once. `batch[i]` is batch input i (on any device), `outputs[i]` a buffer of output
  // i's size on that output's device. State buffers are read from (and written into) the
  // slots' tensors. Errors are cstorch::Error naming the op and node. No heap allocation on
  // success.
  void run(const ir::Buffer* const* batch, void* const* outputs);
  // The same with every batch input in host (CPU) memory at `batch[i]`.
  void run(const void* const* batch, void* const* outputs);
  Device device() const { return device_; }

  const Graph& graph() const { return g_; }
  const ProgramStats& stats() const { return stats_; }
  // Whether executions are recorded and replayed as one unit (DeviceBackend::records), and how
  // many recordings were made.
  bool records() const { return recorder_ != nullptr; }
  int recordings() const { return recordings_; }
  size_t num_outputs() const { return g_.outputs.size(); }
  std::string summary() const;  // ops, FLOPs, memory plan (for compile-only reports)

 private:
  struct Step {
    ir::Kernel kernel;
    const ir::Node* node;
    uint32_t first_input;  // into input_ids_
    uint32_t num_inputs;
    uint32_t out;  // value id
    ir::KernelContext ctx;
    int64_t workspace_offset = -1;  // in the node's device arena
  };
  void plan();
  void run_steps(size_t begin, size_t end);  // kernel calls [begin, end), in order
  void record_and_replay();
  bool same_bindings() const;  // the recorded kernels' pointers are those recorded
  // Executions run kernel by kernel before the first recording (lazy setup in the kernels, e.g.
  // cuBLASLt's plans, happens outside it), and the most recordings a program makes: a program
  // whose buffers change at every call (a parameter replaced each step) then runs directly.
  static constexpr int64_t kDirectRuns = 2;
  static constexpr int kMaxRecordings = 4;
  // The largest upload of a host value that goes through the upload block (plan).
  static constexpr size_t kPackedUploadBytes = 4096;
  void plan_groups();

  Graph g_;
  Device device_;
  ProgramStats stats_;
  std::vector<Step> steps_;
  // Runs of consecutive Fused steps that the backend runs as one pass (plan_groups).
  struct Group {
    uint32_t first, count;
    ir::FusedGroupKernel kernel;
  };
  std::vector<Group> groups_;
  std::vector<int32_t> group_at_;  // per step: the group that starts there, or -1
  // Whether group g may run as one pass with this execution's buffers (see plan_groups).
  bool group_safe(const Group& g) const;
  std::vector<uint32_t> input_ids_;
  std::vector<ValuePlace> places_;       // per value id
  std::vector<void*> ptrs_;              // per value id, filled per execution
  std::vector<const void*> in_scratch_;  // kernel input pointer array
  std::vector<Device> arena_devices_;
  std::vector<std::shared_ptr<ir::Buffer>> arenas_;        // one per device used
  std::vector<std::shared_ptr<ir::Buffer>> staging_;       // per batch input (null: read in place)
  std::vector<std::shared_ptr<ir::Buffer>> host_staging_;  // collectives' host buffers
  std::vector<std::shared_ptr<ir::Buffer>> uploaded_;      // constants copied to their users
  // The upload block: the prologue's small uploads of host values are gathered in pack_host_ by
  // their steps and copied to pack_device_ by one transfer after the prologue (upload_pack).
  std::shared_ptr<ir::Buffer> pack_host_, pack_device_;
  size_t pack_bytes_ = 0;
  void upload_pack();
  std::vector<uint64_t> requests_;      // collectives' request handles
  std::vector<ir::Buffer> host_batch_;  // run(const void*...)'s wrappers
  std::vector<const ir::Buffer*> host_batch_ptrs_;
  using Pairs = std::vector<std::pair<uint32_t, uint32_t>>;
  Pairs batch_ids_, state_ids_, output_ids_;  // (value id, batch / state / output index)
  Pairs alias_ids_;                           // (alias value id, its input's value id)
  Pairs final_outputs_, state_copies_;        // copies after the last kernel
  std::vector<void*> state_ptrs_;
  // Slots the compiler derived from others (StateSlot::cast_of): recomputed by `kernel` on
  // slot `of`'s buffer before an execution where that buffer's version is not `seen`, the one
  // it had after this program's last execution wrote it.
  struct Derived {
    uint32_t slot, of;
    ir::Kernel kernel;
    ir::KernelContext ctx;
    uint64_t seen = 0;
  };
  std::vector<Derived> derived_;
  void refresh_derived();
  void note_state_written();
  void mark_states_written();  // every state slot this program writes (Buffer::mark_written)
  bool profile_ = false;
  bool profile_nodes_ = false;        // CSTORCH_PROFILE=nodes
  std::vector<double> step_seconds_;  // per kernel call, summed over executions
  // The profile on a device with a KernelClock: the device's clock times its kernels, and
  // clocked_ lists the step of each mark() of the current execution.
  std::unique_ptr<ir::KernelClock> clock_;
  std::vector<size_t> clocked_;
  template <class F>
  void profiled(size_t si, const ir::KernelContext& ctx, F&& call);
  int64_t runs_ = 0;
  // Recording: the backend that records this program (null: run kernel by kernel), the current
  // recording and the pointers it was made with (replayed only while ptrs_ equals them).
  const ir::DeviceBackend* recorder_ = nullptr;
  // Steps [0, prologue_) run before each replay, [prologue_, epilogue_) are recorded,
  // [epilogue_, end) run after it; phase_ is each node's (0 leaf, 1 prologue, 2 body, 3
  // epilogue).
  size_t prologue_ = 0, epilogue_ = 0;
  std::vector<uint8_t> phase_;
  std::unique_ptr<ir::Recording> recording_;
  std::vector<uint32_t> recorded_values_;  // value ids the recorded kernels read or write
  std::vector<void*> recorded_ptrs_;       // their pointers when recorded
  std::vector<bool> stage_always_;         // per batch input: read by recorded kernels
  int recordings_ = 0;
};

}  // namespace cstorch::compiler
