// The run record (model_dir/run_records/run_NNNN.yaml) and the console header and summary of
// fit() and validate().
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cstorch/distributed.h"
#include "cstorch/version.h"
#include "modelzoo/overrides.h"
#include "modelzoo/trainer.h"
#include "modelzoo/trainer/core_callbacks.h"
#include "modelzoo/trainer/trainer_impl.h"

namespace modelzoo {

namespace fs = std::filesystem;

std::vector<std::string>& command_line_store() {
  static std::vector<std::string> argv;
  return argv;
}

void set_run_command_line(std::vector<std::string> argv) {
  command_line_store() = std::move(argv);
}

const std::vector<std::string>& run_command_line() {
  return command_line_store();
}

namespace {

// "2026-11-25T11:30:00Z" (UTC, whole seconds).
std::string utc_now() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// A finite number as the shortest text that reads back to the same double; YAML's .nan/.inf
// otherwise.
std::string yaml_number(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  std::string s = fmt::format("{}", d);
  // "1e-05" and "3" read back as numbers too, but a float stays a float with a point.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// A key written plain when YAML reads it back as the same string: identifier-like and not one
// of YAML's words for booleans and null.
bool plain_key(const std::string& k) {
  static const std::regex ok("[A-Za-z_][A-Za-z0-9_./-]*");
  static const std::regex special("(?:y|n|yes|no|on|off|true|false|null)", std::regex::icase);
  return std::regex_match(k, ok) && !std::regex_match(k, special);
}

// Block-style YAML (lists of maps as "- key: ..."). Strings are written double-quoted (JSON
// escapes are valid YAML), so "1.0", "yes" or "null" stay strings when the record is read back.
template <class J>
void emit_yaml(const J& c, int indent, std::string& out) {
  const std::string pad(static_cast<size_t>(indent), ' ');
  auto scalar = [](const J& v) -> std::string {
    if (v.is_null()) return "null";
    if (v.is_boolean()) return v.template get<bool>() ? "true" : "false";
    if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
    if (v.is_number_float()) return yaml_number(v.template get<double>());
    if (v.is_object()) return "{}";
    if (v.is_array()) return "[]";
    return v.dump();  // a JSON string literal
  };
  auto nested = [](const J& v) { return (v.is_object() || v.is_array()) && !v.empty(); };
  if (c.is_object()) {
    for (const auto& [k, v] : c.items()) {
      out += pad + (plain_key(k) ? k : J(k).dump()) + ":";
      if (nested(v)) {
        out += "\n";
        // A list under a key sits at the key's indentation, as YAML allows.
        emit_yaml(v, v.is_array() ? indent : indent + 2, out);
      } else {
        out += " " + scalar(v) + "\n";
      }
    }
  } else if (c.is_array()) {
    for (const auto& v : c) {
      if (nested(v)) {
        std::string inner;
        emit_yaml(v, indent + 2, inner);
        // "- " takes the place of the first line's indentation.
        out += pad + "- " + inner.substr(static_cast<size_t>(indent) + 2);
      } else {
        out += pad + "- " + scalar(v) + "\n";
      }
    }
  } else {
    out += pad + scalar(c) + "\n";
  }
}

}  // namespace

void Trainer::RunRecord::write() const {
  std::string yaml;
  emit_yaml(doc, 0, yaml);
  fs::path tmp = file;
  tmp += fmt::format(".tmp-{}", ::getpid());
  {
    std::ofstream o(tmp);
    CS_CHECK(o.good(), "run record: cannot write '{}'", tmp.string());
    o << "# cstorch run record (written by the Trainer; one file per fit or validate call)\n"
      << yaml;
    CS_CHECK(o.good(), "run record: cannot write '{}'", tmp.string());
  }
  fs::rename(tmp, file);
}

// A new record: the next free number in model_dir/run_records (an earlier run's records,
// a resumed run's included, are never overwritten).
void Trainer::begin_run(const char* mode, const std::string& ckpt_path) {
  record_.reset();
  if (!cstorch::distributed::is_main_process()) {
    // Replicas other than the main one keep the bookkeeping but write nothing.
    record_ = std::make_unique<RunRecord>();
    record_->mode = mode;
    record_->t0 = std::chrono::steady_clock::now();
    record_->start_step = global_step_;
    return;
  }
  fs::path dir = fs::path(model_dir_) / "run_records";
  fs::create_directories(dir);
  static const std::regex re("run_([0-9]{1,9})\\.yaml");  // (longer: not a record of ours)
  int64_t next = 1;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (std::regex_match(name, m, re)) next = std::max<int64_t>(next, std::stoll(m[1].str()) + 1);
  }
  auto r = std::make_unique<RunRecord>();
  r->mode = mode;
  r->file = dir / fmt::format("run_{:04d}.yaml", next);
  r->t0 = std::chrono::steady_clock::now();
  r->start_step = global_step_;
  const auto& argv = run_command_line();
  auto& d = r->doc;
  d["run"] = next;
  d["mode"] = mode;
  d["status"] = "running";
  d["stop_reason"] = nullptr;
  d["start_time"] = utc_now();
  d["end_time"] = nullptr;
  d["host"] = host_name();
  d["command_line"] = argv.empty() ? Config() : Config(argv);
  d["cstorch_version"] = cstorch::version();
  d["git_commit"] = cstorch::git_commit();
  d["cpu_kernels"] = cstorch::cpu_kernels();
  d["seed"] = seed_;
  // What cszoo resolved the config from: the file and every override applied to it, in order
  // (absent for a Trainer built in code).
  if (const ResolvedRunConfig* rc = resolved_run_config()) {
    d["params_file"] = rc->params_file;
    d["overrides"] = rc->overrides;
  }
  d["ckpt_path"] = ckpt_path.empty() ? Config() : Config(ckpt_path);
  d["device"] = backend_->type_name();
  d["replicas"] = replicas_;
  // Filled in when the run ends (null while it runs or if it is killed).
  for (const char* k : {"wall_time_s", "start_step", "end_step", "final_train_loss",
                        "last_validation", "checkpoints_saved"})
    d[k] = nullptr;
  d["start_step"] = global_step_;
  d["config"] = run_config_;
  record_ = std::move(r);
  record_->write();
}

void Trainer::end_run(const char* status) {
  if (!record_) return;
  auto r = std::move(record_);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - r->t0).count();
  print_summary(r->mode, *r, wall, status);
  if (r->file.empty()) return;
  auto& d = r->doc;
  d["status"] = status;
  if (stop_requested_ && std::string(r->mode) == "fit")
    d["stop_reason"] = stop_reason_;
  else
    d.erase("stop_reason");
  d["end_time"] = utc_now();
  d["wall_time_s"] = std::round(wall * 1000) / 1000;
  d["start_step"] = r->start_step;
  d["end_step"] = global_step_;
  const double loss = last_train_loss();
  // A loss or metric that went NaN or infinite is written as the string "NaN", "Infinity" or
  // "-Infinity" (as the metrics files write it); null is a loss not logged yet.
  auto value = [](double v) {
    return std::isfinite(v) ? Config(v)
                            : Config(std::isnan(v) ? "NaN"
                                     : v > 0       ? "Infinity"
                                                   : "-Infinity");
  };
  const bool logged = std::isfinite(loss) || impl_->logging->saw_not_finite();
  if (std::string(r->mode) == "fit")
    d["final_train_loss"] = logged ? value(loss) : Config();
  else
    d.erase("final_train_loss");
  Config val = Config::object();
  for (const auto& [k, v] : last_val_) val[k] = value(v);
  d["last_validation"] = last_val_.empty() ? Config() : val;
  d["checkpoints_saved"] = r->checkpoints;
  try {
    r->write();
  } catch (const std::exception& e) {
    // The run itself has finished: a record that cannot be completed is reported, not fatal.
    fmt::print(stderr, "warning: {}\n", e.what());
  }
}

void Trainer::print_header(const char* mode, cstorch::utils::data::DataLoader* train,
                           cstorch::utils::data::DataLoader* val, int64_t total_steps) {
  if (!cstorch::distributed::is_main_process()) return;
  int64_t params = 0;
  for (const auto& p : model_->parameters()) params += p.numel();
  // Steps per epoch and the global batch size where the loader knows them. (Not batches x
  // batch size as samples: a last partial batch made that more than the data holds.)
  // (Gradient accumulation makes a training step of several batches; validation steps are
  // batches. The global batch is the configured one: the replicas' shares of an odd batch
  // differ, and the share times the replicas overstated it.)
  auto describe = [&](cstorch::utils::data::DataLoader* dl, bool training) {
    const int64_t n = dl->size();
    if (n < 0) return std::string("length unknown");
    const int64_t accum = training ? std::max<int64_t>(1, loop_.grad_accum_steps) : 1;
    std::string s = fmt::format("{} steps/epoch", n / accum);
    const Config& d = dl->data_description();
    const Config& a = dl->args();
    if (d.is_object() && d.contains("batch_size") && d["batch_size"].is_number_integer())
      s += fmt::format(", batch {}", d["batch_size"].get<int64_t>());
    else if (a.is_object() && a.contains("batch_size") && a["batch_size"].is_number_integer())
      s += fmt::format(", batch {}", a["batch_size"].get<int64_t>() * dl->num_replicas());
    return s;
  };
  std::string line = fmt::format(
      "== {}: model {}, {} parameters (cstorch {}, commit {}, CPU kernels {})", mode,
      impl_->model_name, params, cstorch::version(), cstorch::git_commit(), cstorch::cpu_kernels());
  fmt::print("{}\n", line);
  if (train) fmt::print("   train data: {}\n", describe(train, true));
  if (val) {
    std::string v = describe(val, false);
    if (loop_.eval_steps) v += fmt::format("; {} steps per validation", *loop_.eval_steps);
    fmt::print("   validation data: {}\n", v);
  }
  if (total_steps > 0)
    fmt::print("   steps: {} (global step {} -> {})\n", total_steps, global_step_,
               global_step_ + total_steps);
  fmt::print("   device {}, precision {}, threads {}, replicas {}\n", backend_->type_name(),
             precision_->describe(), cstorch::get_num_threads(), replicas_);
  if (record_ && !record_->file.empty())
    fmt::print("   model_dir {}, run record {}\n", model_dir_, record_->file.string());
  std::fflush(stdout);
}

void Trainer::print_summary(const char* mode, const RunRecord& r, double wall, const char* status) {
  if (!cstorch::distributed::is_main_process()) return;
  std::string s = fmt::format("== {} {}", mode, status);
  if (std::string(mode) == "fit") {
    const int64_t steps = global_step_ - r.start_step;
    s += fmt::format(": {} steps in {:.2f} s", steps, wall);
    if (steps > 0 && wall > 0) s += fmt::format(" ({:.1f} steps/s)", steps / wall);
    const double loss = last_train_loss();
    // NaN before the first logged step; a loss that went NaN or infinite is shown as such.
    if (std::isfinite(loss) || (steps > 0 && impl_->logging->saw_not_finite()))
      s += fmt::format("; final train loss {:.5f}", loss);
  } else {
    s += fmt::format(" in {:.2f} s", wall);
  }
  fmt::print("{}\n", s);
  if (!last_val_.empty()) {
    std::string v = fmt::format("   last validation (step {}):", validated_step_);
    for (const auto& [k, x] : last_val_) v += fmt::format(" {} {:.5f}", k, x);
    fmt::print("{}\n", v);
  }
  auto all = checkpoints();
  if (!all.empty())
    fmt::print("   checkpoints in {}: {} (latest {})\n", model_dir_, all.size(), all.back().second);
  if (!r.file.empty()) fmt::print("   run record {}\n", r.file.string());
  std::fflush(stdout);
}

}  // namespace modelzoo
