// Every row of op_table.cpp against PyTorch: forward values and vector-Jacobian products, in
// eager mode and inside a traced step. All rows run first (inputs from a seeded RNG of our
// own), their inputs, upstream gradients and results go to one JSON file, one Python process
// (check_ops.py) computes the torch reference and writes a verdict per row, and then each row
// is one gtest (Ops/OpReference.Matches/<row>). Eager and traced results must also agree with
// each other. --gtest_filter='*softmax*' runs (and sends to Python) only the matching rows;
// CSTORCH_REF_KEEP=1 keeps the JSON files (they are kept anyway when a row fails).
//
// Devices, as ggml's test-backend-ops: every row also runs, eager and traced, on every other
// registered device (this binary registers the checking device, tests/support/checking_device.h)
// with the same input values, moved there with .to(device), and the same upstream gradients;
// its outputs and input gradients, read back with .to(Device{}), must be the CPU's
// (Ops/OpOnDevice.MatchesTheCpu/<device>_<row>). The tolerance on the checking device is none,
// bitwise equality: it runs the CPU's kernels through the device ABI and answers the compiler's
// questions as the CPU does, so the same programs run the same kernels in the same order. A
// device with kernels of its own is held to the row's tolerance against the CPU's values.
//
// Coverage (OpReferenceTable.CoversEveryOp): every op of src/ir/ops.def must be exercised by a
// row, i.e. be in a row's traced graph (forward and backward, on some device) or run as a
// kernel of a row on the checking device (the compiler's fused and gemm), save the few listed
// in ops_without_rows() with the reason no row can reach them. CSTORCH_REF_COVERAGE=1 prints the
// rows that exercise each op.
#include <gtest/gtest.h>

#include <bitset>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <unordered_set>

#include "cstorch/runtime.h"
#include "ir/device.h"
#include "op_table.h"
#include "ref_util.h"
#include "runtime/run_mode.h"
#include "support/checking_device.h"

namespace cstorch::reftest {
namespace {

using OpSet = std::bitset<ir::kNumOps>;

// ------------------------------------------------------------------------------------------
// Inputs.

std::vector<double> generate(const Arg& a, Rng& rng) {
  size_t n = static_cast<size_t>(numel(a.shape));
  std::vector<double> v(n);
  if (a.gen == Gen::explicit_) {
    if (a.data.size() != n)
      throw std::runtime_error("explicit data has " + std::to_string(a.data.size()) +
                               " values for shape " + shape_str(a.shape));
    for (size_t i = 0; i < n; ++i)
      v[i] = std::isfinite(a.data[i]) ? round_to(a.data[i], a.dtype) : a.data[i];
    return v;
  }
  for (auto& x : v) {
    switch (a.gen) {
      case Gen::normal:
        x = rng.normal();
        break;
      case Gen::uniform:
        x = rng.uniform(a.lo, a.hi);
        break;
      case Gen::nonzero:
        x = rng.uniform(0.5, 2.0) * (rng.uniform() < 0.5 ? -1 : 1);
        break;
      case Gen::integer:
        x = static_cast<double>(
            rng.integer(static_cast<int64_t>(a.lo), static_cast<int64_t>(a.hi)));
        break;
      case Gen::mask:
        x = rng.uniform() < 0.5 ? 1 : 0;
        break;
      case Gen::explicit_:
        break;
    }
    x = round_to(x, a.dtype);
  }
  return v;
}

bool differentiable(const Row& r) {
  return !(r.flags & kNoGrad);
}
bool wants_grad(const Row& r, const Arg& a) {
  return differentiable(r) && a.grad && is_floating(a.dtype);
}
bool has_torch_reference(const Row& r) {
  return !r.py.empty();
}

// ------------------------------------------------------------------------------------------
// Devices.

// The devices besides the CPU that every row also runs on: each registered backend other than
// the CPU's. The checking device is registered here, before the tests are listed.
const std::vector<Device>& other_devices() {
  static const std::vector<Device> devices = [] {
    cstorch::testing::register_checking_device();
    std::vector<Device> v;
    const ir::DeviceBackend* cpu = &ir::device_backend(Device{});
    for (DeviceType t : {DeviceType::GPU, DeviceType::CSX, DeviceType::Plugin})
      if (const ir::DeviceBackend* b = ir::find_device_backend(Device{t, 0}); b && b != cpu)
        v.push_back(Device{t, 0});
    return v;
  }();
  return devices;
}

bool is_checking_device(Device d) {
  return d == cstorch::testing::register_checking_device();
}

// A device's name as part of a gtest name ("check:0" -> "check0").
std::string device_tag(Device d) {
  std::string s;
  for (char c : device_str(d))
    if (std::isalnum(static_cast<unsigned char>(c))) s += c;
  return s;
}

// ------------------------------------------------------------------------------------------
// One mode's results: outputs then (for differentiable rows) one gradient per grad input.
struct ModeResult {
  std::vector<Tensor> outputs;
  std::vector<Tensor> grads;  // parallel to the row's grad inputs
};

// Backward from `outs` with upstream gradients `gs` (undefined for non-float outputs).
void backward_from(const std::vector<Tensor>& outs, const std::vector<Tensor>& gs) {
  std::vector<std::pair<Tensor, Tensor>> live;
  for (size_t i = 0; i < outs.size(); ++i)
    if (gs[i].defined() && outs[i].requires_grad()) live.push_back({outs[i], gs[i]});
  if (live.empty()) return;
  if (live.size() == 1) {
    live[0].first.backward(live[0].second);
    return;
  }
  Tensor total;
  for (auto& [y, g] : live) {
    Tensor t = sum(mul(cast(y, DType::f32), cast(g, DType::f32)));
    total = total.defined() ? add(total, t) : t;
  }
  total.backward();
}

// Adds the ops of the graph behind `roots` to `ops`. Called inside a traced body, where every
// node reachable from a value computed in the trace is a node of that trace (forward and
// backward alike; eager nodes have dropped their inputs).
void note_traced_ops(const std::vector<Tensor>& roots, OpSet& ops) {
  std::vector<const ir::Node*> stack;
  std::unordered_set<const ir::Node*> seen;
  for (auto& t : roots)
    if (t.defined() && t.node()->trace_id != 0) stack.push_back(t.node().get());
  while (!stack.empty()) {
    const ir::Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    ops.set(static_cast<size_t>(n->op));
    for (auto& i : n->inputs) stack.push_back(i.get());
  }
}

// The names of the ops in `ops` that compute something (not input / constant).
std::string op_names(const OpSet& ops) {
  std::string s;
  for (int i = 0; i < ir::kNumOps; ++i) {
    const auto op = static_cast<ir::OpCode>(i);
    if (ops.test(static_cast<size_t>(i)) && !ir::has_trait(op, ir::kLeaf))
      s += (s.empty() ? "" : ", ") + std::string(ir::op_info(op).name);
  }
  return s.empty() ? "none" : s;
}

// Compares the eager and traced value of one tensor; returns "" when they agree.
std::string compare_modes(const std::string& what, const Tensor& e, const Tensor& t) {
  if (e.shape() != t.shape())
    return what + ": eager shape " + shape_str(e.shape()) + " vs traced " + shape_str(t.shape());
  if (e.dtype() != t.dtype())
    return what + ": eager dtype " + dtype_name(e.dtype()) + " vs traced " + dtype_name(t.dtype());
  auto a = host_values(e), b = host_values(t);
  double scale = 0;
  for (double v : a)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  double worst = 0;
  size_t at = 0;
  bool bad = false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (a[i] == b[i]) continue;
    double d = std::abs(a[i] - b[i]);
    // 1e-6 relative per element, with a floor of 1e-6 of the tensor's scale for elements
    // near zero (a traced program may fuse or reorder a reduction).
    double bound =
        is_floating(e.dtype()) ? 1e-6 * std::max(std::abs(a[i]), std::abs(b[i])) + 1e-6 * scale : 0;
    if (!(d <= bound)) {
      bad = true;
      if (!(d <= worst)) worst = d, at = i;
    }
  }
  if (!bad) return "";
  std::ostringstream os;
  os.precision(9);
  os << what << ": eager and traced differ, max |diff| " << worst << " at flat index " << at
     << " (eager " << a[at] << ", traced " << b[at] << "; bound 1e-6 relative)";
  return os.str();
}

// Compares `got`, computed on device `dev`, with the CPU's value `cpu`; returns "" when they
// agree: `got` lives on `dev` and has the CPU's shape, dtype and bytes (on a device other than
// the checking device: float values within the row's tolerance of the CPU's).
std::string compare_with_cpu(const std::string& what, const Tensor& cpu, const Tensor& got,
                             Device dev, const Row& row) {
  if (got.device() != dev)
    return what + ": on device " + device_str(got.device()) + ", not " + device_str(dev);
  if (cpu.shape() != got.shape())
    return what + ": shape " + shape_str(got.shape()) + ", the CPU's " + shape_str(cpu.shape());
  if (cpu.dtype() != got.dtype())
    return what + ": dtype " + dtype_name(got.dtype()) + ", the CPU's " + dtype_name(cpu.dtype());
  const Tensor back = got.to(Device{});
  const auto a = host_values(cpu), b = host_values(back);
  const bool bitwise = is_checking_device(dev) || !is_floating(cpu.dtype());
  const size_t item = itemsize(cpu.dtype());
  const auto* pa = static_cast<const unsigned char*>(cpu.data_ptr());
  const auto* pb = static_cast<const unsigned char*>(back.data_ptr());
  double scale = 0;
  for (double v : a)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  const double atol = row.tol.atol * ((row.flags & kNormTol) ? scale : 1.0);
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool ok = bitwise ? std::memcmp(pa + i * item, pb + i * item, item) == 0
                            : (std::isnan(a[i]) && std::isnan(b[i])) || a[i] == b[i] ||
                                  std::abs(a[i] - b[i]) <= atol + row.tol.rtol * std::abs(a[i]);
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return "";
  std::ostringstream os;
  os.precision(9);
  os << what << ": " << bad << " of " << a.size() << " elements differ from the CPU's ("
     << (bitwise ? "bitwise equality required" : "the row's tolerance") << "); first at flat index "
     << first << ": got " << b[first] << ", CPU " << a[first];
  return os.str();
}

// ------------------------------------------------------------------------------------------
// Running a row: on the CPU first (its results go to torch and are the other devices'
// reference), then on each other device with the same inputs, upstream gradients and warm-up
// values. Random rows draw the same numbers everywhere: the generator is seeded before each run.

struct HostTensor {
  Shape shape;
  DType dtype = DType::f32;
  std::vector<double> values;
  Tensor on(Device d) const { return make_tensor(values, shape, dtype).to(d); }
};

// What one device computed for a row.
struct DeviceRun {
  ModeResult eager, traced;
  bool eager_ok = false, traced_ok = false;
  std::string error;                  // the cstorch error that stopped the run
  std::vector<std::string> failures;  // the traced step's replay check
};

class RowRunner {
 public:
  explicit RowRunner(const Row& row) : row_(row), rng_(hash_name(row.name)) {
    for (size_t i = 0; i < row.inputs.size(); ++i) {
      const Arg& a = row.inputs[i];
      inputs_.push_back({a.shape, a.dtype, generate(a, rng_)});
      if (wants_grad(row, a)) grad_idx_.push_back(i);
    }
  }
  const std::vector<HostTensor>& inputs() const { return inputs_; }
  const std::vector<size_t>& grad_idx() const { return grad_idx_; }
  // The upstream gradient of each output (none for non-float outputs), made by the first run.
  const std::vector<std::optional<HostTensor>>& upstream() const { return upstream_; }
  const OpSet& ops() const { return ops_; }

  DeviceRun run(Device dev) {
    DeviceRun out;
    In x(row_.inputs.size());
    x.device = dev;
    try {
      for (size_t i = 0; i < x.size(); ++i) x[i] = inputs_[i].on(dev);
      for (size_t i : grad_idx_) x[i].set_requires_grad(true);
    } catch (const std::exception& e) {
      out.error = std::string("making the inputs: ") + e.what();
      return out;
    }
    std::vector<Tensor> gs;
    if (eager(x, dev, gs, out)) traced(x, dev, gs, out);
    return out;
  }

 private:
  bool eager(In& x, Device dev, std::vector<Tensor>& gs, DeviceRun& out) {
    try {
      manual_seed(seed());
      out.eager.outputs = row_.fn(x).v;
      if (!upstream_made_) {
        for (auto& y : out.eager.outputs) {
          if (differentiable(row_) && is_floating(y.dtype())) {
            Arg ga(y.shape());
            ga.dtype = y.dtype();
            upstream_.push_back(HostTensor{y.shape(), y.dtype(), generate(ga, rng_)});
          } else {
            upstream_.push_back(std::nullopt);
          }
        }
        upstream_made_ = true;
      }
      if (out.eager.outputs.size() != upstream_.size())
        fail("{} outputs, the CPU's {}", out.eager.outputs.size(), upstream_.size());
      for (auto& u : upstream_) gs.push_back(u ? u->on(dev) : Tensor());
      if (differentiable(row_)) {
        backward_from(out.eager.outputs, gs);
        for (size_t i : grad_idx_)
          out.eager.grads.push_back(x[i].grad().defined() ? x[i].grad() : zeros_like(x[i]));
      }
      out.eager_ok = true;
      return true;
    } catch (const std::exception& e) {
      out.error = std::string("eager: ") + e.what();
      try {
        synchronize();
      } catch (...) {
      }
      return false;
    }
  }

  // Grad inputs are persistent leaves captured by the step; everything else (non-grad inputs
  // and the upstream gradients) is a step input. The step is called twice: first with other
  // values for the step inputs (trace, compile, run), then, after the grads are reset to none
  // again, with the row's values (a replay of the compiled program), so a program that kept the
  // first call's values would fail. On another device the step runs there.
  void traced(In& x, Device dev, const std::vector<Tensor>& gs, DeviceRun& out) {
    const size_t n_in = x.size();
    try {
      std::optional<runtime::StepDeviceScope> on_device;
      if (dev != Device{}) on_device.emplace(dev);
      for (size_t i : grad_idx_) x[i].set_grad(Tensor());
      std::vector<bool> is_leaf(n_in, false);
      for (size_t i : grad_idx_) is_leaf[i] = true;
      std::vector<size_t> g_slots;
      for (size_t k = 0; k < gs.size(); ++k)
        if (gs[k].defined()) g_slots.push_back(k);
      if (!warm_made_) {
        Rng warm_rng(hash_name(row_.name) + 1);
        for (size_t i = 0; i < n_in; ++i)
          if (!is_leaf[i])
            warm_.push_back(
                {row_.inputs[i].shape, row_.inputs[i].dtype, generate(row_.inputs[i], warm_rng)});
        for (size_t k : g_slots) {
          Arg ga(gs[k].shape());
          ga.dtype = gs[k].dtype();
          warm_.push_back({ga.shape, ga.dtype, generate(ga, warm_rng)});
        }
        warm_made_ = true;
      }
      std::vector<Tensor> step_in, warm_in;
      for (size_t i = 0; i < n_in; ++i)
        if (!is_leaf[i]) step_in.push_back(x[i]);
      for (size_t k : g_slots) step_in.push_back(gs[k]);
      for (auto& w : warm_) warm_in.push_back(w.on(dev));
      const bool diff = differentiable(row_);
      const size_t n_out = upstream_.size();
      auto step = trace(
          [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
            In xs(n_in);
            xs.device = dev;
            size_t k = 0;
            for (size_t i = 0; i < n_in; ++i) xs[i] = is_leaf[i] ? x[i] : in[k++];
            std::vector<Tensor> res = row_.fn(xs).v;
            if (diff) {
              std::vector<Tensor> tg(res.size());
              for (size_t s : g_slots) tg[s] = in[k++];
              backward_from(res, tg);
              for (size_t i : grad_idx_)
                res.push_back(x[i].grad().defined() ? x[i].grad() : zeros_like(x[i]));
            }
            note_traced_ops(res, ops_);
            return res;
          },
          row_.name);
      RuntimeStats before = runtime_stats();
      manual_seed(seed());
      (void)step(warm_in);
      synchronize();
      for (size_t i : grad_idx_) x[i].set_grad(Tensor());
      manual_seed(seed());
      std::vector<Tensor> r = step(step_in);
      synchronize();
      RuntimeStats after = runtime_stats();
      if (after.traces - before.traces != 1 || after.executions - before.executions != 2)
        out.failures.push_back("traced: two calls of the step with one signature made " +
                               std::to_string(after.traces - before.traces) + " traces and " +
                               std::to_string(after.executions - before.executions) +
                               " executions (expected 1 and 2: the second call must replay)");
      if (r.size() != n_out + (diff ? grad_idx_.size() : 0))
        throw std::runtime_error("traced step returned " + std::to_string(r.size()) + " tensors");
      out.traced.outputs.assign(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(n_out));
      out.traced.grads.assign(r.begin() + static_cast<std::ptrdiff_t>(n_out), r.end());
      out.traced_ok = true;
    } catch (const std::exception& e) {
      out.error = std::string("traced: ") + e.what();
      try {
        synchronize();
      } catch (...) {
      }
    }
  }

  uint64_t seed() const { return hash_name(row_.name); }

  const Row& row_;
  Rng rng_;  // the inputs, then the upstream gradients
  std::vector<HostTensor> inputs_;
  std::vector<size_t> grad_idx_;
  std::vector<std::optional<HostTensor>> upstream_;
  bool upstream_made_ = false;
  std::vector<HostTensor> warm_;  // the first traced call's step inputs
  bool warm_made_ = false;
  OpSet ops_;
};

// What one other device did with a row.
struct DeviceCheck {
  std::string error;                  // a cstorch error that stopped the run there
  bool refused = false;               // `error` is a declared refusal (is_declared_refusal)
  std::vector<std::string> failures;  // values that are not the CPU's; the replay check
};

// A device with kernels of its own (the CUDA backend) may lack some: its kernel table and
// capability answers say so, and compiling a row that needs one fails with one of the messages
// of ir::kernel_for, naming the op and the device, before anything runs. Such a row is a
// declared refusal, counted in the suite's summary; any other error is a failure. The checking
// device runs the CPU's kernels and may refuse nothing.
bool is_declared_refusal(const std::string& error, Device d) {
  if (is_checking_device(d) || error.empty()) return false;
  const std::string dev = device_str(d);  // letters, digits and ':' only
  static const char* const patterns[] = {"op '[^']+' has no kernel for device DEV in this build",
                                         "op '[^']+' has no kernel for dtype \\w+ on device DEV",
                                         "op '[^']+' cannot run on device DEV: "};
  for (const char* p : patterns) {
    std::string re = p;
    re.replace(re.find("DEV"), 3, dev);
    if (std::regex_search(error, std::regex(re))) return true;
  }
  return false;
}

struct RowRun {
  json j;                                       // what goes to Python
  std::string cpp_error;                        // a cstorch error that stopped this row
  std::vector<std::string> agreement_failures;  // eager vs traced
  std::map<std::string, DeviceCheck> devices;   // by device_str
  OpSet ops;                                    // what the row exercised (coverage)
};

json mode_json(const ModeResult& m) {
  json jo = json::array(), jgr = json::array();
  for (auto& y : m.outputs) jo.push_back(tensor_json(y));
  for (auto& g : m.grads) jgr.push_back(tensor_json(g));
  return {{"outputs", jo}, {"grads", jgr}};
}

RowRun run_row(const Row& row) {
  RowRun rr;
  json& j = rr.j;
  j["name"] = row.name;
  j["expr"] = row.py;
  j["rtol"] = row.tol.rtol;
  j["atol"] = row.tol.atol;
  j["norm_tol"] = (row.flags & kNormTol) != 0;
  j["native"] = (row.flags & kNative) != 0;
  j["grad"] = differentiable(row);

  RowRunner runner(row);
  json jin = json::array();
  for (size_t i = 0; i < row.inputs.size(); ++i) {
    const HostTensor& h = runner.inputs()[i];
    json t = tensor_json(h.shape, h.dtype, h.values);
    t["requires_grad"] = wants_grad(row, row.inputs[i]);
    jin.push_back(t);
  }
  j["inputs"] = jin;
  const auto& grad_idx = runner.grad_idx();

  // ---- the CPU: against torch (check_ops.py), and eager against traced
  const DeviceRun cpu = runner.run(Device{});
  rr.cpp_error = cpu.error;
  rr.agreement_failures = cpu.failures;
  if (cpu.eager_ok) {
    json jg = json::array();
    for (auto& u : runner.upstream())
      jg.push_back(u ? tensor_json(u->shape, u->dtype, u->values) : json(nullptr));
    j["upstream"] = jg;
    j["eager"] = mode_json(cpu.eager);
  }
  if (cpu.traced_ok) {
    j["traced"] = mode_json(cpu.traced);
    for (size_t k = 0; k < cpu.eager.outputs.size(); ++k) {
      auto m =
          compare_modes("output " + std::to_string(k), cpu.eager.outputs[k], cpu.traced.outputs[k]);
      if (!m.empty()) rr.agreement_failures.push_back(m);
    }
    for (size_t k = 0; k < cpu.eager.grads.size(); ++k) {
      auto m = compare_modes("grad of input " + std::to_string(grad_idx[k]), cpu.eager.grads[k],
                             cpu.traced.grads[k]);
      if (!m.empty()) rr.agreement_failures.push_back(m);
    }
  }

  // ---- every other device: each mode against the CPU's
  for (Device dev : other_devices()) {
    DeviceCheck& dc = rr.devices[device_str(dev)];
    if (!cpu.eager_ok) {
      dc.error = "not run: the CPU run failed (" + cpu.error + ")";
      continue;
    }
    const bool check = is_checking_device(dev);
    const auto kernels_before =
        check ? cstorch::testing::checking_device_kernel_calls() : std::vector<int64_t>();
    const DeviceRun run = runner.run(dev);
    if (check) {
      const auto kernels_after = cstorch::testing::checking_device_kernel_calls();
      for (size_t op = 0; op < kernels_after.size(); ++op)
        if (kernels_after[op] != kernels_before[op]) rr.ops.set(op);
    }
    dc.error = run.error;
    dc.refused = is_declared_refusal(run.error, dev);
    dc.failures = run.failures;
    auto compare = [&](const char* mode, const ModeResult& want, const ModeResult& got) {
      for (size_t k = 0; k < want.outputs.size() && k < got.outputs.size(); ++k) {
        auto m = compare_with_cpu(std::string(mode) + " output " + std::to_string(k),
                                  want.outputs[k], got.outputs[k], dev, row);
        if (!m.empty()) dc.failures.push_back(m);
      }
      for (size_t k = 0; k < want.grads.size() && k < got.grads.size(); ++k) {
        auto m =
            compare_with_cpu(std::string(mode) + " grad of input " + std::to_string(grad_idx[k]),
                             want.grads[k], got.grads[k], dev, row);
        if (!m.empty()) dc.failures.push_back(m);
      }
    };
    try {
      if (run.eager_ok) compare("eager", cpu.eager, run.eager);
      if (run.traced_ok && cpu.traced_ok) compare("traced", cpu.traced, run.traced);
    } catch (const std::exception& e) {
      dc.failures.push_back(std::string("reading the results back: ") + e.what());
    }
  }
  rr.ops |= runner.ops();
  return rr;
}

// ------------------------------------------------------------------------------------------
// Runs every row once and the Python check once; results shared by all the gtests.
struct Suite {
  std::map<std::string, RowRun> runs;
  std::map<std::string, json> verdicts;
  std::string global_error;  // Python missing or the checker failed as a whole
};

// The rows whose gtests run in this process (all of them unless --gtest_filter narrows it; all
// of them whenever the coverage test runs).
std::set<std::string> selected_rows() {
  std::set<std::string> sel;
  auto* ut = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < ut->total_test_suite_count(); ++i) {
    const auto* ts = ut->GetTestSuite(i);
    const std::string suite_name = ts->name();
    for (int k = 0; k < ts->total_test_count(); ++k) {
      const auto* ti = ts->GetTestInfo(k);
      if (!ti->should_run()) continue;
      const std::string n = ti->name();
      if (suite_name == "OpReferenceTable" && n == "CoversEveryOp") return {};
      if (suite_name == "Ops/OpReference" && n.rfind("Matches/", 0) == 0) sel.insert(n.substr(8));
      if (suite_name == "Ops/OpOnDevice" && n.rfind("MatchesTheCpu/", 0) == 0) {
        const std::string rest = n.substr(14);  // "<device>_<row>"
        for (Device d : other_devices())
          if (rest.rfind(device_tag(d) + "_", 0) == 0)
            sel.insert(rest.substr(device_tag(d).size() + 1));
      }
    }
  }
  return sel;
}

const Suite& suite() {
  static const Suite s = [] {
    Suite st;
    auto t0 = std::chrono::steady_clock::now();
    auto sel = selected_rows();
    json rows = json::array();
    const Tensor rng_before = rng_state();  // rows seed the generator: put it back afterwards
    for (auto& row : op_table()) {
      if (!sel.empty() && !sel.count(row.name)) continue;
      RowRun rr = run_row(row);
      rr.j["cpp_error"] = rr.cpp_error;
      if (has_torch_reference(row)) rows.push_back(rr.j);
      st.runs[row.name] = std::move(rr);
    }
    set_rng_state(rng_before);
    for (Device d : other_devices()) {
      size_t refused = 0;
      for (auto& [name, rr] : st.runs) refused += rr.devices.at(device_str(d)).refused ? 1 : 0;
      if (refused > 0)
        std::printf("[reference] %s: %zu of %zu rows refused (ops without kernels there)\n",
                    device_str(d).c_str(), refused, st.runs.size());
    }
    auto t1 = std::chrono::steady_clock::now();
    auto dir = make_temp_dir("ref_ops");
    auto in = dir / "rows.json", out = dir / "verdicts.json";
    write_json(in, json{{"rows", rows}});
    std::filesystem::remove(out);
    std::string log;
    int rc = run_reference_script("check_ops.py", {in.string(), out.string()}, &log);
    auto t2 = std::chrono::steady_clock::now();
    if (rc != 0 || !std::filesystem::exists(out)) {
      if (auto why = torch_unavailable_reason(); !why.empty()) {
        st.global_error = why;
        return st;
      }
      st.global_error =
          "check_ops.py failed (exit " + std::to_string(rc) + ") on " + in.string() + ":\n" + log;
      return st;
    }
    json v = read_json(out);
    bool all_ok = true;
    for (auto& r : v["rows"]) {
      all_ok = all_ok && r["ok"].get<bool>();
      st.verdicts[r["name"].get<std::string>()] = r;
    }
    for (auto& [name, rr] : st.runs)
      all_ok = all_ok && rr.cpp_error.empty() && rr.agreement_failures.empty();
    // The data (tens of MB) is kept only when something failed or CSTORCH_REF_KEEP is set.
    bool keep = !all_ok || std::getenv("CSTORCH_REF_KEEP");
    std::string devices = "CPU";
    for (Device d : other_devices()) devices += ", " + device_str(d);
    std::printf(
        "[reference] %zu rows (%zu against torch) on %s: cstorch %.2f s, torch check %.2f s%s%s\n",
        st.runs.size(), rows.size(), devices.c_str(),
        std::chrono::duration<double>(t1 - t0).count(),
        std::chrono::duration<double>(t2 - t1).count(), keep ? "; data kept in " : "",
        keep ? dir.c_str() : "");
    if (!keep) std::filesystem::remove_all(dir);
    return st;
  }();
  return s;
}

std::vector<std::string> row_names() {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (auto& r : op_table()) {
    bool ok = !r.name.empty() && seen.insert(r.name).second;
    for (char c : r.name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!ok) {
      std::fprintf(stderr,
                   "op_table: row name '%s' is empty, duplicated or has characters other than "
                   "letters, digits and '_'\n",
                   r.name.c_str());
      std::abort();
    }
    names.push_back(r.name);
  }
  return names;
}

const Row& row_named(const std::string& name) {
  for (auto& r : op_table())
    if (r.name == name) return r;
  throw std::runtime_error("no row '" + name + "'");
}

class OpReference : public ::testing::TestWithParam<std::string> {};

TEST_P(OpReference, Matches) {
  const std::string& name = GetParam();
  const Suite& s = suite();
  SCOPED_TRACE("row '" + name + "'");
  const RowRun& rr = s.runs.at(name);
  EXPECT_TRUE(rr.cpp_error.empty()) << "row '" << name << "': cstorch raised: " << rr.cpp_error;
  for (auto& m : rr.agreement_failures) ADD_FAILURE() << "row '" << name << "': " << m;
  if (!has_torch_reference(row_named(name))) return;  // a random row: eager vs traced only
  ASSERT_TRUE(s.global_error.empty()) << s.global_error;
  auto it = s.verdicts.find(name);
  ASSERT_NE(it, s.verdicts.end()) << "row '" << name << "': no verdict from check_ops.py";
  const json& v = it->second;
  if (!v.value("error", std::string()).empty())
    ADD_FAILURE() << "row '" << name << "': " << v["error"].get<std::string>();
  for (auto& c : v["checks"]) {
    if (c["ok"].get<bool>()) continue;
    ADD_FAILURE() << "row '" << name << "' (" << rr.j["expr"].get<std::string>()
                  << "): " << c["what"].get<std::string>() << ": " << c["msg"].get<std::string>();
  }
  if (rr.cpp_error.empty()) {
    EXPECT_TRUE(v["ok"].get<bool>()) << "row '" << name << "' did not match torch";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpReference, ::testing::ValuesIn(row_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// One row on one other device against the CPU.
struct DeviceRow {
  Device device;
  std::string row;
};
void PrintTo(const DeviceRow& r, std::ostream* os) {
  *os << "row " << r.row << " on " << device_str(r.device);
}

std::vector<DeviceRow> device_rows() {
  std::vector<DeviceRow> v;
  for (Device d : other_devices())
    for (auto& name : row_names()) v.push_back({d, name});
  return v;
}

class OpOnDevice : public ::testing::TestWithParam<DeviceRow> {};

TEST_P(OpOnDevice, MatchesTheCpu) {
  const DeviceRow& p = GetParam();
  const Suite& s = suite();
  const RowRun& rr = s.runs.at(p.row);
  const std::string where =
      "row '" + p.row + "' (ops: " + op_names(rr.ops) + ") on device " + device_str(p.device);
  const DeviceCheck& dc = rr.devices.at(device_str(p.device));
  if (dc.refused) {
    EXPECT_TRUE(dc.failures.empty()) << where << ": refused, yet compared";
    RecordProperty("refused", dc.error);
    return;
  }
  EXPECT_TRUE(dc.error.empty()) << where << ": " << dc.error;
  for (auto& f : dc.failures) ADD_FAILURE() << where << ": " << f;
}

INSTANTIATE_TEST_SUITE_P(Ops, OpOnDevice, ::testing::ValuesIn(device_rows()),
                         [](const ::testing::TestParamInfo<DeviceRow>& info) {
                           return device_tag(info.param.device) + "_" + info.param.row;
                         });

// The table covers every public op family; a quick guard that nobody emptied it.
TEST(OpReferenceTable, HasRows) {
  EXPECT_GT(op_table().size(), 300u);
}

// The ops of ops.def that no row can reach, each with the reason. Every other op needs a row:
// reached through a public function, a gradient or a traced step's compilation.
const std::map<ir::OpCode, std::string>& ops_without_rows() {
  static const std::map<ir::OpCode, std::string> m = [] {
    std::map<ir::OpCode, std::string> m = {
        {ir::OpCode::AllReduceStart,
         "made by the gradient all-reduce pass only in a step trained data parallel over several "
         "replicas (this process is one); tests/e2e's distributed tests run it"},
        {ir::OpCode::AllReduceUnpack, "as all_reduce_start"},
        {ir::OpCode::After,
         "made by fuse_gemm_epilogue only for a parameter that a gemm updates in place (an "
         "optimizer's state write), which no row has; tests/unit/compiler/test_fusion.cpp"},
    };
    // Row mlp_gemm_epilogues' first product (M 16, N 20, K 12, W transposed).
    if (!ir::device_backend(Device{}).gemm_epilogue_applies(16, 20, 12, true))
      m[ir::OpCode::Gemm] =
          "this build's CPU backend applies no GEMM epilogue (built without AVX-512), so the "
          "compiler makes no gemm";
    return m;
  }();
  return m;
}

TEST(OpReferenceTable, CoversEveryOp) {
  const Suite& s = suite();
  ASSERT_EQ(s.runs.size(), op_table().size()) << "the coverage check needs every row to run";
  OpSet covered;
  std::map<size_t, std::string> first_row;
  for (auto& row : op_table()) {
    const OpSet& ops = s.runs.at(row.name).ops;
    for (size_t i = 0; i < ops.size(); ++i)
      if (ops.test(i) && !first_row.count(i)) first_row[i] = row.name;
    covered |= ops;
  }
  const bool print = std::getenv("CSTORCH_REF_COVERAGE") != nullptr;
  for (int i = 0; i < ir::kNumOps; ++i) {
    const auto op = static_cast<ir::OpCode>(i);
    const std::string name = ir::op_info(op).name;
    if (print) {
      std::string rows;
      for (auto& row : op_table())
        if (s.runs.at(row.name).ops.test(static_cast<size_t>(i))) rows += " " + row.name;
      std::printf("[coverage] %s:%s\n", name.c_str(), rows.empty() ? " (none)" : rows.c_str());
    }
    const bool listed = ops_without_rows().count(op) > 0;
    const bool hit = covered.test(static_cast<size_t>(i));
    if (!listed && !hit)
      ADD_FAILURE() << "op '" << name
                    << "' (src/ir/ops.def) is exercised by no row of tests/reference/op_table.cpp: "
                       "add a row that reaches it (a public function, a gradient or a traced "
                       "step), or, where no row can, list it in ops_without_rows() with the reason";
    if (listed && hit)
      ADD_FAILURE() << "op '" << name << "' is listed in ops_without_rows() but row '"
                    << first_row[static_cast<size_t>(i)] << "' exercises it: take it off the list";
  }
}

}  // namespace
}  // namespace cstorch::reftest
