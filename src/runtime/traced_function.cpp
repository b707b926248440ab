// cstorch::trace: record the body once per input signature, turn the recording into a graph
// (outputs, state reads and writes), optimise and plan it, then enqueue executions.
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <unordered_set>

#include "compiler/program.h"
#include "cstorch/distributed.h"
#include "cstorch/runtime.h"
#include "ir/device.h"
#include "runtime/alloc_counter.h"
#include "runtime/executor.h"
#include "runtime/run_mode.h"
#include "runtime/sync.h"
#include "runtime/trace_context.h"

namespace cstorch {
namespace detail {
int64_t next_execution_step();
}

namespace {
constexpr size_t kMaxStepIO = 64;  // batch tensors in, tensors out, per traced step
int64_t g_traces = 0;
std::atomic<int64_t> g_last_allocs{-1};
}  // namespace

RuntimeStats runtime_stats() {
  RuntimeStats s;
  s.traces = g_traces;
  s.executions = runtime::Executor::get().executions();
  s.last_step_heap_allocations = g_last_allocs.load();
  return s;
}

namespace detail {

// A compiled variant of the step. Whether a parameter already had a .grad when the body ran
// changes what the body did (assign vs accumulate), and so does the training mode of a module
// the body asked (train()/eval() between calls): both are part of the variant's key, checked at
// every call; everything else is keyed by the input signature.
struct Variant {
  std::shared_ptr<compiler::Program> program;  // null when only traced (validate_only)
  std::string report;                          // what compile_only / validate_only write
  std::vector<std::pair<Shape, DType>> output_shapes;
  std::vector<std::pair<std::weak_ptr<TensorImpl>, bool>> grad_presence;
  // The .grad handles the body left on parameters where it changed them (a gradient created
  // in the step, or zero_grad setting it to none). The body does not run on a replay, so
  // every call re-applies them: the caller then sees what an eager call would leave, and the
  // next step (or another traced function) selects its variant from that.
  std::vector<std::pair<std::weak_ptr<TensorImpl>, std::shared_ptr<TensorImpl>>> grad_after;
  void apply_grads() const {
    for (auto& [w, g] : grad_after)
      if (auto impl = w.lock()) impl->grad = g;
  }
  // The training modes the body read (a Dropout's), and the other settings it read (an
  // optimizer's fixed hyper-parameters), as they were when it ran.
  std::vector<runtime::ModeRead> modes;
  bool matches() const {
    for (auto& [w, had] : grad_presence) {
      auto impl = w.lock();
      if (impl && (impl->grad != nullptr) != had) return false;
    }
    for (const auto& m : modes) {
      auto owner = m.owner.lock();
      if (owner && !m.unchanged()) return false;
    }
    return true;
  }
};

struct TracedFunction::Impl {
  Body body;
  std::string name;
  std::map<std::string, std::vector<Variant>> cache;
  std::map<std::string, std::vector<Tensor>> dry_outputs;  // compile_only / validate_only
};

TracedFunction::TracedFunction(Body body, std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->body = std::move(body);
  impl_->name = std::move(name);
}
TracedFunction::~TracedFunction() = default;

static std::string signature(const std::vector<Tensor>& in) {
  std::string s = is_grad_enabled() ? "g" : "n";
  for (auto& t : in) s += fmt::format("|{}{}", dtype_name(t.dtype()), shape_str(t.shape()));
  return s;
}

// Puts captured tensors back on their persistent values after the body ran (or failed).
static void restore(runtime::TraceContext& ctx) {
  for (auto& c : ctx.captures()) c.impl->node = c.original;
}

// Text report of a traced (not compiled) graph, for validate_only runs.
static std::string trace_report(const compiler::Graph& g) {
  std::map<std::string, int> counts;
  for (auto& n : g.nodes)
    if (!n->inputs.empty()) counts[n->name()]++;
  std::string ops;
  for (auto& [k, v] : counts) ops += fmt::format("    {}: {}\n", k, v);
  size_t writes = 0;
  for (auto& s : g.state) writes += s.write != nullptr;
  return fmt::format(
      "nodes traced: {}\nbatch inputs: {}\noutputs: {}\nstate tensors: {} ({} written)\n"
      "ops:\n{}",
      g.count_ops(), g.batch_inputs.size(), g.outputs.size(), g.state.size(), writes, ops);
}

static Variant trace_and_compile(TracedFunction::Impl& f, const std::vector<Tensor>& inputs,
                                 bool compile = true) {
  compiler::Graph g;
  Variant variant;
  // Gradient presence as the caller left it, before the body (which may zero_grad first) runs.
  std::unordered_map<TensorImpl*, std::shared_ptr<TensorImpl>> grad_before;
  for (auto& leaf : live_grad_leaves()) grad_before[leaf.get()] = leaf->grad;
  size_t traced_ops = 0;
  const Device device = runtime::step_device();  // the backend's device (CPU without one)
  {
    runtime::TraceContext ctx;
    std::vector<Tensor> placeholders;
    for (auto& t : inputs)
      placeholders.push_back(ctx.add_batch_input(t.shape(), t.dtype(), device));
    std::vector<Tensor> outs;
    try {
      outs = f.body(placeholders);
      // Step outputs: each a distinct computed node (a returned input or state is copied).
      std::unordered_set<ir::Node*> used;
      for (auto& o : outs) {
        CS_CHECK(o.defined(), "trace '{}': the step returned an undefined tensor", f.name);
        ir::NodePtr n = ctx.resolve(o.impl_ptr());
        if (n->inputs.empty() || !used.insert(n.get()).second) {
          NoGradGuard ng;
          n = ctx.resolve(dispatch(ir::OpCode::Copy, ir::NoAttrs{}, {make_tensor(n)}).impl_ptr());
          used.insert(n.get());
        }
        g.outputs.push_back(n);
      }
      // Gradients first created inside the step persist: give each a state buffer.
      for (size_t i = 0; i < ctx.captures().size(); ++i) {
        auto impl = ctx.captures()[i].impl;
        if (!impl->requires_grad || !impl->grad) continue;
        auto& gimpl = impl->grad;
        if (gimpl->node->trace_id != ctx.id()) continue;  // untouched or already captured
        bool captured = false;
        for (auto& c : ctx.captures()) captured = captured || c.impl == gimpl;
        if (captured) continue;
        const Device gdev = gimpl->node->device;
        auto buf = ir::Buffer::alloc(gimpl->node->nbytes(), gdev);
        ir::device_backend(gdev).fill_zero(buf->data, gimpl->node->nbytes());
        ctx.add_persistent(gimpl, make_constant_node(buf, gimpl->node->shape, gimpl->node->dtype));
      }
      // State: every captured tensor; a write where the body rebound it.
      for (auto& c : ctx.captures()) {
        compiler::StateSlot slot;
        slot.impl = c.impl;
        slot.input = c.input_node;
        slot.shape = c.original->shape;
        slot.dtype = c.original->dtype;
        slot.device = c.original->device;
        ir::NodePtr now = c.impl->node;
        if (now != c.original && now != c.input_node) {
          if (now->trace_id != ctx.id() || now->inputs.empty()) {
            NoGradGuard ng;  // value is another input or constant: copy it in
            now = ctx.resolve(
                dispatch(ir::OpCode::Copy, ir::NoAttrs{}, {make_tensor(now)}).impl_ptr());
          }
          CS_CHECK(now->shape == slot.shape && now->dtype == slot.dtype,
                   "trace '{}': tensor '{}' was reassigned from {}{} to {}{} inside the step; a "
                   "state tensor keeps its shape and dtype",
                   f.name, c.impl->name, dtype_name(slot.dtype), shape_str(slot.shape),
                   dtype_name(now->dtype), shape_str(now->shape));
          slot.write = now;
        }
        g.state.push_back(std::move(slot));
      }
    } catch (...) {
      restore(ctx);
      for (auto& c : ctx.captures())
        if (c.impl->grad && c.impl->grad->node->trace_id == ctx.id()) c.impl->grad.reset();
      // The body's own exceptions (a std::map::at of a batch key the batch lacks) become a
      // cstorch::Error naming the step: as they were, they passed a caller's catch of
      // cstorch::Error and ended the program with "terminate called ... map::at".
      // An error found while tracing (a shape mismatch, a missing key) names the step and the
      // traced function, as an error found while a step runs does: "step N: tracing 'NAME'
      // failed: ...".
      try {
        throw;
      } catch (const Error& e) {
        fail("step {}: tracing '{}' failed: {}", current_step(), f.name, e.what());
      } catch (const std::out_of_range& e) {
        fail(
            "trace '{}': the step's body threw std::out_of_range: {} (a key or index it reads "
            "is not there, e.g. a batch key the batch lacks)",
            f.name, e.what());
      } catch (const std::exception& e) {
        fail("trace '{}': the step's body threw: {}", f.name, e.what());
      }
    }
    restore(ctx);
    for (auto& c : ctx.captures()) {
      if (!c.impl->requires_grad || !c.input_node) continue;
      // Every leaf that requires grad is registered (set_requires_grad), so it is in the snapshot.
      const auto& before = grad_before.at(c.impl.get());
      variant.grad_presence.push_back({c.impl, before != nullptr});
      if (c.impl->grad != before) variant.grad_after.push_back({c.impl, c.impl->grad});
    }
    variant.modes = ctx.modes();
    g.nodes = ctx.nodes();
    g.batch_inputs = ctx.batch_inputs();
    g.gradients = ctx.gradients();
    traced_ops = g.count_ops();
  }
  CS_CHECK(g.batch_inputs.size() <= kMaxStepIO && g.outputs.size() <= kMaxStepIO,
           "trace '{}': the step has {} input and {} output tensors; at most {} of each", f.name,
           g.batch_inputs.size(), g.outputs.size(), kMaxStepIO);
  ++g_traces;
  for (auto& o : g.outputs) variant.output_shapes.push_back({o->shape, o->dtype});
  if (!compile) {
    compiler::verify(g, "tracing");
    variant.report = trace_report(g);
    return variant;
  }
  const bool data_parallel = distributed::num_replicas() > 1;
  // Every replica computes every gradient: the others need its share in the all-reduce even
  // where this replica does not use the gradient itself (a sharded optimizer).
  if (data_parallel) g.keep = g.gradients;
  std::unique_ptr<compiler::Pass> allreduce;
  if (data_parallel) {
    // Data parallel: gradients are averaged over the replicas, weighted by this replica's
    // sample count (the leading dimension of the first batch input). Placed before fusion, which
    // then sees the collectives as boundaries.
    double weight = 1;
    if (!g.batch_inputs.empty() && !g.batch_inputs[0]->shape.empty())
      weight = static_cast<double>(std::max<int64_t>(g.batch_inputs[0]->shape[0], 1));
    allreduce = compiler::make_gradient_allreduce_pass(weight, distributed::bucket_bytes());
  }
  compiler::optimize(g, f.name, std::move(allreduce));
  compiler::ProgramStats st;
  st.nodes_traced = traced_ops;
  variant.program = std::make_shared<compiler::Program>(std::move(g), device, st);
  variant.report = variant.program->summary();
  return variant;
}

// compile_only / validate_only: trace (and compile) each new signature once, write the report
// to the artifact directory, run nothing. The outputs are zeros of the traced shapes, so a
// loop around the step keeps working.
static std::vector<Tensor> dry_call(TracedFunction::Impl& f, const std::vector<Tensor>& inputs,
                                    const std::string& sig, runtime::RunMode mode) {
  auto it = f.dry_outputs.find(sig);
  if (it != f.dry_outputs.end()) return it->second;
  runtime::Executor::get().synchronize();
  const bool compile = mode == runtime::RunMode::CompileOnly;
  Variant v = trace_and_compile(f, inputs, compile);
  std::vector<Tensor> outs;
  const std::string artifact_dir = runtime::current_artifact_dir();
  std::error_code ec;
  std::filesystem::create_directories(artifact_dir, ec);
  std::string path = fmt::format("{}/{}-{}-{}.txt", artifact_dir, f.name,
                                 compile ? "compile" : "validate", f.dry_outputs.size());
  std::ofstream out(path);
  CS_CHECK(out.good(), "trace '{}': cannot write the {} report '{}'", f.name,
           compile ? "compile" : "validate", path);
  out << fmt::format("{} report for traced step '{}'\nsignature: {}\n",
                     compile ? "compile" : "validate", f.name, sig)
      << v.report;
  for (auto& o : v.output_shapes) outs.push_back(zeros(o.first, o.second));
  f.dry_outputs[sig] = outs;
  return outs;
}

// CSX backend with a compile_dir: each compiled program's report is kept there (by the main
// process; every replica compiles the same program).
static void write_compile_artifact(TracedFunction::Impl& f, const std::string& sig,
                                   const Variant& v) {
  const std::string dir = runtime::current_compile_dir();
  if (dir.empty() || !distributed::is_main_process()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  size_t n = 0;
  for (auto& [k, vs] : f.cache) n += vs.size();
  std::string path = fmt::format("{}/{}-compile-{}.txt", dir, f.name, n - 1);
  std::ofstream out(path);
  CS_CHECK(out.good(), "trace '{}': cannot write the compile artefact '{}' (backend compile_dir)",
           f.name, path);
  out << fmt::format("compile report for traced step '{}'\nsignature: {}\nreplicas: {}\n", f.name,
                     sig, distributed::num_replicas())
      << v.report;
}

std::vector<Tensor> TracedFunction::call(const std::vector<Tensor>& inputs) {
  CS_CHECK(!in_trace(), "trace '{}': a traced step cannot be called inside another traced step",
           impl_->name);
  auto& ex = runtime::Executor::get();
  ex.rethrow_if_failed();
  for (size_t i = 0; i < inputs.size(); ++i)
    CS_CHECK(inputs[i].defined(),
             "trace '{}': input {} of the step is an undefined tensor (a batch tensor never "
             "assigned?)",
             impl_->name, i);
  std::string sig = signature(inputs);
  const auto mode = runtime::current_run_mode();
  if (mode != runtime::RunMode::Execute) return dry_call(*impl_, inputs, sig, mode);
  auto& variants = impl_->cache[sig];
  const Variant* variant = nullptr;
  for (auto& v : variants)
    if (v.matches()) {
      variant = &v;
      break;
    }
  if (!variant) {
    // Tracing rebinds captured tensors for a moment: queued steps must not see that.
    ex.synchronize();
    variants.push_back(trace_and_compile(*impl_, inputs));
    variant = &variants.back();
    // Eager reads and writes of the step's state must wait for queued executions.
    for (auto& slot : variant->program->graph().state) {
      auto& buf = slot.impl->node->buffer;
      if (!buf) continue;
      if (!buf->event) buf->event = std::make_shared<runtime::Event>();
      buf->event->written_by_steps = true;
    }
    write_compile_artifact(*impl_, sig, *variant);
  }
  std::shared_ptr<compiler::Program> program = variant->program;
  variant->apply_grads();

  // Bind this execution: batch buffers (kept alive by the job) and fresh output buffers.
  // A batch living elsewhere (a host batch for a device step) is staged here, on the client
  // thread, while the executor still runs the previous steps: the copy overlaps them (on a
  // device with an asynchronous queue, it is queued on the device's stream).
  std::vector<std::shared_ptr<ir::Buffer>> batch;
  for (auto& t : inputs) {
    auto n = t.node();
    if (n->trace_id != 0) host_data(t, "trace input");  // raises the traced-tensor error
    if (!n->buffer) fail("trace '{}': an input tensor has no value", impl_->name);
    if (n->device != program->device()) {
      NoGradGuard ng;
      n = t.to(program->device()).node();
    }
    batch.push_back(n->buffer);
  }
  const auto& outs_g = program->graph().outputs;
  std::vector<std::shared_ptr<ir::Buffer>> out_bufs;
  std::vector<Tensor> outs;
  for (auto& o : outs_g) {
    auto b = ir::Buffer::alloc(o->nbytes(), o->device);
    auto n = make_constant_node(b, o->shape, o->dtype);
    outs.push_back(make_tensor(n));
    out_bufs.push_back(std::move(b));
  }
  int64_t step = next_execution_step();
  auto job = [program, batch = std::move(batch), out_bufs = std::move(out_bufs)]() {
    const ir::Buffer* bp[kMaxStepIO];  // sizes checked when the step was traced
    void* op[kMaxStepIO];
    for (size_t i = 0; i < batch.size(); ++i) bp[i] = batch[i].get();
    for (size_t i = 0; i < out_bufs.size(); ++i) op[i] = out_bufs[i]->data;
    runtime::AllocCounter counter;
    program->run(bp, op);
    g_last_allocs = counter.count();
  };
  int64_t id = ex.enqueue(std::move(job), true, step, fmt::format("traced step '{}'", impl_->name));
  for (auto& t : outs)
    t.node()->buffer->event = std::make_shared<runtime::Event>(runtime::Event{id});
  return outs;
}

}  // namespace detail
}  // namespace cstorch
