// Collective ops (multi-replica data parallel): AllReduceStart packs its inputs into one f32
// bucket and starts the bucket's sum over the replica group; AllReduceUnpack waits for it and
// takes one tensor back out. Splitting start and wait into two nodes is what lets the compiler
// place the wait late (just before the first use of the result) and overlap the communication
// with the kernels in between. Bucket layout: [values..., weight]; the request's handle is
// host-side (ir::KernelContext::request), owned by the program or, eagerly, by dispatch.
#include <atomic>

#include "core/internal.h"
#include "cstorch/distributed.h"
#include "ops/vjp.h"

namespace cstorch {
namespace ops {

void infer_AllReduceStart(ir::Node& n) {
  CS_CHECK(!n.inputs.empty(), "all_reduce_start: needs at least one input");
  int64_t total = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    CS_CHECK(n.inputs[i]->dtype == DType::f32, "all_reduce: input {} is {}; only f32 is supported",
             i, dtype_name(n.inputs[i]->dtype));
    total += n.inputs[i]->numel();
  }
  CS_CHECK(n.attr<ir::AllReduceAttrs>().weight > 0, "all_reduce: weight must be positive, got {}",
           n.attr<ir::AllReduceAttrs>().weight);
  n.shape = {total + 1};
  n.dtype = DType::f32;
}

void infer_AllReduceUnpack(ir::Node& n) {
  CS_CHECK(n.inputs.size() == 1 && n.inputs[0]->op == ir::OpCode::AllReduceStart,
           "all_reduce_unpack: its input must be an all_reduce_start bucket");
  const auto& a = n.attr<ir::UnpackAttrs>();
  const int64_t values = n.inputs[0]->numel() - 1;
  CS_CHECK(a.offset >= 0 && a.offset + cstorch::numel(a.shape) <= values,
           "all_reduce_unpack: {} values at offset {} exceed the bucket of {}",
           cstorch::numel(a.shape), a.offset, values);
  n.shape = a.shape;
  n.dtype = DType::f32;
}

CS_NO_VJP(AllReduceStart)
CS_NO_VJP(AllReduceUnpack)

uint64_t next_collective_serial() {
  static std::atomic<uint64_t> serial{1};
  return serial.fetch_add(1);
}

}  // namespace ops

namespace distributed {

std::vector<Tensor> all_reduce(const std::vector<Tensor>& xs, ReduceOp op, double weight) {
  CS_CHECK(!xs.empty(), "all_reduce: no tensors given");
  CS_CHECK(weight > 0, "all_reduce: weight must be positive, got {}", weight);
  for (size_t i = 0; i < xs.size(); ++i) {
    CS_CHECK(xs[i].defined(), "all_reduce: tensor {} is undefined", i);
    CS_CHECK(xs[i].dtype() == DType::f32, "all_reduce: tensor {} is {}; only f32 is supported", i,
             dtype_name(xs[i].dtype()));
  }
  if (num_replicas() == 1) return xs;
  NoGradGuard ng;
  const bool mean = op == ReduceOp::Mean;
  Tensor bucket = cstorch::detail::dispatch(
      ir::OpCode::AllReduceStart,
      ir::AllReduceAttrs{ops::next_collective_serial(), mean ? weight : 1.0}, xs);
  std::vector<Tensor> out;
  int64_t off = 0;
  for (auto& x : xs) {
    out.push_back(cstorch::detail::dispatch(ir::OpCode::AllReduceUnpack,
                                            ir::UnpackAttrs{off, x.shape(), mean}, {bucket}));
    off += x.numel();
  }
  return out;
}

Tensor all_reduce(const Tensor& x, ReduceOp op, double weight) {
  return all_reduce(std::vector<Tensor>{x}, op, weight)[0];
}

}  // namespace distributed
}  // namespace cstorch
