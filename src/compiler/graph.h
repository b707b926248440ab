// The graph a traced step compiles from: nodes in topological order plus the roots that must
// be computed (step outputs and state writes). Passes rewrite it in place.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/internal.h"

namespace cstorch::compiler {

// One persistent tensor the step reads and/or writes.
struct StateSlot {
  std::shared_ptr<TensorImpl> impl;  // holder of the persistent buffer
  ir::NodePtr input;                 // Input(State) node reading it (null: write-only)
  ir::NodePtr write;                 // its new value (null: read-only)
  Shape shape;
  DType dtype = DType::f32;
  Device device;  // where the persistent buffer lives
  // A slot the compiler added (passes/cache_state_casts.cpp) to keep a low-precision copy of
  // slot `cast_of`: the step writes cast(new value of that slot), and the program computes
  // `refresh` (a Cast of that slot's input) into it before an execution whenever that slot's
  // buffer was written by anything else since (ir::Buffer::version). -1: a slot of the step.
  int cast_of = -1;
  ir::NodePtr refresh;
};

struct Graph {
  std::vector<ir::NodePtr> nodes;  // topological order
  std::vector<ir::NodePtr> batch_inputs;
  std::vector<StateSlot> state;
  std::vector<ir::NodePtr> outputs;
  // Parameter gradients as backward() left them, in production order (may repeat a node or
  // name nodes passes removed). Passes keep them current; the gradient all-reduce uses them.
  std::vector<ir::NodePtr> gradients;
  // Extra roots: nodes kept and run although nothing uses their value (with several replicas:
  // every gradient, which each replica must contribute to the all-reduce even when it does not
  // use it itself, and the all-reduce waits of such gradients).
  std::vector<ir::NodePtr> keep;

  // Rewrites every use (node inputs, outputs, state writes) through `repl` (old -> new).
  void replace_uses(const std::unordered_map<ir::Node*, ir::NodePtr>& repl);
  // Drops nodes no root depends on (inputs are kept: their slots stay in the signature).
  size_t prune();
  size_t count_ops() const;  // nodes that run a kernel (not leaves)
  std::string dump() const;  // text form, one node per line
  std::string dot() const;   // Graphviz
};

// Checks structure: inputs defined before use, shapes and dtypes re-inferred unchanged,
// roots present. Throws cstorch::Error naming the node on failure.
void verify(const Graph& g, const char* after_pass);

// A compiler pass: small, named, independently tested. Returns true if it changed the graph.
class Pass {
 public:
  virtual ~Pass() = default;
  virtual const char* name() const = 0;
  virtual bool run(Graph& g) = 0;
};

std::unique_ptr<Pass> make_dce_pass();
std::unique_ptr<Pass> make_cse_pass();
std::unique_ptr<Pass> make_constant_fold_pass(size_t max_bytes = 1 << 20);
std::unique_ptr<Pass> make_simplify_pass();
// Data parallel: averages every parameter gradient that the step uses (not those it only
// stores, as in a gradient-accumulation micro-step) over the replica group. Gradients are
// packed into buckets of about `bucket_bytes` in the order backward produces them; a bucket's
// all_reduce_start is placed right after its last gradient is computed and each
// all_reduce_unpack right before the first use of that gradient, so communication overlaps the
// rest of the backward pass. `weight` is this replica's sample count (mean weighted by it).
std::unique_ptr<Pass> make_gradient_allreduce_pass(double weight, size_t bucket_bytes);
// Groups chains of elementwise ops into Fused nodes (passes/fuse_elementwise.cpp).
std::unique_ptr<Pass> make_fuse_elementwise_pass();
// Attention over the three thirds of a packed QKV projection reads them in place, and its
// gradient is written as the projection's gradient, instead of slicing and concatenating
// (passes/pack_attention_qkv.cpp).
std::unique_ptr<Pass> make_pack_attention_qkv_pass();
// Folds relu(linear) and addcmul(matmul, C, s) into Gemm nodes (passes/fuse_gemm_epilogue.cpp).
std::unique_ptr<Pass> make_fuse_gemm_epilogue_pass();
// After elementwise fusion: a bf16 product stored as f32 (MatmulAttrs::f32_out) and read only by
// Fused programs whose kernel widens bf16 stores bf16 again (passes/fused_bf16_operands.cpp).
std::unique_ptr<Pass> make_fused_bf16_operands_pass();
// Keeps the 16-bit copy that a step casts from a state it also writes (autocast's bf16 weights
// from the f32 master weights) as a state of its own, written right after the state's update
// instead of cast again at the next step's start (passes/cache_state_casts.cpp).
std::unique_ptr<Pass> make_cache_state_casts_pass();
// Moves single-element elementwise nodes up to just after their inputs, so that the large
// nodes around them become neighbours (passes/hoist_scalars.cpp).
std::unique_ptr<Pass> make_hoist_scalars_pass();

// Runs the standard pipeline: verify, dce, cse, fold, simplify, cse, dce, then `before_fusion`
// when given (the gradient all-reduce of data-parallel steps), then pack_attention_qkv,
// cache_state_casts, fuse_gemm_epilogue, fuse_elementwise and fused_bf16_operands unless the
// CSTORCH_FUSION
// environment variable is "0", verifying after each. If the CSTORCH_DUMP_GRAPHS environment
// variable names a directory, the graph is written there before and after every pass
// (`<prefix>-NN-<pass>.txt` and `.dot`).
void optimize(Graph& g, const std::string& prefix, std::unique_ptr<Pass> before_fusion = nullptr);
// A node's attributes as the graph dumps print them ("trans_a=true trans_b=false").
std::string attrs_str(const ir::Node& n);

}  // namespace cstorch::compiler
