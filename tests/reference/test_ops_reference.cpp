// Every row of op_table.cpp against PyTorch: forward values and vector-Jacobian products, in
// eager mode and inside a traced step. All rows run first (inputs from a seeded RNG of our
// own), their inputs, upstream gradients and results go to one JSON file, one Python process
// (check_ops.py) computes the torch reference and writes a verdict per row, and then each row
// is one gtest (Ops/OpReference.Matches/<row>). Eager and traced results must also agree with
// each other. --gtest_filter='*softmax*' runs (and sends to Python) only the matching rows;
// CSTORCH_REF_KEEP=1 keeps the JSON files (they are kept anyway when a row fails).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "cstorch/runtime.h"
#include "op_table.h"
#include "ref_util.h"

namespace cstorch::reftest {
namespace {

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

struct RowRun {
  json j;                                       // what goes to Python
  std::string cpp_error;                        // a cstorch error that stopped this row
  std::vector<std::string> agreement_failures;  // eager vs traced
};

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

  Rng rng(hash_name(row.name));
  std::vector<std::vector<double>> host;
  json jin = json::array();
  for (auto& a : row.inputs) {
    host.push_back(generate(a, rng));
    json t = tensor_json(a.shape, a.dtype, host.back());
    t["requires_grad"] = wants_grad(row, a);
    jin.push_back(t);
  }
  j["inputs"] = jin;

  const size_t n_in = row.inputs.size();
  In x(n_in);
  std::vector<size_t> grad_idx;
  try {
    for (size_t i = 0; i < n_in; ++i) {
      x[i] = make_tensor(host[i], row.inputs[i].shape, row.inputs[i].dtype);
      if (wants_grad(row, row.inputs[i])) {
        x[i].set_requires_grad(true);
        grad_idx.push_back(i);
      }
    }
  } catch (const std::exception& e) {
    rr.cpp_error = std::string("making the inputs: ") + e.what();
    return rr;
  }

  // ---- eager
  ModeResult eager;
  std::vector<Tensor> gs;
  json jg = json::array();
  try {
    eager.outputs = row.fn(x).v;
    for (auto& y : eager.outputs) {
      if (differentiable(row) && is_floating(y.dtype())) {
        Arg ga(y.shape());
        ga.dtype = y.dtype();
        auto gv = generate(ga, rng);
        gs.push_back(make_tensor(gv, y.shape(), y.dtype()));
        jg.push_back(tensor_json(y.shape(), y.dtype(), gv));
      } else {
        gs.push_back(Tensor());
        jg.push_back(nullptr);
      }
    }
    if (differentiable(row)) {
      backward_from(eager.outputs, gs);
      for (size_t i : grad_idx)
        eager.grads.push_back(x[i].grad().defined() ? x[i].grad() : zeros_like(x[i]));
    }
    json jo = json::array(), jgr = json::array();
    for (auto& y : eager.outputs) jo.push_back(tensor_json(y));
    for (auto& g : eager.grads) jgr.push_back(tensor_json(g));
    j["eager"] = {{"outputs", jo}, {"grads", jgr}};
  } catch (const std::exception& e) {
    rr.cpp_error = std::string("eager: ") + e.what();
    try {
      synchronize();
    } catch (...) {
    }
    return rr;
  }
  j["upstream"] = jg;

  // ---- traced: grad inputs are persistent leaves captured by the step; everything else
  // (non-grad inputs and the upstream gradients) is a step input. The step is called twice:
  // first with other values for the step inputs (trace, compile, run), then, after the grads
  // are reset to none again, with the row's values (a replay of the compiled program), so a
  // program that kept the first call's values would fail.
  ModeResult traced;
  try {
    for (size_t i : grad_idx) x[i].set_grad(Tensor());
    std::vector<Tensor> step_in, warm_in;
    std::vector<bool> is_leaf(n_in, false);
    for (size_t i : grad_idx) is_leaf[i] = true;
    Rng warm_rng(hash_name(row.name) + 1);
    for (size_t i = 0; i < n_in; ++i)
      if (!is_leaf[i]) {
        step_in.push_back(x[i]);
        warm_in.push_back(make_tensor(generate(row.inputs[i], warm_rng), row.inputs[i].shape,
                                      row.inputs[i].dtype));
      }
    std::vector<size_t> g_slots;
    for (size_t k = 0; k < gs.size(); ++k)
      if (gs[k].defined()) {
        g_slots.push_back(k);
        step_in.push_back(gs[k]);
        Arg ga(gs[k].shape());
        ga.dtype = gs[k].dtype();
        warm_in.push_back(make_tensor(generate(ga, warm_rng), ga.shape, ga.dtype));
      }
    const bool diff = differentiable(row);
    const size_t n_out = eager.outputs.size();
    auto step = trace(
        [&](const std::vector<Tensor>& in) -> std::vector<Tensor> {
          In xs(n_in);
          size_t k = 0;
          for (size_t i = 0; i < n_in; ++i) xs[i] = is_leaf[i] ? x[i] : in[k++];
          std::vector<Tensor> res = row.fn(xs).v;
          if (diff) {
            std::vector<Tensor> tg(res.size());
            for (size_t s : g_slots) tg[s] = in[k++];
            backward_from(res, tg);
            for (size_t i : grad_idx)
              res.push_back(x[i].grad().defined() ? x[i].grad() : zeros_like(x[i]));
          }
          return res;
        },
        row.name);
    RuntimeStats before = runtime_stats();
    (void)step(warm_in);
    synchronize();
    for (size_t i : grad_idx) x[i].set_grad(Tensor());
    std::vector<Tensor> r = step(step_in);
    synchronize();
    RuntimeStats after = runtime_stats();
    if (after.traces - before.traces != 1 || after.executions - before.executions != 2)
      rr.agreement_failures.push_back(
          "traced: two calls of the step with one signature made " +
          std::to_string(after.traces - before.traces) + " traces and " +
          std::to_string(after.executions - before.executions) +
          " executions (expected 1 and 2: the second call must replay)");
    if (r.size() != n_out + (diff ? grad_idx.size() : 0))
      throw std::runtime_error("traced step returned " + std::to_string(r.size()) + " tensors");
    traced.outputs.assign(r.begin(), r.begin() + static_cast<std::ptrdiff_t>(n_out));
    traced.grads.assign(r.begin() + static_cast<std::ptrdiff_t>(n_out), r.end());
    json jo = json::array(), jgr = json::array();
    for (auto& y : traced.outputs) jo.push_back(tensor_json(y));
    for (auto& g : traced.grads) jgr.push_back(tensor_json(g));
    synchronize();
    j["traced"] = {{"outputs", jo}, {"grads", jgr}};
  } catch (const std::exception& e) {
    rr.cpp_error = std::string("traced: ") + e.what();
    try {
      synchronize();
    } catch (...) {
    }
  }

  if (j.contains("traced")) {
    for (size_t k = 0; k < eager.outputs.size(); ++k) {
      auto m = compare_modes("output " + std::to_string(k), eager.outputs[k], traced.outputs[k]);
      if (!m.empty()) rr.agreement_failures.push_back(m);
    }
    for (size_t k = 0; k < eager.grads.size(); ++k) {
      auto m = compare_modes("grad of input " + std::to_string(grad_idx[k]), eager.grads[k],
                             traced.grads[k]);
      if (!m.empty()) rr.agreement_failures.push_back(m);
    }
  }
  return rr;
}

// ------------------------------------------------------------------------------------------
// Runs every row once and the Python check once; results shared by all the gtests.
struct Suite {
  std::map<std::string, RowRun> runs;
  std::map<std::string, json> verdicts;
  std::string global_error;  // Python missing or the checker failed as a whole
};

// The rows whose gtest runs in this process (all of them unless --gtest_filter narrows it).
std::set<std::string> selected_rows() {
  std::set<std::string> sel;
  auto* ut = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < ut->total_test_suite_count(); ++i) {
    const auto* ts = ut->GetTestSuite(i);
    if (std::string(ts->name()) != "Ops/OpReference") continue;
    for (int k = 0; k < ts->total_test_count(); ++k) {
      const auto* ti = ts->GetTestInfo(k);
      std::string n = ti->name();  // "Matches/<row>"
      if (ti->should_run() && n.rfind("Matches/", 0) == 0) sel.insert(n.substr(8));
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
    for (auto& row : op_table()) {
      if (!sel.empty() && !sel.count(row.name)) continue;
      RowRun rr = run_row(row);
      rr.j["cpp_error"] = rr.cpp_error;
      rows.push_back(rr.j);
      st.runs[row.name] = std::move(rr);
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
    std::printf("[reference] %zu rows: cstorch %.2f s, torch check %.2f s%s%s\n", rows.size(),
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

class OpReference : public ::testing::TestWithParam<std::string> {};

TEST_P(OpReference, Matches) {
  const std::string& name = GetParam();
  const Suite& s = suite();
  SCOPED_TRACE("row '" + name + "'");
  ASSERT_TRUE(s.global_error.empty()) << s.global_error;
  const RowRun& rr = s.runs.at(name);
  EXPECT_TRUE(rr.cpp_error.empty()) << "row '" << name << "': cstorch raised: " << rr.cpp_error;
  for (auto& m : rr.agreement_failures) ADD_FAILURE() << "row '" << name << "': " << m;
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

// The table covers every public op family; a quick guard that nobody emptied it.
TEST(OpReferenceTable, HasRows) {
  EXPECT_GT(op_table().size(), 300u);
}

}  // namespace
}  // namespace cstorch::reftest
