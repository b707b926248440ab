// The process-wide backend and compile().
#include "cstorch/backend.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "cstorch/config.h"
#include "cstorch/core/error.h"
#include "cstorch/distributed.h"
#include "ir/device.h"
#include "runtime/run_mode.h"

namespace cstorch {

namespace {
std::mutex g_mu;
std::shared_ptr<Backend> g_backend;

DeviceType parse_type(const std::string& s) {
  const std::string u = ascii_lower(s);
  if (u == "cpu") return DeviceType::CPU;
  if (u == "gpu") return DeviceType::GPU;
  if (u == "csx") return DeviceType::CSX;
  if (ir::plugin_named(u)) return DeviceType::Plugin;
  fail("backend: unknown device type '{}' (expected CSX, CPU or GPU{})", s,
       ir::find_device_backend(Device{DeviceType::Plugin, 0})
           ? fmt::format(", or the registered {}", ir::plugin_name())
           : "");
}

void validate(const ClusterConfig& c) {
  CS_CHECK(c.num_csx >= 1, "cluster_config.num_csx must be at least 1, got {}", c.num_csx);
  CS_CHECK(c.num_workers_per_csx >= 0, "cluster_config.num_workers_per_csx must be >= 0, got {}",
           c.num_workers_per_csx);
  CS_CHECK(c.max_wgt_servers >= 0, "cluster_config.max_wgt_servers must be >= 0, got {}",
           c.max_wgt_servers);
  CS_CHECK(std::isfinite(c.collective_timeout_s) && c.collective_timeout_s >= 0,
           "cluster_config.collective_timeout_s must be a positive number of seconds (0: the "
           "default), got {}",
           c.collective_timeout_s);
  CS_CHECK(c.transfer_processes >= 1,
           "cluster_config.transfer_processes must be at least 1, got {}", c.transfer_processes);
  // Job labels are key=value metadata (Kubernetes-label-like): key and value of at most 63
  // characters from [A-Za-z0-9._-], starting and ending with a letter or digit.
  auto label_part = [](const std::string& x) {
    if (x.empty() || x.size() > 63) return false;
    for (char ch : x)
      if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_' && ch != '-')
        return false;
    return std::isalnum(static_cast<unsigned char>(x.front())) &&
           std::isalnum(static_cast<unsigned char>(x.back()));
  };
  for (auto& l : c.job_labels) {
    auto eq = l.find('=');
    CS_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < l.size(),
             "cluster_config.job_labels: '{}' is not of the form key=value", l);
    CS_CHECK(label_part(l.substr(0, eq)) && label_part(l.substr(eq + 1)),
             "cluster_config.job_labels: '{}': key and value must be 1 to 63 characters of "
             "letters, digits, '.', '_' or '-', starting and ending with a letter or digit",
             l);
  }
  for (auto& d : c.mount_dirs) {
    std::error_code ec;
    CS_CHECK(std::filesystem::is_directory(d, ec),
             "cluster_config.mount_dirs: '{}' does not exist or is not a directory", d);
  }
  CS_CHECK(c.max_act_per_csx >= 1, "cluster_config.max_act_per_csx must be at least 1, got {}",
           c.max_act_per_csx);
}
}  // namespace

Backend::Backend(DeviceType type, BackendOptions opts) : type_(type), opts_(std::move(opts)) {
  // (Both set ran validate_only and was reported as compile_only.)
  CS_CHECK(!(opts_.compile_only && opts_.validate_only),
           "backend: compile_only and validate_only are mutually exclusive (compile_only "
           "compiles the steps without running them, validate_only only traces and checks "
           "them); set one");
  validate(opts_.cluster_config);
  device_ = Device{type_ == DeviceType::CSX ? DeviceType::CPU : type_, 0};
  if (type_ == DeviceType::GPU) {
    const int n = ir::device_count(DeviceType::GPU);
    if (n > 1) device_.index = distributed::local_rank() % n;
  }
  try {
    ir::device_backend(device());  // GPU without the CUDA backend: says how to build it
  } catch (const Error& e) {
    fail("backend: {}", e.what());
  }
}

std::shared_ptr<Backend> backend(const std::string& type, BackendOptions opts) {
  DeviceType t = parse_type(type);
  std::lock_guard<std::mutex> l(g_mu);
  if (g_backend) {
    if (g_backend->type() != t)
      fail(
          "Cannot instantiate multiple backends. A backend with type {} has already been "
          "instantiated.",
          g_backend->type_name());
    auto& cur = g_backend->options();
    std::vector<std::string> diff;
    if (cur.artifact_dir != opts.artifact_dir) diff.push_back("artifact_dir");
    if (cur.compile_dir != opts.compile_dir) diff.push_back("compile_dir");
    if (cur.compile_only != opts.compile_only) diff.push_back("compile_only");
    if (cur.validate_only != opts.validate_only) diff.push_back("validate_only");
    CS_CHECK(diff.empty(),
             "backend: a {} backend already exists with different arguments ({}); only "
             "cluster_config may change between uses",
             g_backend->type_name(), fmt::join(diff, ", "));
    validate(opts.cluster_config);
    cur.cluster_config = opts.cluster_config;
    return g_backend;
  }
  g_backend = std::make_shared<Backend>(t, std::move(opts));
  return g_backend;
}

namespace {
std::unique_ptr<ConfigureOptions> g_configured;
std::string g_model_dir;  // g_configured->model_dir, absolute

// Whether `dir` exists as a writable directory or could be created: its nearest existing
// ancestor is a directory this process may write into. Creates nothing.
bool writable_dir(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(dir, ec);
  if (ec) return false;
  while (!std::filesystem::exists(p, ec)) {
    if (!p.has_relative_path()) return false;
    p = p.parent_path();
  }
  return std::filesystem::is_directory(p, ec) && ::access(p.c_str(), W_OK | X_OK) == 0;
}

// configure()'s compile_dir: as given, except the default (or the site's,
// $CSTORCH_DEFAULT_COMPILE_DIR) where this process cannot write, which falls back to
// <model_dir>/cached_compile with one warning.
std::string resolve_compile_dir(const ConfigureOptions& o) {
  if (o.compile_dir != kDefaultCompileDir) return o.compile_dir;
  const char* site = std::getenv("CSTORCH_DEFAULT_COMPILE_DIR");
  const std::string preferred = site && *site ? site : kDefaultCompileDir;
  if (writable_dir(preferred)) return preferred;
  const std::string fallback = (std::filesystem::path(o.model_dir) / "cached_compile").string();
  if (distributed::is_main_process())
    std::fprintf(stderr,
                 "warning: the default compile_dir '%s' is not writable; compile artefacts go to "
                 "'%s' instead (set compile_dir to choose)\n",
                 preferred.c_str(), fallback.c_str());
  return fallback;
}
}  // namespace

std::shared_ptr<Backend> configure(const ConfigureOptions& o) {
  {
    std::lock_guard<std::mutex> l(g_mu);
    CS_CHECK(g_configured == nullptr,
             "configure: already called in this process; call it once, before the run");
  }
  CS_CHECK(o.checkpoint_steps >= 0, "configure: checkpoint_steps must be >= 0, got {}",
           o.checkpoint_steps);
  std::error_code ec;
  const std::filesystem::path model_dir = std::filesystem::absolute(o.model_dir, ec);
  CS_CHECK(!ec && !o.model_dir.empty(), "configure: model_dir '{}' is not a usable path",
           o.model_dir);
  BackendOptions b;
  // Model artefacts (the compile_only / validate_only reports) go under model_dir.
  b.artifact_dir =
      (std::filesystem::path(o.model_dir) / "cerebras_logs").lexically_normal().string();
  b.compile_dir = resolve_compile_dir(o);
  b.compile_only = o.compile_only;
  b.validate_only = o.validate_only;
  auto& c = b.cluster_config;
  c.num_csx = o.num_csx;
  c.max_wgt_servers = o.max_wgt_servers;
  c.mount_dirs = o.mount_dirs;
  c.python_paths = o.python_paths;
  c.transfer_processes = o.transfer_processes;
  c.num_workers_per_csx = o.num_workers_per_csx;
  c.job_labels = o.job_labels;
  c.max_act_per_csx = o.max_act_per_csx;
  c.mgmt_address = o.mgmt_address;
  auto be = backend("CSX", std::move(b));
  std::lock_guard<std::mutex> l(g_mu);
  g_configured = std::make_unique<ConfigureOptions>(o);
  g_model_dir = model_dir.lexically_normal().string();
  return be;
}

const ConfigureOptions* configured() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_configured.get();
}

namespace runtime {
RunMode current_run_mode() {
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_backend) return RunMode::Execute;
  const auto& o = g_backend->options();
  if (o.validate_only) return RunMode::ValidateOnly;
  if (o.compile_only) return RunMode::CompileOnly;
  return RunMode::Execute;
}

std::string configured_model_dir() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_model_dir;
}

std::string resolve_model_path(const std::string& path) {
  const std::string dir = configured_model_dir();
  if (dir.empty() || path.empty() || std::filesystem::path(path).is_absolute()) return path;
  return (std::filesystem::path(dir) / path).string();
}

std::string current_compile_dir() {
  std::lock_guard<std::mutex> l(g_mu);
  if (!g_backend || g_backend->type() != DeviceType::CSX) return std::string();
  return g_backend->options().compile_dir;
}

namespace {
thread_local bool t_has_step_device = false;
thread_local Device t_step_device;
}  // namespace

Device step_device() {
  if (t_has_step_device) return t_step_device;
  std::lock_guard<std::mutex> l(g_mu);
  return g_backend ? g_backend->device() : Device{};
}

StepDeviceScope::StepDeviceScope(Device d) : had_(t_has_step_device), prev_(t_step_device) {
  t_has_step_device = true;
  t_step_device = d;
}
StepDeviceScope::~StepDeviceScope() {
  t_has_step_device = had_;
  t_step_device = prev_;
}

std::string current_artifact_dir() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_backend ? g_backend->options().artifact_dir : BackendOptions{}.artifact_dir;
}
void reset_backend_for_tests() {
  std::lock_guard<std::mutex> l(g_mu);
  g_backend.reset();
  g_configured.reset();
  g_model_dir.clear();
}

}  // namespace runtime

std::shared_ptr<Backend> backend() {
  std::lock_guard<std::mutex> l(g_mu);
  CS_CHECK(g_backend != nullptr,
           "backend(): no backend has been created; call cstorch::backend(\"CPU\") first");
  return g_backend;
}

namespace detail {
// The current backend, or null when none was created (DataLoader reads its worker count).
std::shared_ptr<Backend> existing_backend() {
  std::lock_guard<std::mutex> l(g_mu);
  return g_backend;
}
}  // namespace detail

CompiledModel compile(std::shared_ptr<nn::Module> model, std::shared_ptr<Backend> b) {
  CS_CHECK(model != nullptr, "compile: model is null");
  auto cur = backend();
  if (b && b != cur)
    fail("compile: the given {} backend is not the current backend ({})", b->type_name(),
         cur->type_name());
  model->to(cur->device());
  return CompiledModel(std::move(model), cur);
}

}  // namespace cstorch
