// run_config: every trainer phase of a YAML config, in order.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>

#include "cstorch/distributed.h"
#include "modelzoo/interrupt.h"
#include "modelzoo/trainer.h"
#include "modelzoo/trainer/trainer_impl.h"

namespace modelzoo {

namespace {

DataLoaderPtr make_dataloader(const ConfigView& v) {
  v.expect_map();
  std::string name = v.at("data_processor").as_string();
  DataLoaderPtr dl;
  try {
    dl = data_processors().create(name, v, v.child_path("data_processor"));
  } catch (const cstorch::Error& e) {
    // The loader's own checks (num_workers, prefetch) do not know where they were configured.
    const std::string msg = e.what();
    if (msg.rfind(v.path(), 0) == 0) throw;
    cstorch::fail("{}: {}", v.path(), msg);
  }
  // The section says which data it is: a checkpoint's data position is kept for this data
  // only. How it is read (workers, prefetch) does not change the data.
  Config what = v.value();
  what.erase("num_workers");
  what.erase("prefetch");
  dl->set_data_description(std::move(what));
  return dl;
}

// What can be checked of a phase without building anything: its sections' keys, its init's
// (Trainer::check_init_config), and the sections the command reads.
void check_phase(const ConfigView& phase, Mode mode) {
  phase.expect_map();
  phase.check_keys({"init", "fit", "validate", "validate_all"});
  Trainer::check_init_config(phase.at("init"));
  auto loader = [](const ConfigView& dl) {
    dl.expect_map();
    (void)dl.at("data_processor").as_string();
  };
  if (mode == Mode::Fit) {
    ConfigView f = phase.at("fit");
    f.check_keys({"train_dataloader", "val_dataloader", "ckpt_path"});
    loader(f.at("train_dataloader"));
    if (f.has("val_dataloader")) loader(f.at("val_dataloader"));
  }
}

void run_phase(const ConfigView& phase, Mode mode, const RunOverrides& o) {
  phase.check_keys({"init", "fit", "validate", "validate_all"});
  Config init = phase.at("init").value();
  if (!init.is_object()) phase.at("init").expect_map();
  apply_run_overrides(init, o);
  ConfigView iv(init, phase.child_path("init"));
  Trainer trainer(iv);
  // The run record keeps the phase as received (command-line overrides applied).
  Config recorded = phase.value();
  recorded["init"] = init;
  trainer.set_run_config(recorded);
  if (o.on_trainer) o.on_trainer(trainer);
  auto ckpt_of = [&](const ConfigView& v) -> std::optional<std::string> {
    if (o.checkpoint_path) return o.checkpoint_path;
    if (v.has("ckpt_path")) return v.at("ckpt_path").as_string();
    return std::nullopt;
  };
  switch (mode) {
    case Mode::Fit: {
      ConfigView f = phase.at("fit");
      f.check_keys({"train_dataloader", "val_dataloader", "ckpt_path"});
      auto train = make_dataloader(f.at("train_dataloader"));
      DataLoaderPtr val;
      if (f.has("val_dataloader")) val = make_dataloader(f.at("val_dataloader"));
      trainer.fit(train, val, ckpt_of(f));
      break;
    }
    case Mode::Validate: {
      // The section the command needs, named with what goes in it (a config made for `fit`
      // only has fit.val_dataloader).
      if (!phase.has("validate"))
        cstorch::fail(
            "{}: missing: `cszoo validate` reads its data from {}.val_dataloader (a "
            "val_dataloader as under fit:, and optionally ckpt_path)",
            phase.child_path("validate"), phase.child_path("validate"));
      ConfigView v = phase.at("validate");
      v.check_keys({"val_dataloader", "ckpt_path"});
      // Without a checkpoint path: the latest checkpoint in model_dir, if any.
      auto ckpt = ckpt_of(v);
      auto found = trainer.checkpoints();
      const bool autoload = trainer.checkpoint_config().autoload_last_checkpoint;
      if (!ckpt && autoload && !found.empty()) ckpt = found.back().second;
      // Said, not silent: a mistyped model_dir would otherwise report the accuracy of
      // untrained weights as if it were the run's.
      if (!ckpt && cstorch::distributed::is_main_process()) {
        fmt::print(stderr,
                   "warning: validate: no checkpoint given (--checkpoint_path or "
                   "validate.ckpt_path) and {}: validating the model's initial weights\n",
                   found.empty() ? fmt::format("none in '{}'", trainer.model_dir())
                                 : std::string("checkpoint.autoload_last_checkpoint is false"));
        std::fflush(stderr);
      }
      trainer.validate(make_dataloader(v.at("val_dataloader")), ckpt);
      break;
    }
    case Mode::ValidateAll: {
      if (!phase.has("validate_all"))
        cstorch::fail(
            "{}: missing: `cszoo validate_all` reads its data from {}.val_dataloaders (a list "
            "of val_dataloader maps as under fit:, or one val_dataloader; optionally ckpt_paths)",
            phase.child_path("validate_all"), phase.child_path("validate_all"));
      ConfigView v = phase.at("validate_all");
      v.check_keys({"val_dataloaders", "val_dataloader", "ckpt_paths"});
      ConfigView dl = v.has("val_dataloaders") ? v.at("val_dataloaders") : v.at("val_dataloader");
      std::vector<std::string> paths;
      if (o.checkpoint_path) paths.push_back(*o.checkpoint_path);
      if (v.has("ckpt_paths")) paths = v.at("ckpt_paths").as_string_list();
      if (dl.value().is_array()) {
        for (size_t i = 0; i < dl.size(); ++i)
          trainer.validate_all(make_dataloader(dl.at(i)), paths);
      } else {
        trainer.validate_all(make_dataloader(dl), paths);
      }
      break;
    }
  }
}

}  // namespace

Config& backend_entry(Config& init) {
  if (!init.contains("backend")) {
    init["backend"] = {{"backend_type", init.value("device", std::string("CPU"))}};
    init.erase("device");
  }
  return init["backend"];
}

void apply_run_overrides(Config& init, const RunOverrides& o) {
  if (o.model_dir) init["model_dir"] = *o.model_dir;
  if (o.compile_only || o.validate_only) {
    // The command-line switches become backend options (a device becomes a backend).
    Config& backend = backend_entry(init);
    if (o.compile_only) backend["compile_only"] = true;
    if (o.validate_only) backend["validate_only"] = true;
  }
}

void run_config(const Config& root, Mode mode, const RunOverrides& o) {
  ConfigView r(root, "");
  r.expect_map();
  r.check_keys({"trainer"});
  ConfigView t = r.at("trainer");
  if (t.value().is_array()) {
    if (t.size() == 0)
      t.error(
          "an empty list of trainers: nothing to run (give one trainer, a map with init and "
          "fit / validate / validate_all, or a list of them)");
    // Every phase's sections are checked before the first phase runs: a mistake in a later
    // phase was found only when it started, after the earlier phases had trained. So are the
    // phases' devices: one process has backends of one type only.
    std::string first_type;
    for (size_t i = 0; i < t.size(); ++i) {
      ConfigView entry = t.at(i);
      entry.check_keys({"trainer"});
      ConfigView phase = entry.at("trainer");
      check_phase(phase, mode);
      const ConfigView init = phase.at("init");
      if (init.has("device") && init.has("backend")) init.error(kDeviceAndBackendError);
      const bool has_backend = init.has("backend") && init.at("backend").has("backend_type");
      const std::string key = has_backend ? "backend.backend_type" : "device";
      std::string type = has_backend          ? init.at("backend").at("backend_type").as_string()
                         : init.has("device") ? init.at("device").as_string()
                                              : "CPU";
      std::transform(type.begin(), type.end(), type.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::toupper(ch)); });
      if (i == 0)
        first_type = type;
      else if (type != first_type)
        cstorch::fail(
            "{}: Cannot instantiate multiple backends. A backend with type {} has already been "
            "instantiated.",
            init.child_path(key), first_type);
    }
    for (size_t i = 0; i < t.size(); ++i) {
      ConfigView entry = t.at(i);
      entry.check_keys({"trainer"});
      run_phase(entry.at("trainer"), mode, o);
      if (interrupt_signal() != 0) return;  // an interrupted fit ends the command
    }
  } else {
    run_phase(t, mode, o);
  }
}

}  // namespace modelzoo
