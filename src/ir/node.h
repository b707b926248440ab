// The graph node: the one representation behind every tensor, eager or traced.
// An eager node carries a buffer (its value); a traced node carries only op, attributes and
// inputs until a compiled program computes it. Inputs are kept while a node is traced or
// while it requires grad (so backward() can walk them); other eager nodes drop them.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "attrs.h"
#include "cstorch/core/dtype.h"
#include "cstorch/core/shape.h"

namespace cstorch {
struct TensorImpl;
namespace runtime {
struct Event;  // when a buffer's contents are ready (runtime/sync.h)
}
}  // namespace cstorch

namespace cstorch::ir {

enum class OpCode : uint16_t {
#define OP(Name, str, Attr, traits) Name,
#include "ops.def"
#undef OP
  NumOps
};
inline constexpr int kNumOps = static_cast<int>(OpCode::NumOps);

enum OpTraits : uint32_t {
  kElementwise = 1u << 0,
  kReduction = 1u << 1,
  kAlias = 1u << 2,
  kNoGrad = 1u << 3,
  kRandom = 1u << 4,
  kLeaf = 1u << 5,
  kCollective = 1u << 6,
  kBarrier = 1u << 7,
  kFusable = 1u << 8,
  // The kernel may write its result over input 0 (out == in[0]): it reads each element of input
  // 0 only to produce that same element, or (log_softmax) reads a whole row of input 0 before it
  // writes that row, and no other input may share that buffer. The memory planner then gives
  // the result input 0's bytes when this node is input 0's last reader.
  kInPlaceInput0 = 1u << 9,
};

// The most dims a tensor may have: kernels walk shapes with fixed-size index arrays.
inline constexpr int kMaxDims = 8;

// Memory on a device, 64-byte aligned, from that device's allocator (ir/device.h). `data` is a
// host pointer only where the device's memory is host-accessible (the CPU); elsewhere it is the
// device's own address, which only its kernels and transfer functions may touch. `owned`
// buffers go back to the allocator with the Buffer.
struct Buffer {
  void* data = nullptr;
  size_t nbytes = 0;
  bool owned = true;
  Device device;
  // The runtime's bookkeeping of queued work that writes this memory (null: ready now).
  std::shared_ptr<runtime::Event> event;
  // Which contents the memory holds: a number no other buffer and no other write of this one
  // has had, taken at allocation and again by mark_written() after every write through the
  // library (eager in-place ops, host writes, programs' state writes). A program that keeps a
  // copy derived from a state (a weight's bf16 copy) keeps it only while this is unchanged.
  // Writes through a pointer kept from outside the library are not seen.
  uint64_t version = 0;
  void mark_written();
  // Fails (cstorch::Error naming the device and size) when the device is out of memory, not
  // built, or not registered.
  static std::shared_ptr<Buffer> alloc(size_t nbytes, Device device = {});
  static std::shared_ptr<Buffer> wrap(void* data, size_t nbytes, Device device = {});
  ~Buffer();
};

struct Node;
using NodePtr = std::shared_ptr<Node>;

struct Node : std::enable_shared_from_this<Node> {
  OpCode op = OpCode::Constant;
  Attrs attrs;
  std::vector<NodePtr> inputs;
  Shape shape;
  DType dtype = DType::f32;
  Device device;                   // where the value lives and the kernel runs
  std::shared_ptr<Buffer> buffer;  // the value, when it exists on this host
  bool requires_grad = false;
  std::weak_ptr<TensorImpl> leaf;  // set for leaf tensors that accumulate .grad
  uint64_t trace_id = 0;           // nonzero while recorded in that trace
  uint32_t id = 0;                 // unique, for dumps and error messages

  int64_t numel() const { return cstorch::numel(shape); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * itemsize(dtype); }
  template <class A>
  const A& attr() const {
    return std::get<A>(attrs);
  }
  const char* name() const;
  static NodePtr make(OpCode op, Attrs attrs, std::vector<NodePtr> inputs);
};

// Static facts about an op, from ops.def and the op family files.
using InferFn = void (*)(Node&);  // validates inputs, sets shape and dtype; throws cstorch::Error
struct OpInfo {
  const char* name;
  uint32_t traits;
  InferFn infer;
};
const OpInfo& op_info(OpCode op);
inline bool has_trait(OpCode op, uint32_t t) {
  return (op_info(op).traits & t) != 0;
}

}  // namespace cstorch::ir
