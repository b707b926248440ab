// The built-in user callbacks and their YAML factories.
#include "modelzoo/builtin_callbacks.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "cstorch/distributed.h"
#include "modelzoo/trainer.h"

namespace modelzoo {

namespace fs = std::filesystem;

namespace {

MonitorMode parse_mode(const ConfigView& a) {
  const std::string m = a.get_string("mode", "min");
  if (m == "min") return MonitorMode::Min;
  if (m == "max") return MonitorMode::Max;
  cstorch::fail("{}: must be min or max, got '{}'", a.child_path("mode"), m);
}

const char* mode_name(MonitorMode m) {
  return m == MonitorMode::Min ? "min" : "max";
}

// `monitor` from the latest validation; its absence is an error listing what there is.
double monitored(const Trainer& t, const std::string& monitor, const char* who) {
  const Scalars& v = t.last_validation_metrics();
  auto it = v.find(monitor);
  if (it != v.end()) return it->second;
  std::vector<std::string> names;
  for (const auto& [k, x] : v) names.push_back(k);
  cstorch::fail("{}: monitor '{}' is not among the validation results (they are: {})", who, monitor,
                fmt::join(names, ", "));
}

// At the start of a fit: a monitor that no validation reports is an error now, not after the
// first validation (which may come hours in); a fit without validation is warned about.
void check_monitor(const Trainer& t, const std::string& monitor, const char* who,
                   const std::string& key) {
  if (!t.fit_validates()) {
    if (cstorch::distributed::is_main_process())
      fmt::print(stderr,
                 "warning: {} watches '{}', but this fit has no validation dataloader: it does "
                 "nothing\n",
                 who, monitor);
    return;
  }
  const auto names = t.validation_result_names();
  if (std::find(names.begin(), names.end(), monitor) == names.end())
    cstorch::fail("{}: monitor '{}' is not among the validation results (they are: {})",
                  key.empty() ? std::string(who) : key, monitor, fmt::join(names, ", "));
}

// Whether `a` is better than `b` by more than `delta` (any number beats NaN: no value yet).
bool better(MonitorMode m, double a, double b, double delta = 0) {
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return m == MonitorMode::Min ? a < b - delta : a > b + delta;
}

int64_t positive_int(const ConfigView& a, const std::string& key, int64_t def) {
  const int64_t v = a.get_int(key, def);
  if (v < 1) cstorch::fail("{}: must be at least 1, got {}", a.child_path(key), v);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// EarlyStopping

void EarlyStopping::on_fit_start(Trainer& t) {
  check_monitor(t, o_.monitor, "EarlyStopping", o_.monitor_key);
  // Validation only at the end of fit (the default eval_frequency) leaves nothing to stop.
  if (t.fit_validates() && t.loop().eval_frequency <= 0 && cstorch::distributed::is_main_process())
    fmt::print(stderr,
               "warning: EarlyStopping watches '{}', but loop.eval_frequency is 0: validation "
               "runs only when training ends, so it cannot stop training early (set "
               "trainer.init.loop.eval_frequency)\n",
               o_.monitor);
  in_fit_ = true;
  wait_ = 0;
  best_ = std::numeric_limits<double>::quiet_NaN();
}

void EarlyStopping::on_validate_end(Trainer& t) {
  // A validate() outside fit() does not count.
  if (!in_fit_) return;
  const double v = monitored(t, o_.monitor, "EarlyStopping");
  if (better(o_.mode, v, best_, o_.min_delta)) {
    best_ = v;
    wait_ = 0;
    return;
  }
  if (++wait_ >= o_.patience)
    t.request_stop(fmt::format(
        "EarlyStopping: {} did not improve by more than {} ({}) for {} validation{} (best {:.6g})",
        o_.monitor, o_.min_delta, mode_name(o_.mode), wait_, wait_ == 1 ? "" : "s", best_));
}

// ---------------------------------------------------------------------------------------------
// KeepBestCheckpoints

void KeepBestCheckpoints::on_train_start(Trainer& t) {
  check_monitor(t, o_.monitor, "KeepBestCheckpoints", o_.monitor_key);
  active_ = true;
  best_.clear();
  dropped_.clear();
  // A resumed run continues the ranking of the checkpoints that are still there and not
  // past the step it resumed from.
  fs::path index = fs::path(t.model_dir()) / "best_checkpoints.json";
  std::error_code ec;
  if (!fs::exists(index, ec)) return;
  Config doc;
  try {
    doc = cstorch::load_config_file(index.string());
  } catch (const cstorch::Error& e) {
    cstorch::fail("KeepBestCheckpoints: {}", e.what());
  }
  if (!doc.is_object() || doc.value("monitor", "") != o_.monitor ||
      doc.value("mode", "") != mode_name(o_.mode) || !doc.contains("best"))
    return;  // another ranking: start afresh
  for (const auto& e : doc["best"]) {
    Entry x{e.value("step", int64_t{0}), e.value("path", std::string()), e.value("value", 0.0),
            e.value("created", false)};
    if (x.step <= t.global_step() && fs::exists(x.path, ec)) {
      best_.push_back(x);
      t.pin_checkpoint(x.path, true);
    }
  }
}

void KeepBestCheckpoints::on_fit_end(Trainer& t) {
  if (active_) delete_dropped(t);
  active_ = false;
}

void KeepBestCheckpoints::on_validate_end(Trainer& t) {
  if (!active_) return;
  const double v = monitored(t, o_.monitor, "KeepBestCheckpoints");
  const int64_t step = t.global_step();
  const std::string path =
      (fs::path(t.model_dir()) / fmt::format("checkpoint_{}.mdl", step)).string();
  for (const auto& e : best_)
    if (e.step == step) return;  // ranked already (a repeated validation of this step)
  // The place it would take: after every entry at least as good (earlier steps win ties).
  auto pos = std::find_if(best_.begin(), best_.end(),
                          [&](const Entry& e) { return better(o_.mode, v, e.value); });
  if (pos - best_.begin() >= o_.k) return;  // not among the best k
  if (std::isnan(v)) return;
  bool created = false;
  // Pinned before it is written, so keep_last's pruning at this save already spares it.
  t.pin_checkpoint(path, true);
  // Decided from the Trainer's own record (the same on every replica), not from the files
  // (only rank 0 writes them, so other replicas could see a file still being written).
  if (t.last_saved_step() != step) {
    t.save_checkpoint();  // collective with several replicas: every replica gets here
    created = true;
  }
  best_.insert(pos, Entry{step, path, v, created});
  while (static_cast<int64_t>(best_.size()) > o_.k) {
    Entry out = best_.back();
    best_.pop_back();
    t.pin_checkpoint(out.path, false);
    if (out.created) dropped_.push_back(out.path);
  }
  delete_dropped(t);
  write_index(t);
}

// Deletes the dropped checkpoints this callback wrote, except the newest in model_dir (a
// resumed run's starting point), which waits for a later call.
void KeepBestCheckpoints::delete_dropped(Trainer& t) {
  if (!cstorch::distributed::is_main_process()) {
    dropped_.clear();
    return;
  }
  auto all = t.checkpoints();
  const std::string newest = all.empty() ? "" : fs::path(all.back().second).filename().string();
  std::vector<std::string> keep;
  for (const auto& p : dropped_) {
    if (fs::path(p).filename().string() == newest) {
      keep.push_back(p);
      continue;
    }
    std::error_code ec;
    fs::remove(p, ec);
  }
  dropped_ = std::move(keep);
}

void KeepBestCheckpoints::write_index(Trainer& t) const {
  if (!cstorch::distributed::is_main_process()) return;
  Config list = Config::array();
  for (const auto& e : best_)
    list.push_back(
        {{"step", e.step}, {"path", e.path}, {"value", e.value}, {"created", e.created}});
  Config doc = {{"monitor", o_.monitor}, {"mode", mode_name(o_.mode)}, {"best", list}};
  fs::path file = fs::path(t.model_dir()) / "best_checkpoints.json";
  fs::path tmp = file;
  tmp += ".tmp";
  {
    std::ofstream o(tmp);
    o << doc.dump(2) << "\n";
    CS_CHECK(o.good(), "KeepBestCheckpoints: cannot write '{}'", tmp.string());
  }
  fs::rename(tmp, file);
}

// ---------------------------------------------------------------------------------------------
// LRMonitor and GradNormLogger: values computed in the traced step, read in step closures.

void LRMonitor::on_before_forward(Trainer& t, const cstorch::Batch&) {
  if (!t.optimizer()) return;
  auto& groups = t.optimizer()->param_groups();
  groups_ = groups.size();
  // The rate this step uses (a new node: the scheduler rebinds the lr tensor later in the step).
  for (size_t i = 0; i < groups.size(); ++i)
    t.add_step_output(fmt::format("lr/group_{}", i), groups[i].lr * 1.0);
}

void LRMonitor::on_train_batch_end(Trainer& t, const cstorch::Tensor&, int64_t step) {
  if (step % every_ != 0 || groups_ == 0) return;
  std::vector<cstorch::Tensor> lrs;
  for (size_t i = 0; i < groups_; ++i) lrs.push_back(t.step_output(fmt::format("lr/group_{}", i)));
  Trainer* tp = &t;
  cstorch::step_closure([tp, step](const std::vector<cstorch::Tensor>& v) {
    Scalars s;
    for (size_t i = 0; i < v.size(); ++i)
      s[fmt::format("lr/group_{}", i)] = static_cast<double>(v[i].item<float>());
    tp->log_metrics(step, s);
  })(lrs);
}

void GradNormLogger::on_before_optimizer_step(Trainer& t) {
  cstorch::Tensor sq;
  for (const auto& p : t.model().parameters()) {
    cstorch::Tensor g = p.grad();
    if (!g.defined()) continue;
    cstorch::Tensor s = (g * g).sum();
    sq = sq.defined() ? sq + s : s;
  }
  if (!sq.defined()) return;
  cstorch::Tensor norm = cstorch::sqrt(sq);
  // Loss scaling multiplies every gradient by the scale: report the true gradients' norm.
  if (auto* gs = t.grad_scaler(); gs && gs->enabled()) norm = norm / gs->loss_scale();
  t.add_step_output("grad_norm", norm);
}

void GradNormLogger::on_train_batch_end(Trainer& t, const cstorch::Tensor&, int64_t step) {
  if (step % every_ != 0 || !t.has_step_output("grad_norm")) return;
  Trainer* tp = &t;
  cstorch::step_closure([tp, step](const cstorch::Tensor& n) {
    tp->log_metrics(step, {{"grad_norm", static_cast<double>(n.item<float>())}});
  })(t.step_output("grad_norm"));
}

// ---------------------------------------------------------------------------------------------
// Registration

MODELZOO_REGISTER(callbacks, "EarlyStopping", [](const ConfigView& a) -> CallbackPtr {
  a.check_keys({"monitor", "mode", "patience", "min_delta"});
  EarlyStopping::Options o;
  o.monitor = a.get_string("monitor", o.monitor);
  o.monitor_key = a.child_path("monitor");
  o.mode = parse_mode(a);
  o.patience = positive_int(a, "patience", o.patience);
  o.min_delta = a.get_double("min_delta", 0.0);
  if (!(o.min_delta >= 0))
    cstorch::fail("{}: must be 0 or more, got {}", a.child_path("min_delta"), o.min_delta);
  return std::make_shared<EarlyStopping>(o);
});

MODELZOO_REGISTER(callbacks, "KeepBestCheckpoints", [](const ConfigView& a) -> CallbackPtr {
  a.check_keys({"monitor", "mode", "k"});
  KeepBestCheckpoints::Options o;
  o.monitor = a.get_string("monitor", o.monitor);
  o.monitor_key = a.child_path("monitor");
  o.mode = parse_mode(a);
  o.k = positive_int(a, "k", o.k);
  return std::make_shared<KeepBestCheckpoints>(o);
});

MODELZOO_REGISTER(callbacks, "LRMonitor", [](const ConfigView& a) -> CallbackPtr {
  a.check_keys({"every_n_steps"});
  return std::make_shared<LRMonitor>(positive_int(a, "every_n_steps", 1));
});

MODELZOO_REGISTER(callbacks, "GradNormLogger", [](const ConfigView& a) -> CallbackPtr {
  a.check_keys({"every_n_steps"});
  return std::make_shared<GradNormLogger>(positive_int(a, "every_n_steps", 1));
});

}  // namespace modelzoo
