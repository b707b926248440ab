// Legacy params.yaml conversion and the runner API over the Trainer.
#include "modelzoo/legacy.h"

#include "cstorch/distributed.h"

namespace modelzoo {

bool is_legacy_params(const Config& root) {
  return root.is_object() && (root.contains("runconfig") || root.contains("train_input"));
}

Config convert_legacy_params(const Config& params, const std::string& mode_in) {
  ConfigView p(params, "");
  p.expect_map();
  p.check_keys({"train_input", "eval_input", "model", "optimizer", "runconfig"});
  Config init = Config::object();
  Config rc = p.has("runconfig") ? p.at("runconfig").value() : Config::object();
  ConfigView r(rc, "runconfig");
  r.check_keys({"max_steps",
                "num_steps",
                "num_epochs",
                "steps_per_epoch",
                "eval_steps",
                "eval_frequency",
                "save_checkpoints_steps",
                "keep_checkpoint_max",
                "save_summary_steps",
                "log_steps",
                "model_dir",
                "seed",
                "checkpoint_path",
                "mode",
                "multireplica",
                "cs_ip",
                "target_device",
                "compile_only",
                "validate_only",
                "autoload_last_checkpoint",
                "num_csx",
                "num_workers_per_csx",
                "runner",
                "grad_accum_steps",
                "save_initial_checkpoint"});

  // Model: the registered name travels in model.name (or model.model_name).
  ConfigView m = p.at("model");
  m.expect_map();
  Config model = m.value();
  if (model.contains("model_name")) {
    model["name"] = model["model_name"];
    model.erase("model_name");
  }
  if (!model.contains("name"))
    cstorch::fail("model.name: missing; a legacy params file names its registered model here");
  init["model"] = model;

  if (p.has("optimizer")) {
    ConfigView o = p.at("optimizer");
    o.expect_map();
    Config args = o.value();
    std::string type = o.at("optimizer_type").as_string();
    args.erase("optimizer_type");
    if (args.contains("learning_rate") && !args["learning_rate"].is_number()) {
      init["schedulers"] = args["learning_rate"];  // a schedule: configure_lr_scheduler's forms
      args.erase("learning_rate");
    }
    init["optimizer"] = {{type, args}};
  }

  Config loop = Config::object();
  for (const char* k : {"max_steps", "num_steps", "num_epochs", "steps_per_epoch", "eval_steps",
                        "eval_frequency", "grad_accum_steps"})
    if (r.has(k)) loop[k] = rc[k];
  init["loop"] = loop;
  Config ckpt = Config::object();
  if (r.has("save_checkpoints_steps")) ckpt["steps"] = rc["save_checkpoints_steps"];
  if (r.has("keep_checkpoint_max")) ckpt["keep_last"] = rc["keep_checkpoint_max"];
  if (r.has("autoload_last_checkpoint"))
    ckpt["autoload_last_checkpoint"] = rc["autoload_last_checkpoint"];
  if (r.has("save_initial_checkpoint"))
    ckpt["save_initial_checkpoint"] = rc["save_initial_checkpoint"];
  init["checkpoint"] = ckpt;
  if (r.has("save_summary_steps") || r.has("log_steps"))
    init["logging"] = {
        {"log_steps", r.has("log_steps") ? rc["log_steps"] : rc["save_summary_steps"]}};
  if (r.has("model_dir")) init["model_dir"] = rc["model_dir"];
  if (r.has("seed")) init["seed"] = rc["seed"];

  // cs_ip names the CS system; here it is recorded in the run metadata only.
  if (r.has("cs_ip")) init["cs_ip"] = r.at("cs_ip").as_string();

  std::string mode = mode_in.empty() ? r.get_string("mode", "train") : mode_in;
  std::string device = r.get_string("target_device", "CPU");
  const bool compile_only = r.get_bool("compile_only", false),
             validate_only = r.get_bool("validate_only", false);
  // multireplica: True trains data parallel over every process of the launch, as
  // --multireplica does: the CSX backend with num_csx = the launch's size. Training only.
  int replicas = 0;
  if (r.get_bool("multireplica", false)) {
    if (mode == "train" || mode == "train_and_eval") {
      device = "CSX";
      replicas = cstorch::distributed::world_size();
    } else if (cstorch::distributed::is_main_process()) {
      fmt::print(stderr, "warning: runconfig.multireplica is ignored in evaluation\n");
    }
  }
  if (compile_only || validate_only || r.has("num_csx") || r.has("num_workers_per_csx") ||
      replicas > 0) {
    Config be = {
        {"backend_type", device}, {"compile_only", compile_only}, {"validate_only", validate_only}};
    Config cc = Config::object();
    if (r.has("num_csx")) cc["num_csx"] = rc["num_csx"];
    if (replicas > 0) cc["num_csx"] = replicas;
    if (r.has("num_workers_per_csx")) cc["num_workers_per_csx"] = rc["num_workers_per_csx"];
    if (!cc.empty()) be["cluster_config"] = cc;
    init["backend"] = be;
  } else {
    init["device"] = device;
  }

  Config phase = {{"init", init}};
  auto ckpt_path = r.has("checkpoint_path") ? rc["checkpoint_path"] : Config();
  if (mode == "train" || mode == "train_and_eval") {
    Config fit = {{"train_dataloader", p.at("train_input").value()}};
    if (mode == "train_and_eval") fit["val_dataloader"] = p.at("eval_input").value();
    if (!ckpt_path.is_null()) fit["ckpt_path"] = ckpt_path;
    phase["fit"] = fit;
  } else if (mode == "eval") {
    Config v = {{"val_dataloader", p.at("eval_input").value()}};
    if (!ckpt_path.is_null()) v["ckpt_path"] = ckpt_path;
    phase["validate"] = v;
  } else if (mode == "eval_all") {
    phase["validate_all"] = {{"val_dataloaders", p.at("eval_input").value()}};
  } else {
    cstorch::fail("runconfig.mode: must be train, eval, train_and_eval or eval_all, got '{}'",
                  mode);
  }
  return {{"trainer", phase}};
}

std::string legacy_key_of(const std::string& path) {
  // Longest prefix first: (converted prefix, legacy prefix). A prefix matches a whole key.
  static const std::pair<const char*, const char*> kMap[] = {
      {"trainer.init.checkpoint.steps", "runconfig.save_checkpoints_steps"},
      {"trainer.init.checkpoint.keep_last", "runconfig.keep_checkpoint_max"},
      {"trainer.init.checkpoint", "runconfig"},
      {"trainer.init.logging.log_steps", "runconfig.log_steps"},
      {"trainer.init.loop", "runconfig"},
      {"trainer.init.model_dir", "runconfig.model_dir"},
      {"trainer.init.seed", "runconfig.seed"},
      {"trainer.init.device", "runconfig.target_device"},
      {"trainer.init.backend", "runconfig"},
      {"trainer.init.model", "model"},
      {"trainer.init.schedulers", "optimizer.learning_rate"},
      {"trainer.fit.train_dataloader", "train_input"},
      {"trainer.fit.val_dataloader", "eval_input"},
      {"trainer.fit.ckpt_path", "runconfig.checkpoint_path"},
      {"trainer.validate.val_dataloader", "eval_input"},
      {"trainer.validate.ckpt_path", "runconfig.checkpoint_path"},
      {"trainer.validate_all.val_dataloaders", "eval_input"},
  };
  auto whole = [&](const std::string& prefix) {
    return path.compare(0, prefix.size(), prefix) == 0 &&
           (path.size() == prefix.size() ||
            std::string(".[").find(path[prefix.size()]) != std::string::npos);
  };
  for (const auto& [conv, legacy] : kMap)
    if (whole(conv)) return legacy + path.substr(std::string(conv).size());
  // trainer.init.optimizer.TYPE.KEY -> optimizer.KEY (TYPE is optimizer.optimizer_type).
  const std::string opt = "trainer.init.optimizer";
  if (whole(opt)) {
    const size_t type_end = path.find('.', opt.size() + 1);
    if (type_end == std::string::npos) return "optimizer.optimizer_type";
    return "optimizer" + path.substr(type_end);
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// Runners

namespace {

// Calls the runner's hooks from the Trainer's.
class RunnerHooks : public Callback {
 public:
  explicit RunnerHooks(BaseRunner* r) : r_(r) {}
  std::string name() const override { return "RunnerHooks(" + r_->name() + ")"; }
  void on_train_start(Trainer&) override { r_->on_train_start(); }
  void on_train_end(Trainer&) override { r_->on_train_end(); }
  void on_train_epoch_start(Trainer&, int64_t) override { r_->on_train_epoch_start(); }
  void on_train_epoch_end(Trainer&, int64_t) override { r_->on_train_epoch_end(); }
  void on_train_batch_start(Trainer&, const cstorch::Batch&, int64_t) override {
    r_->on_train_batch_start();
  }
  void on_train_batch_end(Trainer&, const cstorch::Tensor&, int64_t) override {
    r_->on_train_batch_end();
  }
  void on_validate_start(Trainer&) override { r_->on_eval_start(); }
  void on_validate_end(Trainer&) override { r_->on_eval_end(); }
  void on_validate_epoch_start(Trainer&, int64_t) override { r_->on_eval_epoch_start(); }
  void on_validate_epoch_end(Trainer&, int64_t) override { r_->on_eval_epoch_end(); }
  void on_validate_batch_start(Trainer&, const cstorch::Batch&, int64_t) override {
    r_->on_eval_batch_start();
  }
  void on_validate_batch_end(Trainer&, const cstorch::Tensor&, int64_t) override {
    r_->on_eval_batch_end();
  }

 private:
  BaseRunner* r_;
};

// Custom runners by name (what runconfig.runner selects).
Registry<std::unique_ptr<BaseRunner>>& custom_runners() {
  static Registry<std::unique_ptr<BaseRunner>> r("runner");
  return r;
}

}  // namespace

void BaseRunner::register_runner(const std::string& name, Factory f) {
  custom_runners().add(name,
                       [f = std::move(f)](const ConfigView& params) { return f(params.value()); });
}

std::unique_ptr<BaseRunner> BaseRunner::create(const Config& params, const RunOverrides& o) {
  ConfigView p(params, "");
  p.expect_map();
  Config rc = p.has("runconfig") ? p.at("runconfig").value() : Config::object();
  ConfigView r(rc, "runconfig");
  if (r.has("runner"))
    return custom_runners().create(r.at("runner").as_string(), p, r.child_path("runner"));
  if (o.compile_only || o.validate_only || r.get_bool("compile_only", false) ||
      r.get_bool("validate_only", false))
    return std::make_unique<CompileOnlyRunner>(params);
  if (cstorch::ascii_lower(r.get_string("target_device", "CPU")) == "csx")
    return std::make_unique<SystemRunner>(params);
  return std::make_unique<CpuGpuRunner>(params);
}

void BaseRunner::run(const std::string& mode, const RunOverrides& overrides) {
  Config root = convert_legacy_params(params_, mode);
  RunOverrides o = overrides;
  auto user_hook = o.on_trainer;
  o.on_trainer = [this, user_hook](Trainer& t) {
    t.add_callback(std::make_shared<RunnerHooks>(this));
    if (user_hook) user_hook(t);
  };
  // The converted phase holds exactly one of fit / validate / validate_all.
  const Config& phase = root["trainer"];
  const Mode m = phase.contains("validate")       ? Mode::Validate
                 : phase.contains("validate_all") ? Mode::ValidateAll
                                                  : Mode::Fit;
  run_config(root, m, o);
}

}  // namespace modelzoo
