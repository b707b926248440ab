// modelzoo::Trainer: configuration, the fit / validate loops, and the checkpoint state.
#include "modelzoo/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>

#include "cstorch/amp.h"
#include "cstorch/checkpoint.h"
#include "cstorch/distributed.h"
#include "cstorch/metrics.h"
#include "cstorch/tensor.h"
#include "modelzoo/interrupt.h"
#include "modelzoo/trainer/core_callbacks.h"
#include "modelzoo/trainer/interrupt_scope.h"
#include "modelzoo/trainer/trainer_impl.h"

namespace modelzoo {

namespace fs = std::filesystem;
namespace data = cstorch::utils::data;
using cstorch::Batch;
using cstorch::State;
using cstorch::Tensor;

Registry<ModelPtr>& models() {
  static Registry<ModelPtr> r("model");
  return r;
}
Registry<DataLoaderPtr>& data_processors() {
  static Registry<DataLoaderPtr> r("data processor");
  return r;
}
Registry<CallbackPtr>& callbacks() {
  static Registry<CallbackPtr> r("callback");
  return r;
}
Registry<LoggerPtr>& loggers() {
  static Registry<LoggerPtr> r("logger");
  return r;
}

// The file a built-in file logger writes: its `file` argument, else model_dir/<default>.
static std::string logger_file(const ConfigView& a, const char* def) {
  return a.has("file") ? a.at("file").as_string()
                       : (fs::path(a.at("model_dir").as_string()) / def).string();
}

MODELZOO_REGISTER(loggers, "TensorBoard", [](const ConfigView& a) -> LoggerPtr {
  a.check_keys({"model_dir", "log_dir"});
  std::string dir = a.has("log_dir")
                        ? a.at("log_dir").as_string()
                        : (fs::path(a.at("model_dir").as_string()) / "tensorboard").string();
  return std::make_shared<TensorBoardLogger>(dir);
});
MODELZOO_REGISTER(loggers, "CSV", [](const ConfigView& a) -> LoggerPtr {
  a.check_keys({"model_dir", "file"});
  return std::make_shared<CSVLogger>(logger_file(a, "metrics.csv"));
});
MODELZOO_REGISTER(loggers, "JSONLines", [](const ConfigView& a) -> LoggerPtr {
  a.check_keys({"model_dir", "file"});
  return std::make_shared<JSONLinesLogger>(logger_file(a, "metrics.jsonl"));
});

// Runs `body`; a cstorch::Error from it is rethrown with `path: ` in front, for components
// (optimizers, schedulers) whose own errors do not know where in the YAML they were named.
template <class F>
static auto with_path(const std::string& path, F&& body) {
  try {
    return body();
  } catch (const cstorch::Error& e) {
    std::string msg = e.what();
    if (msg.rfind(path, 0) == 0) throw;
    cstorch::fail("{}: {}", path, msg);
  }
}

// ---------------------------------------------------------------------------------------------
// Configuration

static std::shared_ptr<cstorch::Backend> make_backend(const ConfigView& init) {
  const bool has_device = init.has("device"), has_backend = init.has("backend");
  if (has_device && has_backend) cstorch::fail("{}", kDeviceAndBackendError);
  if (has_backend) {
    ConfigView b = init.at("backend");
    b.check_keys({"backend_type", "cluster_config", "artifact_dir", "compile_dir", "compile_only",
                  "validate_only"});
    cstorch::BackendOptions o;
    o.artifact_dir = b.get_string("artifact_dir", o.artifact_dir);
    o.compile_dir = b.get_string("compile_dir", o.compile_dir);
    o.compile_only = b.get_bool("compile_only", false);
    o.validate_only = b.get_bool("validate_only", false);
    if (o.compile_only && o.validate_only)
      b.error(
          "compile_only and validate_only are mutually exclusive (compile_only compiles the "
          "steps without running them, validate_only only traces and checks them); set one "
          "(--compile_only and --validate_only set them from the command line)");
    if (b.has("cluster_config")) {
      ConfigView c = b.at("cluster_config");
      c.check_keys({"num_csx", "max_wgt_servers", "max_act_per_csx", "num_workers_per_csx",
                    "mount_dirs", "python_paths", "transfer_processes", "job_labels",
                    "mgmt_address", "collective_timeout_s"});
      auto& cc = o.cluster_config;
      cc.num_csx = static_cast<int>(c.get_int("num_csx", cc.num_csx));
      cc.max_wgt_servers = static_cast<int>(c.get_int("max_wgt_servers", cc.max_wgt_servers));
      cc.max_act_per_csx = static_cast<int>(c.get_int("max_act_per_csx", cc.max_act_per_csx));
      cc.num_workers_per_csx =
          static_cast<int>(c.get_int("num_workers_per_csx", cc.num_workers_per_csx));
      cc.transfer_processes =
          static_cast<int>(c.get_int("transfer_processes", cc.transfer_processes));
      if (c.has("mount_dirs")) cc.mount_dirs = c.at("mount_dirs").as_string_list();
      if (c.has("python_paths")) cc.python_paths = c.at("python_paths").as_string_list();
      if (c.has("job_labels")) cc.job_labels = c.at("job_labels").as_string_list();
      cc.mgmt_address = c.get_string("mgmt_address", cc.mgmt_address);
      if (c.has("collective_timeout_s")) {
        ConfigView t = c.at("collective_timeout_s");
        const double s = t.as_double();
        if (!(std::isfinite(s) && s > 0))
          t.error(fmt::format(
              "must be a positive number of seconds (how long a collective waits for the other "
              "replicas before the run stops), got {}",
              short_repr(t.value())));
        cc.collective_timeout_s = s;
      }
    }
    std::string type = b.at("backend_type").as_string();
    return with_path(b.path(), [&] { return cstorch::backend(type, o); });
  }
  std::string device = has_device ? init.at("device").as_string() : "CPU";
  return with_path(init.child_path("device"), [&] { return cstorch::backend(device); });
}

static LoopConfig parse_loop(const ConfigView& v) {
  LoopConfig l;
  if (v.is_null()) return l;
  v.check_keys({"num_steps", "max_steps", "num_epochs", "steps_per_epoch", "eval_frequency",
                "eval_steps", "grad_accum_steps"});
  l.num_steps = v.get_opt_int("num_steps");
  l.max_steps = v.get_opt_int("max_steps");
  l.num_epochs = v.get_opt_int("num_epochs");
  l.steps_per_epoch = v.get_opt_int("steps_per_epoch");
  l.eval_frequency = v.get_int("eval_frequency", 0);
  l.eval_steps = v.get_opt_int("eval_steps");
  l.grad_accum_steps = v.get_int("grad_accum_steps", 1);
  auto positive = [&](const char* key, std::optional<int64_t> x) {
    if (x && *x < 1) cstorch::fail("{}: must be at least 1, got {}", v.child_path(key), *x);
  };
  positive("num_steps", l.num_steps);
  positive("max_steps", l.max_steps);
  positive("num_epochs", l.num_epochs);
  positive("steps_per_epoch", l.steps_per_epoch);
  positive("eval_steps", l.eval_steps);
  positive("grad_accum_steps", l.grad_accum_steps);
  if (l.eval_frequency < 0)
    cstorch::fail("{}: must be 0 or more, got {}", v.child_path("eval_frequency"),
                  l.eval_frequency);
  if (l.num_steps && l.num_epochs)
    cstorch::fail("{}: num_epochs and num_steps are mutually exclusive", v.path());
  return l;
}

static CheckpointConfig parse_checkpoint(const ConfigView& v) {
  CheckpointConfig c;
  if (v.is_null()) return c;
  v.check_keys(
      {"steps", "autoload_last_checkpoint", "save_initial_checkpoint", "keep_last", "save_at_end"});
  c.steps = v.get_int("steps", 0);
  if (c.steps < 0) cstorch::fail("{}: must be 0 or more, got {}", v.child_path("steps"), c.steps);
  c.autoload_last_checkpoint = v.get_bool("autoload_last_checkpoint", true);
  c.save_initial_checkpoint = v.get_bool("save_initial_checkpoint", false);
  c.keep_last = v.get_int("keep_last", 0);
  c.save_at_end = v.get_bool("save_at_end", true);
  if (c.keep_last < 0)
    cstorch::fail("{}: must be 0 or more, got {}", v.child_path("keep_last"), c.keep_last);
  return c;
}

Trainer::Trainer(const ConfigView& init) : Trainer(init, nullptr) {}

namespace {

// How a run that was not stopped ended: a compile_only / validate_only run prepared its steps
// and ran none, which "completed" misreported (a finished training with no steps and no loss).
const char* finished_status(const cstorch::BackendOptions& bo) {
  return bo.compile_only ? "compiled only" : bo.validate_only ? "validated only" : "completed";
}

// A pending data position that cannot be restored: the checkpoint's replica count is another.
constexpr const char* kReplicaMismatchKey = "replica count mismatch";

const std::vector<std::string> kInitKeys = {
    "device",    "backend", "model_dir",  "seed",    "model",     "optimizer", "schedulers",
    "precision", "loop",    "checkpoint", "logging", "callbacks", "loggers",   "cs_ip"};

void check_logging(const ConfigView& l) {
  l.check_keys({"log_steps", "progress", "progress_every", "plot"});
  const int64_t log_steps = l.get_int("log_steps", 1);
  if (log_steps < 1)
    cstorch::fail("{}: must be at least 1, got {}", l.child_path("log_steps"), log_steps);
  if (l.get_bool("progress", true) && l.get_int("progress_every", 100) < 0)
    cstorch::fail("{}: must be 0 or more, got {}", l.child_path("progress_every"),
                  l.get_int("progress_every", 100));
  (void)l.get_bool("plot", true);
}
}  // namespace

void Trainer::check_init_config(const ConfigView& init) {
  init.expect_map();
  init.check_keys(kInitKeys);
  if (init.has("model_dir")) (void)init.get_string("model_dir", "");
  if (init.has("seed")) (void)init.get_int("seed", 0);
  (void)parse_loop(init.has("loop") ? init.at("loop") : ConfigView(Config(), ""));
  (void)parse_checkpoint(init.has("checkpoint") ? init.at("checkpoint") : ConfigView(Config(), ""));
  if (init.has("logging")) check_logging(init.at("logging"));
}

Trainer::Trainer(const ConfigView& init, std::shared_ptr<cstorch::Backend> backend)
    : impl_(std::make_unique<Impl>()) {
  init.check_keys(kInitKeys);
  const bool code_form = backend != nullptr;  // (`backend` is moved from below)
  if (backend) {
    // A backend object (the code form): its cluster_config as it is now, so a change between
    // two Trainers takes effect.
    if (init.has("device") || init.has("backend")) cstorch::fail("{}", kDeviceAndBackendError);
    backend_ = std::move(backend);
  } else {
    backend_ = make_backend(init);
  }
  model_dir_ = init.get_string("model_dir", "./model_dir");
  {
    // Said here with its key (the first logger to create it said only that it could not).
    std::error_code ec;
    if (fs::exists(model_dir_, ec) && !fs::is_directory(model_dir_, ec))
      cstorch::fail("{}: '{}' exists and is not a directory", init.child_path("model_dir"),
                    model_dir_);
  }
  // Where this trainer's compile_only / validate_only reports go: the YAML backend's
  // artifact_dir, else MODEL_DIR/cerebras_logs; a backend object keeps its own (tested on the
  // moved-from argument, it never did).
  if (code_form)
    impl_->artifact_dir = backend_->options().artifact_dir;
  else if (init.has("backend") && init.at("backend").has("artifact_dir"))
    impl_->artifact_dir = init.at("backend").at("artifact_dir").as_string();
  else
    impl_->artifact_dir = (fs::path(model_dir_) / "cerebras_logs").string();
  cs_ip_ = init.get_string("cs_ip", "");
  seed_ = static_cast<uint64_t>(init.get_int("seed", 0));
  loop_ = parse_loop(init.has("loop") ? init.at("loop") : ConfigView(Config(), ""));
  ckpt_ =
      parse_checkpoint(init.has("checkpoint") ? init.at("checkpoint") : ConfigView(Config(), ""));
  int64_t progress_every = 100;
  bool plot = true;
  if (init.has("logging")) {
    ConfigView l = init.at("logging");
    check_logging(l);
    logging_.log_steps = l.get_int("log_steps", 1);
    progress_every = l.get_bool("progress", true) ? l.get_int("progress_every", 100) : 0;
    plot = l.get_bool("plot", true);
  }
  // Loggers: the configured list, else a JSON-lines metrics file and TensorBoard events.
  auto multi = std::make_shared<MultiLogger>();
  std::string metrics_file;
  {
    Config list = init.has("loggers") ? init.at("loggers").value()
                                      : Config::array({"JSONLines", "TensorBoard"});
    ConfigView lv(list, init.child_path("loggers"));
    // Multi-replica: only the main process (world rank 0) logs; the others validate the
    // entries but open no files. Nor does a compile_only / validate_only run, which logs
    // nothing (it left an empty metrics file and event folder).
    const bool main = cstorch::distributed::is_main_process();
    const bool dry_run = backend_->options().compile_only || backend_->options().validate_only;
    for (size_t i = 0; i < lv.size(); ++i) {
      auto [name, args] = lv.at(i).named_entry();
      if (!args.contains("model_dir")) args["model_dir"] = model_dir_;
      ConfigView av(args, lv.at(i).child_path(name));
      if (!main || dry_run) {
        av.check_keys({"model_dir", "file", "log_dir"});
        continue;
      }
      multi->add(::modelzoo::loggers().create(name, av, lv.at(i).path()));
      if (metrics_file.empty() &&
          (cstorch::ascii_lower(name) == "jsonlines" || cstorch::ascii_lower(name) == "csv"))
        metrics_file =
            logger_file(av, cstorch::ascii_lower(name) == "csv" ? "metrics.csv" : "metrics.jsonl");
    }
  }

  impl_->loggers = multi;
  run_config_ = Config::object();
  run_config_["init"] = init.value();
  // The model, built after seeding so its initial weights depend on `seed` only.
  cstorch::manual_seed(seed_);
  ConfigView mv = init.at("model");
  mv.expect_map();
  std::string model_name = mv.at("name").as_string();
  impl_->model_name = model_name;
  Config model_args = mv.value();
  model_args.erase("name");
  ConfigView margs(model_args, mv.path());
  const auto before = cstorch::metrics::live_metrics();
  model_ = models().create(model_name, margs, mv.child_path("name"));
  for (auto* m : cstorch::metrics::live_metrics())
    if (std::find(before.begin(), before.end(), m) == before.end())
      impl_->model_metrics.push_back(m);
  cstorch::compile(std::static_pointer_cast<cstorch::nn::Module>(model_), backend_);

  setup_replicas();
  if (init.has("optimizer")) {
    ConfigView ov = init.at("optimizer");
    auto [name, args] = ov.named_entry();
    std::vector<Tensor> params = model_->parameters();
    if (!shard_params_.empty()) {
      std::vector<Tensor> mine;
      for (int64_t i : shard_params_) mine.push_back(params[static_cast<size_t>(i)]);
      params = std::move(mine);
    }
    optimizer_ = with_path(ov.child_path(name), [&, &name = name, &args = args] {
      return cstorch::optim::configure_optimizer(name, params, args);
    });
  }
  if (init.has("schedulers")) {
    ConfigView sv = init.at("schedulers");
    CS_CHECK(optimizer_ != nullptr, "{}: schedulers need trainer.init.optimizer", sv.path());
    // Errors name the key path of the offending value, as for every other key.
    auto add = [&](const Config& form, const std::string& path) {
      schedulers_.push_back(with_path(
          path, [&] { return cstorch::optim::configure_lr_scheduler(*optimizer_, form, path); }));
      scheduler_paths_.push_back(path);
    };
    // `{Name: {args}}` entries become configure_lr_scheduler's `{scheduler: Name, args...}`
    // form (at the arguments' key path); that form itself (a map with `scheduler`, or a list
    // of them, as in legacy params files) is passed through.
    // `{SequentialLR: {schedulers: [{Name: {args}}, ...]}}` (each runs its total_iters, then
    // the next) and `{ChainedLR: {schedulers: [...]}}` (all at once, multiplied) become the
    // seed-001 list form.
    auto add_entry = [&](const ConfigView& e) {
      if (e.value().is_object() && e.value().contains("scheduler")) return add(e.value(), e.path());
      auto [name, args] = e.named_entry();
      const std::string lower = cstorch::ascii_lower(name);
      if (lower == "sequentiallr" || lower == "chainedlr") {
        ConfigView a = e.at(name);
        a.check_keys({"schedulers"});
        ConfigView list = a.at("schedulers");
        if (!list.value().is_array() || list.size() == 0)
          list.error("expected a list of {SchedulerName: {arguments}}");
        Config forms = Config::array();
        for (size_t i = 0; i < list.size(); ++i) {
          auto [sub, sub_args] = list.at(i).named_entry();
          Config f = sub_args;
          f["scheduler"] = sub;
          if (lower == "chainedlr") f["main_scheduler"] = "ChainedLR";
          forms.push_back(f);
        }
        return add(forms, list.path());
      }
      Config form = args;
      form["scheduler"] = name;
      add(form, e.child_path(name));
    };
    const Config& v = sv.value();
    const bool seed_form =
        (v.is_object() && v.contains("scheduler")) ||
        (v.is_array() && !v.empty() && v[0].is_object() && v[0].contains("scheduler"));
    if (v.is_number() || seed_form) {
      add(v, sv.path());
    } else if (v.is_object()) {
      add_entry(sv);
    } else {
      for (size_t i = 0; i < sv.size(); ++i) add_entry(sv.at(i));
    }
    // Two schedulers of one hyper-parameter would each overwrite it every step (the last one
    // listed winning: a warm-up before a decay never ran).
    for (size_t i = 0; i < schedulers_.size(); ++i)
      for (size_t j = 0; j < i; ++j)
        if (schedulers_[i]->param_group_key() == schedulers_[j]->param_group_key())
          sv.error(fmt::format(
              "entries {} and {} both drive '{}', and each would overwrite the other every "
              "step; to run one after the other, list them under one entry: "
              "{{SequentialLR: {{schedulers: [...]}}}} (each runs its total_iters), or to "
              "multiply them, {{ChainedLR: {{schedulers: [...]}}}}",
              j, i, schedulers_[i]->param_group_key()));
  }
  if (!cstorch::distributed::is_main_process()) progress_every = 0, plot = false;
  // Core callbacks first (logging, checkpointing), then the user's, in the order given.
  precision_ = std::make_shared<PrecisionCallback>(
      init.has("precision") ? init.at("precision")
                            : ConfigView(Config(), init.child_path("precision")));
  impl_->core.push_back(precision_);
  impl_->logging = std::make_shared<LoggingCallback>(
      logging_.log_steps, multi, progress_every, metrics_file,
      plot ? (fs::path(model_dir_) / "loss_lr.png").string() : std::string());
  impl_->core.push_back(impl_->logging);
  impl_->core.push_back(std::make_shared<CheckpointCallback>());
  for (auto& c : impl_->core) callbacks_.push_back(c);
  if (init.has("callbacks")) {
    ConfigView cv = init.at("callbacks");
    for (size_t i = 0; i < cv.size(); ++i) {
      auto [name, args] = cv.at(i).named_entry();
      ConfigView av(args, cv.at(i).child_path(name));
      callbacks_.push_back(::modelzoo::callbacks().create(name, av, cv.at(i).path()));
    }
  }

  each([&](Callback& c) { c.pre_setup(*this); });
  each([&](Callback& c) { c.setup(*this); });
  each([&](Callback& c) { c.post_setup(*this); });
}

cstorch::amp::GradScaler* Trainer::grad_scaler() {
  return precision_->grad_scaler();
}

Trainer::~Trainer() {
  try {
    cstorch::synchronize();
  } catch (...) {
    // An execution error was already reported to the caller at its sync point.
  }
  for (auto& cb : callbacks_) {
    try {
      cb->finalize(*this);
    } catch (...) {
    }
  }
}

void Trainer::add_step_output(const std::string& name, const Tensor& value) {
  CS_CHECK(collecting_ != nullptr,
           "Trainer.add_step_output('{}'): call it from a hook inside the traced training step "
           "(on_before_forward ... on_after_scheduler_step)",
           name);
  for (const auto& [n, t] : *collecting_)
    CS_CHECK(n != name, "Trainer.add_step_output: '{}' was added twice in one step", name);
  collecting_->emplace_back(name, value);
}

bool Trainer::has_step_output(const std::string& name) const {
  return std::find(step_output_names_.begin(), step_output_names_.end(), name) !=
         step_output_names_.end();
}

const Tensor& Trainer::step_output(const std::string& name) const {
  auto it = std::find(step_output_names_.begin(), step_output_names_.end(), name);
  CS_CHECK(it != step_output_names_.end() && step_outputs_.size() == step_output_names_.size(),
           "Trainer.step_output: no step output '{}' (the step has: {})", name,
           step_output_names_.empty() ? std::string("none")
                                      : fmt::format("{}", fmt::join(step_output_names_, ", ")));
  return step_outputs_[static_cast<size_t>(it - step_output_names_.begin())];
}

void Trainer::log_metrics(int64_t step, const Scalars& metrics) {
  impl_->loggers->log_metrics(step, metrics);
}

double Trainer::last_train_loss() const {
  return impl_->logging->last_loss();
}

void Trainer::request_stop(const std::string& reason) {
  if (stop_requested_) return;
  stop_requested_ = true;
  stop_reason_ = reason;
}

namespace {

// checkpoint.keep_last: deletes all but the newest `keep_last` checkpoints of `all` (model_dir's,
// by step) up to `step` (0: keeps all). Pinned checkpoints (the best ones, by file name) neither
// count nor go, nor do those past `step`: they are another run's (this one resumed from an
// earlier checkpoint), and counting them as the newest deleted the checkpoint this run had
// started from.
void prune_checkpoints(std::vector<std::pair<int64_t, std::string>> all,
                       const std::vector<std::string>& pinned, int64_t keep_last, int64_t step) {
  if (keep_last <= 0 || step < 0 || !cstorch::distributed::is_main_process()) return;
  std::erase_if(all, [&](const auto& c) {
    return c.first > step || std::find(pinned.begin(), pinned.end(),
                                       fs::path(c.second).filename().string()) != pinned.end();
  });
  for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i].second, ec);
  }
}

}  // namespace

void Trainer::pin_checkpoint(const std::string& path, bool pinned) {
  // By file name: the same file may be named through differently spelled model_dir paths.
  const std::string name = fs::path(path).filename().string();
  auto it = std::find(pinned_.begin(), pinned_.end(), name);
  if (pinned && it == pinned_.end()) pinned_.push_back(name);
  if (!pinned && it != pinned_.end()) {
    pinned_.erase(it);
    // Spared by keep_last while pinned: it counts again now (it may be one too many).
    prune_checkpoints(checkpoints(), pinned_, ckpt_.keep_last, last_saved_step_);
  }
}

void Trainer::add_callback(CallbackPtr cb) {
  cb->pre_setup(*this);
  cb->setup(*this);
  cb->post_setup(*this);
  callbacks_.push_back(std::move(cb));
}

// ---------------------------------------------------------------------------------------------
// Checkpoint state

State Trainer::state_dict() {
  cstorch::synchronize();
  return collect_state();
}

// The checkpoint state without waiting for pending steps: a checkpoint closure runs on the
// executor right after its step, so the state tensors hold that step's values.
State Trainer::collect_state() {
  State s = State::map();
  s.set("model", model_->state_dict().to_state());
  s.set("global_step", global_step_);
  s.set("rng_state", cstorch::rng_state());
  if (optimizer_) {
    State opt = optimizer_state();
    if (!opt.is_none()) s.set("optimizer", opt);
  }
  if (!schedulers_.empty()) {
    State list = State::list();
    for (auto& sched : schedulers_) list.push_back(sched->state_dict());
    s.set("schedulers", list);
  }
  each([&](Callback& c) { c.on_save_checkpoint(*this, s); });
  if (train_loader_) {
    // A loader whose sources cannot record their position is left out: a resumed run then
    // starts its data from the beginning (said once).
    State pos;
    try {
      pos = train_loader_->state_dict();
    } catch (const cstorch::Error& e) {
      if (!warned_loader_state_ && cstorch::distributed::is_main_process())
        fmt::print(stderr, "warning: checkpoints will not hold the data position: {}\n", e.what());
      warned_loader_state_ = true;
    }
    if (replicas_ > 1) {
      // Every replica reads its own shard of the data: keep each one's position.
      auto all = cstorch::distributed::gather_state(pos, 0);
      if (!all.empty() && !all[0].is_none()) {
        State list = State::list();
        for (auto& p : all) list.push_back(p);
        s.set("dataloader", State::map({{"replicas", list}}));
      }
    } else if (!pos.is_none()) {
      s.set("dataloader", pos);
    }
  }
  return s;
}

void Trainer::load_state_dict(const State& s) {
  cstorch::synchronize();
  CS_CHECK(s.is_map() && s.contains("model"),
           "Trainer.load_state_dict: the state has no 'model' entry (keys: {})",
           s.is_map() ? fmt::format("{}", fmt::join(s.keys(), ", ")) : s.repr());
  model_->load_state_dict(cstorch::nn::StateDict::from_state(s.at("model")));
  if (s.contains("rng_state")) cstorch::set_rng_state(s.at("rng_state").as_tensor());
  if (optimizer_ && s.contains("optimizer"))
    with_path("checkpoint 'optimizer'", [&] { load_optimizer_state(s.at("optimizer")); });
  if (s.contains("schedulers")) {
    const State& list = s.at("schedulers");
    CS_CHECK(list.is_list() && list.size() == schedulers_.size(),
             "checkpoint 'schedulers': {} entries for the {} configured schedulers",
             list.is_list() ? list.size() : 0, schedulers_.size());
    for (size_t i = 0; i < schedulers_.size(); ++i)
      with_path(fmt::format("checkpoint 'schedulers[{}]'", i),
                [&] { schedulers_[i]->load_state_dict(list[i]); });
  } else {
    // Schedulers the checkpoint's run did not have start here, at their first value: the
    // optimizer state just loaded had set its own lr, which the first resumed step then used.
    for (auto& sched : schedulers_) sched->load_state_dict(sched->state_dict());
  }
  if (s.contains("dataloader")) {
    // Another replica count is an error for training (fit raises it), not for validating the
    // weights: a checkpoint of 3 replicas could not be validated by one process.
    const State& d = s.at("dataloader");
    if (d.is_map() && d.contains("replicas")) {
      const State& list = d.at("replicas");
      if (list.is_list() && static_cast<int>(list.size()) == replicas_)
        pending_loader_state_ = list[static_cast<size_t>(cstorch::distributed::replica_rank())];
      else
        pending_loader_state_ = State::map(
            {{kReplicaMismatchKey,
              fmt::format("checkpoint 'dataloader': it holds the data positions of {} replicas, "
                          "this run has {}; resume with the replica count it was written with",
                          list.is_list() ? list.size() : 0, replicas_)}});
    } else if (replicas_ == 1) {
      pending_loader_state_ = d;
    } else {
      pending_loader_state_ = State::map(
          {{kReplicaMismatchKey,
            fmt::format("checkpoint 'dataloader': it holds the data position of 1 replica, this "
                        "run has {}; resume with the replica count it was written with",
                        replicas_)}});
    }
  }
  // The step last, once the rest loaded: a failed load left it at the checkpoint's, and the
  // failed run's summary counted its steps as trained ("5 steps in 0.00 s").
  if (s.contains("global_step")) global_step_ = s.at("global_step").as_int();
  each([&](Callback& c) { c.on_load_checkpoint(*this, s); });
}

std::vector<std::pair<int64_t, std::string>> Trainer::checkpoints() const {
  std::vector<std::pair<int64_t, std::string>> r;
  std::error_code ec;
  if (!fs::is_directory(model_dir_, ec)) return r;
  // At most 18 digits: a longer number is no step of this project's (it would not fit int64).
  static const std::regex re("checkpoint_([0-9]{1,18})\\.mdl");
  for (const auto& e : fs::directory_iterator(model_dir_)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (e.is_regular_file() && std::regex_match(name, m, re))
      r.push_back({std::stoll(m[1].str()), e.path().string()});
  }
  std::sort(r.begin(), r.end());
  return r;
}

namespace {
// Saves killed mid-write leave their temporary files (".checkpoint_N.mdl.tmp-PID-N") in
// model_dir: the main process removes those whose writer no longer runs.
void remove_stale_temp_checkpoints(const std::string& model_dir) {
  if (!cstorch::distributed::is_main_process()) return;
  std::error_code ec;
  if (!fs::is_directory(model_dir, ec)) return;
  int n = cstorch::remove_stale_checkpoint_temp_files(model_dir);
  if (n > 0)
    fmt::print("removed {} temporary checkpoint file{} left in {} by interrupted saves\n", n,
               n == 1 ? "" : "s", model_dir);
}
}  // namespace

std::string Trainer::write_checkpoint(int64_t step, State state) {
  // On every replica, so that decisions made from it (an early stop's checkpoint, the best
  // checkpoints) agree and the collective state gathering stays in step.
  last_saved_step_ = step;
  if (!cstorch::distributed::is_main_process()) return std::string();  // rank 0 writes
  fs::create_directories(model_dir_);
  std::string path = (fs::path(model_dir_) / fmt::format("checkpoint_{}.mdl", step)).string();
  cstorch::save(state, path);
  fmt::print("saved checkpoint {}\n", path);
  std::fflush(stdout);
  if (record_) record_->checkpoints.push_back(path);
  prune_checkpoints(checkpoints(), pinned_, ckpt_.keep_last, step);
  return path;
}

std::string Trainer::save_checkpoint() {
  cstorch::synchronize();
  return write_checkpoint(global_step_, collect_state());
}

void Trainer::load_checkpoint(const std::string& path) {
  cstorch::synchronize();
  State s = cstorch::load(path);  // its errors name the file
  try {
    load_state_dict(s);
  } catch (const std::exception& e) {
    // A mismatch found here names the key, not the file.
    cstorch::fail("checkpoint {}: {}", path, e.what());
  }
  if (cstorch::distributed::is_main_process())
    fmt::print("loaded checkpoint {} (step {})\n", path, global_step_);
}

// ---------------------------------------------------------------------------------------------
// Replicas (multi-replica data parallel)

void Trainer::setup_replicas() {
  namespace dist = cstorch::distributed;
  cluster_ = backend_->options().cluster_config;
  const auto& cc = cluster_;
  // Replicas: the CSX backend's num_csx; on a GPU or plugin device, one per process of a
  // --multireplica launch (which sets num_csx to the launch's size), each on its own device.
  const auto type = backend_->type();
  const bool device_replicas =
      type == cstorch::DeviceType::GPU || type == cstorch::DeviceType::Plugin;
  replicas_ = type == cstorch::DeviceType::CSX || device_replicas ? cc.num_csx : 1;
  if (type == cstorch::DeviceType::CPU && cc.num_csx > 1 && dist::is_main_process())
    fmt::print(stderr,
               "warning: cluster_config.num_csx is {}, but the CPU backend trains one replica: "
               "num_csx is the CSX backend's replica count (backend_type: CSX, or --num_csx, "
               "for data-parallel replicas)\n",
               cc.num_csx);
  // The hung-replica watchdog of this trainer's collectives (0: the environment's or 300 s).
  dist::set_collective_timeout(cc.collective_timeout_s);
  participating_ = dist::set_num_replicas(replicas_);
  const int world = dist::world_size();
  if (world > replicas_ && dist::is_main_process())
    fmt::print(stderr,
               "warning: {} processes were launched but this trainer uses {} replica{}: ranks {} "
               "to {} sit it out (use --multireplica, or the CSX backend's num_csx)\n",
               world, replicas_, replicas_ == 1 ? "" : "s", replicas_, world - 1);
  if (replicas_ <= 1 || !participating_) return;
  // ZeRO-1: the optimizer state is split into shards of parameters, balanced by size (largest
  // first, each to the lightest shard). Replica r keeps shard r % shards.
  auto params = model_->parameters();
  int shards = cc.max_wgt_servers == 0 ? replicas_ : std::min(cc.max_wgt_servers, replicas_);
  shards = std::min<int>(shards, static_cast<int>(params.size()));
  num_shards_ = std::max(shards, 1);
  if (num_shards_ <= 1) return;
  std::vector<size_t> order(params.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params[a].numel() > params[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(num_shards_), 0);
  param_owner_.assign(params.size(), 0);
  for (size_t i : order) {
    auto s = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    param_owner_[i] = static_cast<int>(s);
    load[s] += params[i].numel();
  }
  const int mine = dist::replica_rank() % num_shards_;
  for (size_t i = 0; i < params.size(); ++i)
    if (param_owner_[i] == mine) shard_params_.push_back(static_cast<int64_t>(i));
}

// Inside the traced step, after this replica updated its shard: every parameter takes the
// value its shard's first replica computed (a sum in which the others contribute zeros, so it
// is exact).
void Trainer::sync_sharded_params() {
  namespace dist = cstorch::distributed;
  auto params = model_->parameters();
  const int r = dist::replica_rank();
  std::vector<Tensor> contrib;
  for (size_t i = 0; i < params.size(); ++i)
    contrib.push_back(r < num_shards_ && param_owner_[i] == r ? params[i]
                                                              : cstorch::zeros_like(params[i]));
  auto synced = dist::all_reduce(contrib, dist::ReduceOp::Sum);
  cstorch::NoGradGuard ng;
  for (size_t i = 0; i < params.size(); ++i) params[i].copy_(synced[i]);
}

// The optimizer's state_dict; sharded, the shards gathered on the main process and numbered
// by model parameter, so it is the state an unsharded optimizer would have (null elsewhere).
State Trainer::optimizer_state() {
  State local = optimizer_->state_dict();
  if (shard_params_.empty() && num_shards_ <= 1) return local;
  State st = State::map();
  const State& ls = local.at("state");
  for (const auto& k : ls.keys()) st.set(std::to_string(shard_params_.at(std::stoul(k))), ls.at(k));
  local.set("state", st);
  auto all = cstorch::distributed::gather_state(local, 0);
  if (all.empty()) return State();
  std::map<int64_t, State> by_param;
  for (int r = 0; r < num_shards_; ++r) {
    const State& shard = all[static_cast<size_t>(r)].at("state");
    for (const auto& k : shard.keys()) by_param[std::stoll(k)] = shard.at(k);
  }
  State merged = State::map();
  for (auto& [i, v] : by_param) merged.set(std::to_string(i), v);
  State groups = all[0].at("param_groups");
  CS_CHECK(groups.size() == 1, "sharded optimizer: {} parameter groups; one is supported",
           groups.size());
  State ids = State::list();
  for (size_t i = 0; i < param_owner_.size(); ++i) ids.push_back(static_cast<int64_t>(i));
  groups[0].set("params", ids);
  return State::map({{"state", merged}, {"param_groups", groups}});
}

void Trainer::load_optimizer_state(const State& full) {
  // The config's hyper-parameters, to say which ones the checkpoint's replace: a resumed
  // optimizer keeps its checkpoint's (as PyTorch's load_state_dict), and an lr given on the
  // command line for the resumed run was otherwise ignored without a word.
  std::vector<std::map<std::string, double>> configured;
  for (const auto& g : optimizer_->param_groups()) configured.push_back(g.options);
  load_optimizer_groups(full);
  std::set<std::string> scheduled;
  for (const auto& s : schedulers_) scheduled.insert(s->param_group_key());
  std::vector<std::string> changed;
  const auto& groups = optimizer_->param_groups();
  for (size_t gi = 0; gi < groups.size() && gi < configured.size(); ++gi)
    for (const auto& [k, v] : groups[gi].options) {
      // Compared as the f32 values the optimizer computes with (a checkpoint holds them so).
      auto it = configured[gi].find(k);
      const float now = static_cast<float>(v);
      if (it != configured[gi].end() && static_cast<float>(it->second) != now &&
          !scheduled.count(k))
        changed.push_back(fmt::format("{} {} (the config gives {}{})", k, now, it->second,
                                      groups.size() > 1 ? fmt::format(", group {}", gi) : ""));
    }
  if (!changed.empty() && cstorch::distributed::is_main_process())
    fmt::print(stderr,
               "warning: the checkpoint's optimizer state sets {}: a resumed optimizer keeps "
               "its checkpoint's hyper-parameters\n",
               fmt::join(changed, ", "));
}

void Trainer::load_optimizer_groups(const State& full) {
  if (shard_params_.empty() && num_shards_ <= 1) {
    optimizer_->load_state_dict(full);
    return;
  }
  CS_CHECK(full.is_map() && full.contains("state") && full.contains("param_groups"),
           "expected keys 'state' and 'param_groups', got {}", full.repr());
  const State& fs = full.at("state");
  State st = State::map();
  for (size_t j = 0; j < shard_params_.size(); ++j) {
    const std::string key = std::to_string(shard_params_[j]);
    if (fs.contains(key)) st.set(std::to_string(j), fs.at(key));
  }
  State groups = full.at("param_groups");
  CS_CHECK(groups.is_list() && groups.size() == 1,
           "param_groups: the sharded optimizer has one parameter group, the checkpoint {}",
           groups.is_list() ? groups.size() : 0);
  CS_CHECK(groups[0].is_map() && groups[0].contains("params") &&
               groups[0].at("params").size() == param_owner_.size(),
           "param_groups.0.params: the checkpoint's optimizer has {} parameters, the model {}",
           groups[0].is_map() && groups[0].contains("params") ? groups[0].at("params").size() : 0,
           param_owner_.size());
  State ids = State::list();
  for (size_t j = 0; j < shard_params_.size(); ++j) ids.push_back(static_cast<int64_t>(j));
  groups[0].set("params", ids);
  optimizer_->load_state_dict(State::map({{"state", st}, {"param_groups", groups}}));
}

// Validation on several replicas: each evaluates its share of the data; the loss sums, step
// counts and every live metric's state (all metric states are sums) are added up, so every
// replica reports the same combined numbers.
void Trainer::combine_validation(double& sum, double& weight) {
  if (replicas_ <= 1) return;
  namespace dist = cstorch::distributed;
  // Two f32 values carry the sum and the weight exactly enough (counts are exact to 2^24).
  auto v = dist::all_reduce(
               cstorch::from_vector(
                   std::vector<float>{static_cast<float>(sum), static_cast<float>(weight)}, {2}),
               dist::ReduceOp::Sum)
               .to_vector<float>();
  sum = v[0];
  weight = v[1];
  cstorch::NoGradGuard ng;
  for (auto* m : impl_->metrics())
    for (const auto& [name, t] : m->states())
      if (t.dtype() == cstorch::DType::f32) Tensor(t).copy_(dist::all_reduce(t));
}

// model_dir/run_metadata.json (main process): the backend, the launch and every
// cluster_config field, job labels included, and the CS system address (cs_ip, null when not
// given; recorded only: the replicas are this launch's processes).
void Trainer::write_run_metadata() {
  if (!cstorch::distributed::is_main_process()) return;
  const auto& o = backend_->options();
  const auto& c = cluster_;
  cstorch::Config labels = cstorch::Config::object();
  for (const auto& l : c.job_labels) {
    auto eq = l.find('=');
    labels[l.substr(0, eq)] = l.substr(eq + 1);
  }
  cstorch::Config meta = {{"backend", backend_->type_name()},
                          {"processes", cstorch::distributed::world_size()},
                          {"replicas", replicas_},
                          {"optimizer_shards", num_shards_},
                          // Where this trainer's reports go (the backend's own default
                          // was recorded, where none were written).
                          {"artifact_dir", impl_->artifact_dir},
                          {"compile_dir", o.compile_dir},
                          {"cluster_config",
                           {{"num_csx", c.num_csx},
                            {"max_wgt_servers", c.max_wgt_servers},
                            {"max_act_per_csx", c.max_act_per_csx},
                            {"num_workers_per_csx", c.num_workers_per_csx},
                            {"mount_dirs", c.mount_dirs},
                            {"python_paths", c.python_paths},
                            {"transfer_processes", c.transfer_processes},
                            {"job_labels", c.job_labels},
                            {"mgmt_address", c.mgmt_address},
                            {"collective_timeout_s", cstorch::distributed::collective_timeout()}}},
                          {"job_labels", labels},
                          {"cs_ip", cs_ip_.empty() ? cstorch::Config() : cstorch::Config(cs_ip_)}};
  fs::create_directories(model_dir_);
  std::ofstream(fs::path(model_dir_) / "run_metadata.json") << meta.dump(2) << "\n";
}

// ---------------------------------------------------------------------------------------------
// Loops

namespace {

// compile_only / validate_only: the reports in the artifact directory, to say which ones a
// step wrote (the runtime names them after the traced step and numbers them).
using FileTimes = std::map<std::string, fs::file_time_type>;

FileTimes artifact_files(const cstorch::Backend& b) {
  FileTimes r;
  std::error_code ec;
  for (fs::directory_iterator it(b.options().artifact_dir, ec), end; !ec && it != end;
       it.increment(ec))
    if (it->is_regular_file(ec)) r[it->path().string()] = it->last_write_time(ec);
  return r;
}

// Prints what a compile_only / validate_only pass over `step` did and where its report is.
void report_dry_run(const cstorch::Backend& b, const FileTimes& before, const char* step) {
  if (!cstorch::distributed::is_main_process()) return;
  std::vector<std::string> reports;
  for (const auto& [path, t] : artifact_files(b)) {
    auto it = before.find(path);
    if (it == before.end() || it->second != t) reports.push_back(path);
  }
  const bool compile = !b.options().validate_only;
  fmt::print(
      "{}: {} the {} step (nothing ran); report: {}\n", compile ? "compile_only" : "validate_only",
      compile ? "compiled" : "traced and checked", step,
      reports.empty() ? std::string("none written") : fmt::format("{}", fmt::join(reports, ", ")));
  std::fflush(stdout);
}

// A compile_only / validate_only pass of one trainer: the process's backend writes the reports
// to this trainer's artifact directory while it lasts. (The backend is shared by every trainer
// of the process and its other options must not change between uses, so the directory is
// switched only around the passes that write reports.)
class ArtifactDirScope {
 public:
  ArtifactDirScope(cstorch::Backend& b, const std::string& dir)
      : b_(b),
        prev_(b.options().artifact_dir),
        active_(b.options().compile_only || b.options().validate_only) {
    if (active_) b_.options().artifact_dir = dir;
  }
  ~ArtifactDirScope() {
    if (active_) b_.options().artifact_dir = prev_;
  }
  ArtifactDirScope(const ArtifactDirScope&) = delete;
  ArtifactDirScope& operator=(const ArtifactDirScope&) = delete;

 private:
  cstorch::Backend& b_;
  std::string prev_;
  bool active_;
};

}  // namespace

namespace {
// Continues the data where the checkpoint's run stopped. A checkpoint of other data (a phase or
// a fine-tuning run on another data set, another batch size or worker count) has a position
// this loader cannot take: the run then starts the data from its beginning, with a warning
// saying why, instead of refusing to run.
void restore_data_position(cstorch::utils::data::DataLoader& dl, const cstorch::State& saved) {
  std::optional<cstorch::State> fresh;
  try {
    fresh = dl.state_dict();  // the loader's start, to fall back on
  } catch (const std::exception&) {
    // A loader that cannot say its position: the checkpoint's is loaded, or its error raised.
  }
  try {
    with_path("checkpoint 'dataloader'", [&] {
      dl.load_state_dict(saved);
      (void)dl.size();  // starts the workers, which take their saved positions
    });
  } catch (const std::exception& e) {
    if (!fresh) throw;
    if (cstorch::distributed::is_main_process())
      fmt::print(stderr,
                 "warning: {}\nwarning: the data starts from its beginning: the checkpoint's data "
                 "position is of other data (another data set, batch size or number of workers)\n",
                 e.what());
    dl.load_state_dict(*fresh);
  }
}

void check_not_empty(cstorch::utils::data::DataLoader& dl, const char* what) {
  if (dl.size() != 0) return;
  const Config& a = dl.args();
  std::string bs;
  if (a.is_object() && a.contains("batch_size")) bs = " " + a["batch_size"].dump();
  // The causes this loader can have: its settings decide which (the message had named
  // drop_last for a validation loader that does not drop, and missed the worker count).
  std::vector<std::string> causes;
  const bool drops = a.is_object() && a.contains("drop_last") && a["drop_last"].is_boolean()
                         ? a["drop_last"].get<bool>()
                         : std::string(what) == "training";
  if (drops) causes.push_back(fmt::format("fewer samples than its batch_size{} (drop_last)", bs));
  if (dl.total_workers() > 1)
    causes.push_back(fmt::format("fewer samples than its {} workers{} need for a batch each",
                                 dl.total_workers(),
                                 dl.num_replicas() > 1 ? " (of all the replicas)" : ""));
  causes.push_back("no samples at all");
  std::string where;
  if (dl.num_replicas() > 1)
    where = fmt::format(" on replica {} of {}", dl.replica(), dl.num_replicas());
  cstorch::fail("the {} dataloader makes no batches{} (0 steps per epoch): its data has {}", what,
                where, fmt::join(causes, ", or "));
}
}  // namespace

void Trainer::fit(DataLoaderPtr train, DataLoaderPtr val, std::optional<std::string> ckpt_path) {
  CS_CHECK(train != nullptr, "Trainer.fit: a training dataloader is required");
  CS_CHECK(optimizer_ != nullptr, "Trainer.fit: trainer.init.optimizer is required for training");
  if (!participating_) return;  // a process beyond this trainer's replicas
  stop_requested_ = false;
  stop_reason_.clear();
  fit_validates_ = val != nullptr;
  bool interrupted = false;  // by a signal (include/modelzoo/interrupt.h)
  begin_run("fit", ckpt_path.value_or(""));
  try {
    remove_stale_temp_checkpoints(model_dir_);
    // Checkpoints of a later step than the one this run starts from: another run's.
    std::vector<std::pair<int64_t, std::string>> later_checkpoints;
    auto note_later_checkpoints = [&] {
      for (const auto& [step, path] : checkpoints())
        if (step > global_step_)
          later_checkpoints.emplace_back(step, fs::path(path).filename().string());
    };
    if (ckpt_path) {
      load_checkpoint(*ckpt_path);
      note_later_checkpoints();
    } else if (!ckpt_.autoload_last_checkpoint) {
      // A fresh start in a model_dir that holds another run's checkpoints: as for a resume
      // from an earlier checkpoint, they must not be written over.
      note_later_checkpoints();
    } else {
      auto found = checkpoints();
      if (!found.empty()) {
        try {
          load_checkpoint(found.back().second);
        } catch (const std::exception& e) {
          // The user may not know that this run resumes: say so, and how not to.
          cstorch::fail(
              "{} (fit resumes from the latest checkpoint in model_dir '{}'; another model_dir, "
              "--checkpoint_path or checkpoint.autoload_last_checkpoint: false starts otherwise)",
              e.what(), model_dir_);
        }
      }
    }

    // After the checkpoint the run resumes from is loaded (its on_load_checkpoint hooks ran):
    // global_step() is the step the run starts at. Inside the try: a callback's start-up
    // error (a monitor no validation reports) is a failed run, recorded as such and summed
    // up, not a run record left 'running'.
    each([&](Callback& c) { c.on_fit_start(*this); });
    // (Not for a run that is complete already: it reads no data.)
    const bool complete = loop_.max_steps && global_step_ >= *loop_.max_steps;
    if (pending_loader_state_ && pending_loader_state_->is_map() &&
        pending_loader_state_->contains(kReplicaMismatchKey)) {
      // The data positions of another replica count map to none of this run's. An implicit
      // resume (the latest checkpoint of model_dir) is refused; a checkpoint named explicitly
      // (fine-tuning, or going on with another replica count) gives its weights and optimizer
      // state, its data starting afresh (there was no way to continue at all).
      const std::string why = pending_loader_state_->at(kReplicaMismatchKey).as_string();
      if (!ckpt_path)
        cstorch::fail(
            "{}, or name the checkpoint (--checkpoint_path, or fit.ckpt_path) to go on from its "
            "weights and optimizer state with the data from the start",
            why);
      if (cstorch::distributed::is_main_process())
        fmt::print(stderr,
                   "warning: {}: the checkpoint was named, so its weights and optimizer state "
                   "are loaded and the data start from the beginning\n",
                   why.substr(0, why.find("; resume with")));
      pending_loader_state_.reset();
    }
    if (pending_loader_state_ && !complete) restore_data_position(*train, *pending_loader_state_);
    pending_loader_state_.reset();
    if (replicas_ > 1) {
      // Identical starting weights on every replica: rank 0's.
      std::vector<Tensor> tensors;
      for (auto& [k, t] : model_->state_dict()) tensors.push_back(t);
      cstorch::distributed::broadcast_(tensors, 0);
    }
    write_run_metadata();
    if (record_) record_->start_step = global_step_;  // after a resume: the checkpoint's step
    const int64_t start_step = global_step_;
    const int64_t accum = loop_.grad_accum_steps;
    const int64_t loader_len = train->size();
    // An empty loader is reported now, not when the first step (or, for validation, the first
    // validation after hours of training) finds no data.
    check_not_empty(*train, "training");
    if (val && replicas_ <= 1) check_not_empty(*val, "validation");
    data::StepArgs args;
    args.num_steps = loop_.num_steps;
    args.max_steps = loop_.max_steps;
    args.num_epochs = loop_.num_epochs;
    args.steps_per_epoch = loop_.steps_per_epoch;
    args.initial_step = global_step_;
    const int64_t spe = loop_.steps_per_epoch.value_or(loader_len > 0 ? loader_len / accum : -1);
    if (loop_.max_steps && global_step_ >= *loop_.max_steps) {
      // Resumed from the final checkpoint: nothing is left to train.
      if (cstorch::distributed::is_main_process())
        fmt::print("training is complete: step {} of max_steps {}\n", global_step_,
                   *loop_.max_steps);
      each([&](Callback& c) { c.on_fit_end(*this); });
      end_run("completed");
      return;
    }
    const int64_t total = with_path("trainer.init.loop", [&] {
      return data::compute_num_steps(args, loader_len > 0 ? loader_len / accum : -1);
    });
    run_steps_ = total;
    // A schedule that leaves f32's range within this run (an ExponentialLR whose decay_rate is
    // above 1) is refused now, naming the step, instead of turning the parameters into NaN when
    // it gets there.
    for (size_t i = 0; i < schedulers_.size(); ++i)
      with_path(scheduler_paths_[i], [&] { schedulers_[i]->check_steps(total); });
    if (!later_checkpoints.empty() && global_step_ + total >= later_checkpoints.front().first) {
      // Training into the other run's steps would write over its checkpoints of the steps this
      // run saves at, and mix the two runs in one model_dir: refused before any step.
      std::vector<std::string> over;
      for (const auto& [step, name] : later_checkpoints)
        if (step <= global_step_ + total && ((ckpt_.steps > 0 && step % ckpt_.steps == 0) ||
                                             (step == global_step_ + total && ckpt_.save_at_end)))
          over.push_back(name);
      std::vector<std::string> names;
      for (const auto& [step, name] : later_checkpoints) names.push_back(name);
      cstorch::fail(
          "model_dir '{}' holds checkpoints past step {} ({}) of {}, and this run trains to step "
          "{}: it would write its checkpoints among them{}. Train into another model_dir (-o "
          "DIR, or trainer.init.model_dir), or move them away{}",
          model_dir_, global_step_, fmt::join(names, ", "),
          ckpt_path ? "the run this checkpoint comes from"
                    : "another run (checkpoint.autoload_last_checkpoint is false: this run "
                      "starts afresh)",
          global_step_ + total,
          over.empty() ? std::string() : fmt::format(", over {}", fmt::join(over, ", ")),
          ckpt_path ? "" : "; or resume from the latest of them (autoload_last_checkpoint: true)");
    }
    if (!later_checkpoints.empty() && cstorch::distributed::is_main_process()) {
      // Said, since the next fit without a checkpoint path resumes from the latest of them.
      std::vector<std::string> names;
      for (const auto& [step, name] : later_checkpoints) names.push_back(name);
      fmt::print(stderr,
                 "warning: model_dir '{}' holds checkpoints past step {} ({}): this run leaves "
                 "them as they are (checkpoint.keep_last does not count them), and a fit "
                 "without a checkpoint path resumes from the latest of them\n",
                 model_dir_, global_step_, fmt::join(names, ", "));
    }
    print_header("fit", train.get(), val.get(), total);
    model_->train();
    each([&](Callback& c) { c.on_train_start(*this); });
    try {
      // The traced step: forward, backward, optimizer update. With gradient accumulation the
      // micro-batches before the last only accumulate gradients (scaled by 1/accum).
      auto body = [this, accum](const Batch& b, bool update) {
        // Values callbacks add with add_step_output (names fixed while the step is traced).
        std::vector<std::pair<std::string, Tensor>> extra;
        collecting_ = &extra;
        struct Reset {
          std::vector<std::pair<std::string, Tensor>>*& p;
          ~Reset() { p = nullptr; }
        } reset{collecting_};
        // The rate this step uses (a new node: the scheduler rebinds the lr tensor below).
        Tensor lr_used = optimizer_->param_groups()[0].lr * 1.0;
        each([&](Callback& c) { c.on_before_forward(*this, b); });
        Tensor loss = model_->loss(b);
        each([&](Callback& c) { c.on_after_forward(*this, loss); });
        // One combined loss: the replicas' losses weighted by their sample counts (the same
        // weight the compiler's gradient all-reduce uses: the first batch input's length).
        Tensor reported = loss;
        if (replicas_ > 1 && !b.empty() && b.begin()->second.dim() >= 1)
          reported = cstorch::distributed::all_reduce(
              loss.to(cstorch::DType::f32), cstorch::distributed::ReduceOp::Mean,
              static_cast<double>(b.begin()->second.size(0)));
        each([&](Callback& c) { c.on_before_backward(*this, loss); });
        Tensor scaled = accum > 1 ? loss * (1.0 / static_cast<double>(accum)) : loss;
        precision_->scale_loss(scaled).backward();
        each([&](Callback& c) { c.on_after_backward(*this); });
        if (update) {
          each([&](Callback& c) { c.on_before_optimizer_step(*this); });
          precision_->optimizer_step(*model_, *optimizer_);
          if (num_shards_ > 1) sync_sharded_params();
          each([&](Callback& c) { c.on_after_optimizer_step(*this); });
          each([&](Callback& c) { c.on_before_scheduler_step(*this); });
          for (auto& sched : schedulers_) sched->step();
          each([&](Callback& c) { c.on_after_scheduler_step(*this); });
          optimizer_->zero_grad();
          // A shard's optimizer clears only its own parameters' gradients.
          if (num_shards_ > 1)
            for (auto& p : model_->parameters()) p.set_grad(Tensor());
        }
        std::vector<Tensor> outs{reported, lr_used};
        if (update) step_output_names_.clear();
        for (auto& [name, t] : extra) {
          if (update) step_output_names_.push_back(name);
          outs.push_back(t);
        }
        return outs;
      };
      auto step_fn = cstorch::trace([&](const Batch& b) { return body(b, true); }, "train_step");
      auto accum_fn =
          cstorch::trace([&](const Batch& b) { return body(b, false); }, "accumulate_step");

      data::DataExecutor executor(*train, {.num_steps = total * accum, .checkpoint_steps = 0});
      train_loader_ = train.get();
      const auto& bo = backend_->options();
      const bool dry_run = bo.compile_only || bo.validate_only;
      ArtifactDirScope artifacts(*backend_, impl_->artifact_dir);
      const FileTimes reports_before = dry_run ? artifact_files(*backend_) : FileTimes();
      int64_t epoch = -1;
      // Ctrl-C / SIGTERM (with cszoo's handlers) stop after the current step; a run of several
      // replicas keeps the default (its processes could not agree on the step).
      std::optional<detail::InterruptScope> interruptible;
      if (replicas_ == 1 && cstorch::distributed::world_size() == 1) interruptible.emplace();
      // An error while reading a batch (a bad record, a transform that throws) names the step
      // the batch was for, as the step's own errors do.
      auto reading = [&](auto&& fetch) -> decltype(auto) {
        try {
          return fetch();
        } catch (const std::exception& e) {
          cstorch::fail("step {}: reading its batch failed: {}", global_step_ + 1, e.what());
        }
      };
      for (auto it = reading([&] { return executor.begin(); }); it != executor.end();
           reading([&] { return ++it, 0; })) {
        const Batch& batch = *it;
        const int64_t micro = executor.step();
        const bool last_micro = (micro + 1) % accum == 0;
        const int64_t step_in_run = micro / accum;
        // Epoch e holds global steps e * spe + 1 ... (e + 1) * spe, counted from step 0 as the
        // data's position is: a run resumed partway through an epoch enters that epoch.
        if (spe > 0 && global_step_ / spe != epoch && micro % accum == 0) {
          if (epoch >= 0) each([&](Callback& c) { c.on_train_epoch_end(*this, epoch); });
          epoch = global_step_ / spe;
          each([&](Callback& c) { c.on_train_epoch_start(*this, epoch); });
        }
        if (micro % accum == 0)
          each([&](Callback& c) { c.on_train_batch_start(*this, batch, global_step_ + 1); });
        // The step's number in errors (and in step closures): the global step it computes, as
        // the run's summary, checkpoints and validations count (the executor's own count starts
        // at 0 in every run and counts micro-batches); a validation's steps then carry the step
        // it validates.
        cstorch::set_current_step(global_step_ + 1);
        check_batch(batch, *train, global_step_ + 1, -1);
        auto out = last_micro ? step_fn(batch) : accum_fn(batch);
        if (dry_run) {
          // compile_only / validate_only: the step is traced (and compiled); stop here.
          report_dry_run(*backend_, reports_before, "training");
          break;
        }
        if (!last_micro) continue;
        ++global_step_;
        step_outputs_.assign(out.begin() + 2, out.end());
        for (auto& core : impl_->core) core->on_step_outputs(*this, out[0], out[1]);
        each([&](Callback& c) { c.on_train_batch_end(*this, out[0], global_step_); });
        const bool last = step_in_run + 1 == total;
        if ((ckpt_.steps > 0 && global_step_ % ckpt_.steps == 0) || (last && ckpt_.save_at_end))
          for (auto& core : impl_->core) core->on_checkpoint_step(*this);
        if (val && loop_.eval_frequency > 0 && global_step_ % loop_.eval_frequency == 0 &&
            step_in_run + 1 < total) {
          validate(val);
          model_->train();
        }
        if (interruptible && interrupt_signal() != 0 && !stop_requested_) {
          request_stop(interrupt_signal() == SIGINT ? "interrupted (SIGINT)"
                                                    : "interrupted (SIGTERM)");
          interrupted = true;
        }
        if (stop_requested_ && (!last || interrupted)) {
          // A callback asked to stop (early stopping), or a signal (also in the last step, whose
          // final validation it skips): end here as a finished run would, with a checkpoint of
          // this step.
          if (ckpt_.save_at_end && last_saved_step_ != global_step_)
            for (auto& core : impl_->core) core->on_checkpoint_step(*this);
          if (cstorch::distributed::is_main_process()) {
            if (interrupted)
              fmt::print("stopped at step {}: {}; {}\n", global_step_, stop_reason_,
                         last_saved_step_ == global_step_
                             ? "the same command resumes from this step's checkpoint"
                             : "no checkpoint of this step (checkpoint.save_at_end is false)");
            else
              fmt::print("stopping early at step {}: {}\n", global_step_, stop_reason_);
            std::fflush(stdout);
          }
          break;
        }
      }
      if (epoch >= 0) each([&](Callback& c) { c.on_train_epoch_end(*this, epoch); });
      cstorch::synchronize();
      train_loader_ = nullptr;
    } catch (const std::exception& e) {
      train_loader_ = nullptr;
      // A training step that failed when it ran ("step N: traced step 'train_step' failed: ...",
      // from the executor, which runs behind the loop) did not complete, nor did the steps
      // queued after it: the run ended at step N - 1, whatever the loop had counted.
      if (const auto* se = dynamic_cast<const cstorch::StepError*>(&e);
          se &&
          (se->job() == "traced step 'train_step'" || se->job() == "traced step 'accumulate_step'"))
        global_step_ = std::clamp<int64_t>(se->step() - 1, start_step, global_step_);
      each([&](Callback& c) { c.on_train_exception(*this, e); });
      throw;
    }
    each([&](Callback& c) { c.on_train_end(*this); });
    // A given validation loader runs at the end, whether or not eval_frequency is set (unless
    // an early stop followed a validation of this very step); in a compile_only /
    // validate_only run this prepares the validation step without running it.
    // An interrupted run ends now, without it.
    if (val && !interrupted && !(stop_requested_ && validated_step_ == global_step_)) validate(val);
  } catch (const std::exception& e) {
    each([&](Callback& c) { c.on_fit_exception(*this, e); });
    end_run("failed");
    throw;
  }
  each([&](Callback& c) { c.on_fit_end(*this); });
  end_run(interrupted       ? "interrupted"
          : stop_requested_ ? "stopped early"
                            : finished_status(backend_->options()));
}

std::string Trainer::validation_result_name(const cstorch::metrics::Metric& m) const {
  const std::string& k = impl_->model_metrics.empty() ? m.name() : m.base_name();
  return k.rfind("eval/", 0) == 0 ? k : "eval/" + k;
}

std::vector<std::string> Trainer::validation_result_names() const {
  std::vector<std::string> names{"eval/loss"};
  for (auto* m : impl_->metrics()) names.push_back(validation_result_name(*m));
  return names;
}

double Model::loss_weight(const cstorch::Batch& batch) const {
  for (const auto& [k, t] : batch)
    if (t.defined() && t.dim() >= 1) return static_cast<double>(t.size(0));
  return 1;  // a batch of scalars: one sample
}

void Model::check_batch_values(const cstorch::Batch&) const {}

namespace {
// Where a loader's batches come from, for errors: its data processor and the section's data
// paths ("CSVDataProcessor (files: data/tabular/train.csv)").
std::string data_source(const data::DataLoader& dl) {
  const Config& d = dl.data_description();
  if (!d.is_object() || !d.contains("data_processor")) return "its data loader";
  std::vector<std::string> where;
  for (const char* k : {"data_dir", "files", "file", "vocab_file", "split"})
    if (d.contains(k) && !d[k].is_null())
      where.push_back(fmt::format("{}: {}", k, short_repr(d[k])));
  const Config& p = d["data_processor"];
  const std::string name = p.is_string() ? p.get<std::string>() : short_repr(p);
  return where.empty() ? name : fmt::format("{} ({})", name, fmt::join(where, ", "));
}
}  // namespace

void Trainer::check_batch(const Batch& batch, const data::DataLoader& dl, int64_t step,
                          int64_t val_batch) const {
  try {
    model_->check_batch_values(batch);
  } catch (const cstorch::Error& e) {
    const std::string when = val_batch < 0
                                 ? fmt::format("step {}", step)
                                 : fmt::format("validation at step {}, batch {}", step, val_batch);
    cstorch::fail("{}: a batch from {}: {}", when, data_source(dl), e.what());
  }
}

// Every validation reads the same batches, from the data's start: a validation in the loader's
// next epoch drew other masks or noise spans (BERT, T5) than the one before it, or than
// `cszoo validate` on the same checkpoint, and with eval_steps it went on to other batches.
namespace {
void rewind_validation(
    const DataLoaderPtr& val,
    std::vector<std::pair<std::weak_ptr<cstorch::utils::data::DataLoader>, cstorch::State>>&
        starts) {
  std::erase_if(starts, [](const auto& e) { return e.first.expired(); });
  for (const auto& [loader, start] : starts)
    if (loader.lock() == val) {
      val->load_state_dict(start);
      return;
    }
  try {
    starts.emplace_back(val, val->state_dict());
  } catch (const cstorch::Error&) {
    // A loader that cannot say its position: validations continue where the last one stopped.
  }
}
}  // namespace

double Trainer::validate(DataLoaderPtr val, std::optional<std::string> ckpt_path) {
  CS_CHECK(val != nullptr, "Trainer.validate: a validation dataloader is required");
  if (!participating_) return 0;
  // A validation inside fit() belongs to the fit's run record; a direct call makes its own.
  const bool own_record = !record_;
  if (own_record) begin_run("validate", ckpt_path.value_or(""));
  try {
    if (ckpt_path) load_checkpoint(*ckpt_path);
  } catch (const std::exception&) {
    if (own_record) end_run("failed");
    throw;
  }
  if (own_record) print_header("validate", nullptr, val.get(), 0);
  const bool was_training = model_->is_training();
  model_->eval();
  each([&](Callback& c) { c.on_validate_start(*this); });
  double mean = 0;
  try {
    auto eval_fn = cstorch::trace(
        [&](const Batch& b) {
          cstorch::NoGradGuard no_grad;
          return model_->loss(b);
        },
        "eval_step");
    const int64_t len = val->size();
    // Several replicas: one whose share of a small validation set is empty validates nothing
    // and adds nothing to the combined results (it stopped the launch); only all of them
    // empty is an error, found after combining.
    if (replicas_ <= 1) check_not_empty(*val, "validation");
    int64_t steps = loop_.eval_steps.value_or(len);
    CS_CHECK(steps > 0 || (replicas_ > 1 && len == 0),
             "Trainer.validate: the validation dataloader's length is unknown; set "
             "trainer.init.loop.eval_steps");
    if (len >= 0) steps = std::min(steps, len);
    rewind_validation(val, impl_->validation_starts);
    for (auto* m : impl_->metrics()) m->reset();
    const auto& bo = backend_->options();
    if (bo.compile_only || bo.validate_only) {
      // Prepare the step on one batch and report that: there are no results to log (the
      // outputs of a step that did not run are placeholders).
      ArtifactDirScope artifacts(*backend_, impl_->artifact_dir);
      const FileTimes before = artifact_files(*backend_);
      auto batch = val->next();
      CS_CHECK(batch.has_value(), "Trainer.validate: the validation dataloader is empty");
      eval_fn(*batch);
      if (len > 0)
        while (val->next()) {
        }
      for (auto* m : impl_->metrics()) m->reset();
      report_dry_run(*backend_, before, "validation");
      each([&](Callback& c) { c.on_validate_end(*this); });
      model_->train(was_training);
      // (A validation of its own ends its record here: left 'running' before, and validate_all
      // then wrote one record for all its checkpoints.)
      if (own_record) end_run(finished_status(bo));
      return 0;
    }
    // eval/loss weighs each batch's loss by what the loss averages over (Model::loss_weight:
    // samples, or a language model's unmasked tokens): the mean over all of them, whatever the
    // batch size (a short last batch counted as a whole one moved the result with the batch
    // size).
    auto sum = std::make_shared<double>(0.0);
    double samples = 0;
    auto accumulate = cstorch::step_closure([sum](const Tensor& loss, double n) {
      if (n > 0) *sum += static_cast<double>(loss.item<float>()) * n;
    });
    each([&](Callback& c) { c.on_validate_epoch_start(*this, 0); });
    // Validation may run inside training (eval_frequency), so it walks the loader itself
    // rather than starting a second DataExecutor; it re-iterates like one.
    for (int64_t i = 0; i < steps; ++i) {
      auto batch = val->next();
      if (!batch) batch = val->next();  // an epoch ended: start the next one
      CS_CHECK(batch.has_value(), "Trainer.validate: the validation dataloader is empty");
      each([&](Callback& c) { c.on_validate_batch_start(*this, *batch, i); });
      check_batch(*batch, *val, global_step_, i + 1);
      Tensor loss = eval_fn(*batch);
      const double n = model_->loss_weight(*batch);
      samples += n;
      accumulate(loss, n);
      each([&](Callback& c) { c.on_validate_batch_end(*this, loss, i); });
    }
    // Finish the epoch, so that every validation starts from the same batches.
    if (len > 0)
      while (val->next()) {
      }
    cstorch::synchronize();
    combine_validation(*sum, samples);
    if (samples <= 0) check_not_empty(*val, "validation");  // every replica's share was empty
    mean = *sum / samples;
    // The results every callback can read: the mean loss and each metric the model updated.
    last_val_ = {{"eval/loss", mean}};
    const auto metrics = impl_->metrics();
    for (auto* m : metrics) last_val_[validation_result_name(*m)] = m->compute();
    for (auto* m : metrics) m->reset();
    validated_step_ = global_step_;
    each([&](Callback& c) { c.on_validate_epoch_end(*this, 0); });
    for (auto& core : impl_->core) core->on_validation_result(*this, last_val_);
  } catch (const std::exception& e) {
    each([&](Callback& c) { c.on_validate_exception(*this, e); });
    model_->train(was_training);
    if (own_record) end_run("failed");
    throw;
  }
  each([&](Callback& c) { c.on_validate_end(*this); });
  model_->train(was_training);
  if (own_record) end_run(finished_status(backend_->options()));
  return mean;
}

std::vector<double> Trainer::validate_all(DataLoaderPtr val, std::vector<std::string> paths) {
  if (paths.empty())
    for (auto& [step, p] : checkpoints()) paths.push_back(p);
  CS_CHECK(!paths.empty(), "Trainer.validate_all: no checkpoints in '{}' and none given",
           model_dir_);
  // A checkpoint that cannot be validated (a damaged file) does not stop the others: each is
  // reported as it fails, and the call fails at the end naming them all.
  std::vector<double> r;
  std::vector<std::string> failed;
  for (const auto& p : paths) {
    try {
      r.push_back(validate(val, p));
    } catch (const std::exception& e) {
      if (!participating_) throw;
      if (cstorch::distributed::is_main_process())
        fmt::print(stderr, "error: validate_all: {}; going on with the next checkpoint\n",
                   e.what());
      failed.push_back(fs::path(p).filename().string());
      r.push_back(std::numeric_limits<double>::quiet_NaN());
    }
  }
  CS_CHECK(failed.empty(), "validate_all: {} of {} checkpoints could not be validated: {}",
           failed.size(), paths.size(), fmt::join(failed, ", "));
  return r;
}

}  // namespace modelzoo
