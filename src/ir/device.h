// The device layer: what a backend gives the core. A backend is one folder (src/backend/<name>/)
// that implements DeviceBackend: its allocator, its transfer functions, its kernel table and the
// answers to the compiler's capability questions. The core, the compiler and the runtime reach
// a backend only through this interface (ir::device_backend(device)); none of them includes a
// backend header. docs/adding-a-backend.md walks through a new one.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir/node.h"

namespace cstorch::ir {

class DeviceBackend;

// A backend's record of the work one program execution queued (a CUDA graph on the GPU), made
// by DeviceBackend::end_recording and replayed by DeviceBackend::replay.
class Recording {
 public:
  virtual ~Recording() = default;
};

// Times a sequence of kernel calls on a device's own clock, for the profile (CSTORCH_PROFILE),
// without waiting between them: start() queues the first timestamp on the device's stream,
// mark() one after each kernel call; seconds() waits for the last and returns, in order, the
// seconds between consecutive timestamps (one per mark()), then starts over. An interval is the
// device's time from the end of one call's work to the end of the next's: the kernel's run,
// plus any wait for its launch where the device ran ahead of the host.
class KernelClock {
 public:
  virtual ~KernelClock() = default;
  virtual void start() = 0;
  virtual void mark() = 0;
  virtual std::vector<double> seconds() = 0;
};

// What a kernel gets besides its node and operands. Kernels never allocate: scratch memory is
// `workspace` (workspace_bytes(node) bytes, planned by the compiler like any other buffer, or
// allocated per call by an eager op).
struct KernelContext {
  const DeviceBackend* backend = nullptr;
  void* stream = nullptr;  // the backend's queue (null on the CPU)
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Collectives: the host-side handle of this node's request (all_reduce_start writes it, the
  // matching all_reduce_unpack reads it), owned by the running program.
  uint64_t* request = nullptr;
  // Collectives on a device whose memory the host cannot read: a host buffer of the bucket's
  // size through which the bucket is reduced (null where the bucket itself is host memory).
  void* host_staging = nullptr;
};

// A kernel: reads the input buffers, writes the output buffer (all on the backend's device).
// Shapes, dtypes and attributes come from the node. Errors are cstorch::Error.
using Kernel = void (*)(const KernelContext& ctx, const Node& n, const void* const* in, void* out);
// Runs `count` Fused nodes of one output shape as one pass over their elements (see
// DeviceBackend::fused_group_kernel): in[k] and out[k] are node k's buffers.
using FusedGroupKernel = void (*)(const KernelContext& ctx, const Node* const* nodes,
                                  const void* const* const* in, void* const* out, int count);

// Per-thread settings of a backend that runs kernels on host threads (the CPU): applied on the
// caller's thread and on the executor's.
struct HostThreadSettings {
  int num_threads = 0;      // > 0: the team size of parallel kernels
  int flush_denormal = -1;  // 0 or 1: the DAZ/FTZ modes; -1 leaves them
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // "CPU", "GPU", or a plugin's name ("check").
  virtual std::string name() const = 0;

  // Memory. allocate returns 64-byte aligned memory of the device or throws cstorch::Error
  // naming the device and the size; deallocate gets the same size back.
  virtual void* allocate(size_t nbytes) const = 0;
  virtual void deallocate(void* p, size_t nbytes) const = 0;
  // Whether host code may read and write the device's memory directly (the CPU). Otherwise
  // every host access goes through the copy functions below.
  virtual bool host_accessible() const = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t nbytes) const = 0;
  virtual void copy_from_host(void* dst, const void* src, size_t nbytes) const = 0;
  virtual void copy_on_device(void* dst, const void* src, size_t nbytes) const = 0;
  virtual void fill_zero(void* dst, size_t nbytes) const = 0;
  // Waits for the work queued on the device's stream.
  virtual void synchronize() const {}
  virtual void* stream() const { return nullptr; }
  // A clock that times kernels on the device (see KernelClock), for a device that runs them
  // asynchronously; null (the default) where the profile times each call on the host, waiting
  // for the device before and after it.
  virtual std::unique_ptr<KernelClock> kernel_clock() const { return nullptr; }

  // Execution. `kernel` is null where the backend has no kernel for the op.
  virtual Kernel kernel(OpCode op) const = 0;
  // Scratch bytes the node's kernel needs (0: none).
  virtual size_t workspace_bytes(const Node& n) const { return 0; }
  // A kernel that runs consecutive Fused nodes of one output shape block by block, each
  // node's program in turn on a block, so that every element sees the nodes in program order
  // (results bitwise those of the nodes one by one) while what one node writes and the next
  // reads stays in cache: an optimizer's updates of one parameter read and write each state
  // once. Called only when every buffer a node writes is read by the others in place (element
  // for element) or not at all. Null: the nodes run one by one.
  virtual FusedGroupKernel fused_group_kernel() const { return nullptr; }
  // Host-thread settings (threads, denormals); false when they mean nothing here.
  virtual bool apply_thread_settings(const HostThreadSettings&) const { return false; }
  // The team size of the calling thread's parallel kernels (1 where kernels do not run on host
  // threads).
  virtual int host_threads() const { return 1; }
  // Ends the host threads that the calling thread keeps idle for its own parallel kernels, so
  // that they do not count against another thread's team. Called by a client thread about to
  // block on the executor, and by the executor after a few milliseconds idle (runtime/
  // executor.cpp). The next parallel kernel on that thread starts them again. No-op where
  // kernels do not run on host threads.
  virtual void release_idle_host_threads() const {}

  // Recording. A backend whose kernels only queue work on its stream may record the kernel
  // calls of one program execution and replay them as one unit, which removes the per-kernel
  // launch cost. Between begin_recording and end_recording, the kernels the calling thread runs
  // on this backend queue their work into the recording instead of running it (other threads'
  // work is unaffected); end_recording(true) returns the recording (a failure throws),
  // end_recording(false) discards it (after an error). replay queues the recorded work again on
  // the backend's stream, with the pointers and values the kernels were given when recorded:
  // the caller (compiler/program.cpp) replays only while those are unchanged.
  virtual bool records() const { return false; }
  virtual void begin_recording() const {}
  virtual std::unique_ptr<Recording> end_recording(bool keep) const { return nullptr; }
  virtual void replay(const Recording& r) const {}

  // Capabilities the compiler asks about.
  virtual bool supports(OpCode op, DType t) const { return kernel(op) != nullptr; }
  // Why this backend's kernel for n.op cannot run this node (its dtypes, ranks or layout), or
  // empty when it can. Asked when a program is compiled and before an eager op runs, so an
  // unsupported node is an error there rather than a wrong result (default: every node).
  virtual std::string cannot_run(const Node& n) const { return {}; }
  // Whether the backend's Fused kernel runs this op as an instruction (default: the op's
  // kFusable trait).
  virtual bool fuses(OpCode op) const { return has_trait(op, kFusable); }
  // Whether the Fused kernel stores its result rounded to bf16 (FusedAttrs::out), as the Cast
  // kernel rounds, so that a cast to bf16 can end a Fused program (default: f32 only).
  virtual bool fused_stores_bf16() const { return false; }
  // Whether the Fused kernel reads bf16 inputs, widened exactly (as the Cast kernel widens), so
  // that a cast of bf16 to f32 can join a Fused program and a bf16 product read only by Fused
  // programs need not be stored as f32 (default: f32 and bool inputs only).
  virtual bool fused_reads_bf16() const { return false; }
  // Whether a GEMM of this shape applies an epilogue (bias, addend, relu, relu_grad) for free,
  // so the compiler's epilogue fusion pays off; and whether its addend epilogue is bitwise the
  // separate addcmul (one accumulation block over K).
  virtual bool gemm_epilogue_applies(int64_t m, int64_t n, int64_t k, bool trans_b) const {
    return false;
  }
  virtual bool gemm_addend_exact(int64_t k) const { return false; }
  virtual int max_rank() const { return kMaxDims; }
};

// The backend of `d` (CSX maps to the CPU). Errors: a GPU on a build without the CUDA backend
// (the message says how to build it); a plugin device nothing registered.
const DeviceBackend& device_backend(Device d);
// Null instead of an error.
const DeviceBackend* find_device_backend(Device d);
// How many devices of type t this process can use: 1 for the CPU and a registered backend, the
// CUDA devices for a GPU (0 without the CUDA backend or a usable device).
int device_count(DeviceType t);
// Registers the backend of a device type that is not built in (DeviceType::Plugin, or GPU for
// an out-of-tree CUDA backend); replaces an earlier registration of that type. Buffers of the
// old backend must be gone by then.
void register_device_backend(DeviceType t, std::shared_ptr<const DeviceBackend> b);
// Whether the registered plugin backend is called `name` (any case).
bool plugin_named(const std::string& name);
// The registered plugin backend's name, or "PLUGIN" when none is registered.
const char* plugin_name();

// The kernel that runs `n` on its device: the transfer kernel for ToDevice, else the backend's.
// Error naming the op and the device when there is none.
Kernel kernel_for(const Node& n);

// `b` itself where its device's memory is host memory, else a host (CPU) copy of it.
std::shared_ptr<Buffer> host_view(const std::shared_ptr<Buffer>& b);

// Copies between buffers of any two devices (through the host where neither side can reach the
// other's memory).
void copy_between(Device dst_dev, void* dst, Device src_dev, const void* src, size_t nbytes);

}  // namespace cstorch::ir
