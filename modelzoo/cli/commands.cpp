// cszoo fit | validate | validate_all | run: load a YAML config (legacy params files convert
// automatically), apply the command-line options, and run every trainer phase.
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>

#include "cstorch/config.h"
#include "cstorch/distributed.h"
#include "modelzoo/cli.h"
#include "modelzoo/cli/whole_number.h"
#include "modelzoo/interrupt.h"
#include "modelzoo/legacy.h"
#include "modelzoo/overrides.h"
#include "modelzoo/plot.h"
#include "modelzoo/trainer.h"

namespace modelzoo {

namespace {

// Options shared by fit / validate / validate_all.
struct CommonOptions {
  std::string params;
  std::string model_dir;
  std::string checkpoint_path;
  bool compile_only = false;
  bool validate_only = false;
  int num_csx = 0;
  std::vector<std::string> mount_dirs, python_paths, job_labels;
  std::string target_device;
  bool multireplica = false;
  std::string cs_ip;
  std::vector<std::string> overrides;  // KEY.PATH=VALUE, after the config
  std::optional<int64_t> max_steps, seed;
  // Several replicas and no --target_device: a CPU config becomes the CSX cluster; a GPU or
  // plugin device keeps its type and hosts one replica per process.
  bool replicas_need_cluster = false;
};

void add_common(CLI::App* cmd, CommonOptions& o, bool params_positional) {
  if (params_positional)
    cmd->add_option("params", o.params, "YAML config file (Trainer form or legacy params.yaml)")
        ->required();
  cmd->add_option("overrides", o.overrides,
                  "Config overrides KEY.PATH=VALUE (e.g. trainer.init.loop.max_steps=50; the "
                  "value is YAML), applied in order before the config is checked");
  cmd->add_option("-o,--model_dir", o.model_dir, "Directory for checkpoints and logs")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            // An empty value was ignored (the config's model_dir used), a file was reported
            // later by a logger that could not make its folder there.
            if (v.empty()) return "is empty: give a directory";
            std::error_code ec;
            if (std::filesystem::exists(v, ec) && !std::filesystem::is_directory(v, ec))
              return "'" + v + "' exists and is not a directory";
            return {};
          },
          "DIR", "model_dir"));
  cmd->add_option("--max_steps", o.max_steps,
                  "Train to this step: trainer.init.loop.max_steps of every phase (legacy "
                  "params: runconfig.max_steps)")
      ->transform(cli::whole_number<int64_t>());
  cmd->add_option("--seed", o.seed,
                  "The run's seed: trainer.init.seed of every phase (legacy params: "
                  "runconfig.seed)")
      ->transform(cli::whole_number<int64_t>());
  cmd->add_option("--checkpoint_path", o.checkpoint_path, "Checkpoint to start from / evaluate");
  cmd->add_flag("--compile_only", o.compile_only,
                "Compile the steps, write their reports to MODEL_DIR/cerebras_logs (printed), "
                "run nothing");
  cmd->add_flag("--validate_only", o.validate_only,
                "Trace and check the steps only, write their reports to MODEL_DIR/cerebras_logs "
                "(printed), run nothing")
      ->excludes("--compile_only");
  cmd->add_option("--num_csx", o.num_csx,
                  "Replicas of the CSX backend (cluster_config.num_csx); started without a "
                  "launcher, cszoo runs itself under mpirun with that many processes")
      ->transform(cli::whole_number<int>())
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            // CLI11's PositiveNumber said "Value 0 not in range 0.000000 to 1.79e308".
            return std::stoll(s) >= 1 ? std::string()
                                      : fmt::format("{} replicas: at least 1 is needed", s);
          },
          "", "at_least_one"));
  cmd->add_option("--mount_dirs", o.mount_dirs, "Directories the run needs (must exist)");
  cmd->add_option("--plugin_paths,--python_paths", o.python_paths,
                  "Plugins: shared libraries (.so), or directories whose every *.so is loaded; "
                  "they register models, data processors, callbacks, devices "
                  "(--python_paths is the seed's name)");
  cmd->add_option("--job_labels", o.job_labels, "key=value labels recorded with the run")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            // The option takes every argument after it: an override placed there became a
            // label (and the run ignored it), without a word.
            return s.rfind("trainer.", 0) == 0 || s.rfind("trainer[", 0) == 0
                       ? fmt::format(
                             "'{}' is an override of the config, not a job label: the option "
                             "takes every argument after it, so put overrides before it",
                             s)
                       : std::string();
          },
          "", "not_an_override"));
  cmd->add_option("--target_device", o.target_device, "CPU, GPU or CSX (overrides the config)");
  cmd->add_flag("--multireplica", o.multireplica,
                "Data parallel over every process the launch provides (mpirun -np N): the "
                "backend becomes CSX with num_csx N");
  cmd->add_option("--cs_ip", o.cs_ip,
                  "Address of the CS system; recorded in run_metadata.json only: the "
                  "replicas are the processes of this launch");
}

// Calls `f` with the init map of every phase of a Trainer-form config (one `trainer:` map or a
// list of `- trainer:` phases); malformed parts are left to run_config's errors.
template <class F>
void for_each_phase_init(Config& root, F&& f) {
  if (!root.is_object() || !root.contains("trainer")) return;
  auto phase = [&](Config& p) {
    if (p.is_object() && p.contains("init") && p["init"].is_object()) f(p["init"]);
  };
  Config& t = root["trainer"];
  if (t.is_array()) {
    for (auto& e : t)
      if (e.is_object() && e.contains("trainer")) phase(e["trainer"]);
  } else {
    phase(t);
  }
}

// Applies the backend-related options to every phase's init map.
void apply_backend_options(Config& root, const CommonOptions& o) {
  for_each_phase_init(root, [&](Config& init) {
    if (!o.cs_ip.empty()) init["cs_ip"] = o.cs_ip;
    const bool has_backend = init.contains("backend") && init["backend"].is_object();
    std::string target = o.target_device;
    if (target.empty() && o.replicas_need_cluster) {
      const Config& type = has_backend ? init["backend"]["backend_type"] : init["device"];
      const std::string now = type.is_string() ? type.get<std::string>() : "CPU";
      if (cstorch::ascii_lower(now) == "cpu") target = "CSX";
    }
    if (!target.empty()) {
      if (has_backend)
        init["backend"]["backend_type"] = target;
      else
        init["device"] = target;
    }
    const bool cluster =
        o.num_csx > 0 || !o.mount_dirs.empty() || !o.job_labels.empty() || !o.python_paths.empty();
    if (!cluster) return;
    Config& cc = backend_entry(init)["cluster_config"];
    if (cc.is_null()) cc = Config::object();
    if (o.num_csx > 0) cc["num_csx"] = o.num_csx;
    if (!o.mount_dirs.empty()) cc["mount_dirs"] = o.mount_dirs;
    if (!o.job_labels.empty()) cc["job_labels"] = o.job_labels;
    if (!o.python_paths.empty()) cc["python_paths"] = o.python_paths;
  });
}

// The most replicas any phase asks for (the CSX backend's num_csx; the legacy runconfig's).
int required_replicas(const Config& root, bool legacy) {
  if (legacy) {
    const Config& rc = root.contains("runconfig") ? root["runconfig"] : Config();
    if (rc.is_object() && rc.contains("num_csx") && rc["num_csx"].is_number_integer() &&
        cstorch::ascii_lower(rc.value("target_device", std::string("CPU"))) == "csx")
      return rc["num_csx"].get<int>();
    return 1;
  }
  int n = 1;
  auto phase = [&](const Config& p) {
    if (!p.is_object() || !p.contains("init") || !p["init"].is_object()) return;
    const Config& init = p["init"];
    if (!init.contains("backend") || !init["backend"].is_object()) return;
    const Config& b = init["backend"];
    if (!b.contains("backend_type") || !b["backend_type"].is_string() ||
        cstorch::ascii_lower(b["backend_type"].get<std::string>()) != "csx")
      return;
    if (b.contains("cluster_config") && b["cluster_config"].is_object() &&
        b["cluster_config"].contains("num_csx") &&
        b["cluster_config"]["num_csx"].is_number_integer())
      n = std::max(n, b["cluster_config"]["num_csx"].get<int>());
  };
  const Config& t = root.contains("trainer") ? root["trainer"] : Config();
  if (t.is_array()) {
    for (auto& e : t)
      if (e.is_object() && e.contains("trainer")) phase(e["trainer"]);
  } else {
    phase(t);
  }
  return n;
}

std::vector<std::string>& command_line() {
  static std::vector<std::string> args;
  return args;
}

// Started without a launcher and asked for N > 1 replicas: run this same command under mpirun
// with N processes (it does not return). Inside a launch nothing happens.
void launch_replicas_if_needed(int n) {
  if (n <= 1 || cstorch::distributed::launched_by_mpi()) return;
  const auto& args = command_line();
  CS_CHECK(!args.empty(), "--num_csx: the command line is unknown; cannot launch the replicas");
  std::vector<std::string> cmd = {CSTORCH_MPIEXEC,   "-np",       std::to_string(n),
                                  "--oversubscribe", "--bind-to", "none"};
  if (::geteuid() == 0) cmd.push_back("--allow-run-as-root");
  // Each replica gets its share of the cores for its kernels unless the user chose.
  if (!std::getenv("OMP_NUM_THREADS")) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    ::setenv("OMP_NUM_THREADS", std::to_string(std::max(1u, cores / n)).c_str(), 1);
  }
  // The launcher gives its processes a pseudo-terminal even when its own output goes to a
  // pipe or file: tell them what this process's stdout is, so progress redraws only on a
  // terminal.
  ::setenv("CSTORCH_STDOUT_IS_TTY", ::isatty(STDOUT_FILENO) == 1 ? "1" : "0", 1);
  // Shared-memory transport without cross-process memory attach (refused in containers).
  ::setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  cmd.push_back(ec ? args[0] : self.string());
  for (size_t i = 1; i < args.size(); ++i) cmd.push_back(args[i]);
  fmt::print(stderr, "launching {} replicas: {}\n", n, fmt::join(cmd, " "));
  std::fflush(stderr);
  std::vector<char*> argv;
  for (auto& a : cmd) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execvp(argv[0], argv.data());
  cstorch::fail("--num_csx {}: cannot start the launcher '{}': {}", n, CSTORCH_MPIEXEC,
                std::strerror(errno));
}

void run_common(const CommonOptions& o, Mode mode, std::string legacy_mode, bool runner) {
  for (const auto& d : o.mount_dirs)
    CS_CHECK(std::filesystem::is_directory(d), "--mount_dirs: '{}' is not a directory", d);
  if (!o.python_paths.empty()) load_plugins(o.python_paths);
  CommonOptions opts = o;
  if (o.multireplica) {
    if (mode != Mode::Fit) {
      if (cstorch::distributed::is_main_process())
        fmt::print(stderr, "warning: --multireplica is ignored in evaluation\n");
      opts.multireplica = false;
    } else {
      // Every process of the launch is a replica.
      opts.num_csx = cstorch::distributed::world_size();
      opts.replicas_need_cluster = true;
    }
  }
  // Evaluation runs on one process, as --multireplica says above (--num_csx 2 with validate led
  // to an error advising `cszoo fit ... --num_csx 2`).
  if (mode != Mode::Fit && opts.num_csx > 1) {
    if (cstorch::distributed::is_main_process())
      fmt::print(stderr,
                 "warning: --num_csx {} is ignored in evaluation (it runs on one process)\n",
                 opts.num_csx);
    opts.num_csx = 0;
  }
  // More than one replica means the CSX backend (this cluster), unless the config names a device
  // that hosts replicas itself.
  if (opts.num_csx > 1) opts.replicas_need_cluster = true;
  Config root = cstorch::load_config_file(o.params);
  CS_CHECK(root.is_object() || root.is_null(),
           "config: {}: the top level is {}, not a map of sections (trainer: ..., or a legacy "
           "params file's train_input: ..., model: ..., runconfig: ...)",
           o.params, root.is_array() ? "a list" : "a single value");
  CS_CHECK(!root.is_null() || !o.overrides.empty(),
           "config: {}: the file holds no settings (it is empty, or only comments): a config is "
           "a map of sections (trainer: ..., or a legacy params file's train_input: ..., "
           "model: ..., runconfig: ...)",
           o.params);
  if (root.is_null()) root = Config::object();

  // Overrides: every one parsed first (a malformed one stops the command before anything
  // runs), then applied in order, then --max_steps and --seed in their dotted form.
  struct Applied {
    ConfigOverride ov;
    std::string origin;  // for errors: what on the command line set it
  };
  std::vector<Applied> applied;
  for (const auto& text : o.overrides)
    applied.push_back({parse_override(text), fmt::format("the override '{}'", text)});
  for (const auto& a : applied) apply_override(root, a.ov);
  const bool legacy = is_legacy_params(root);
  auto apply_flag = [&](const char* flag, const char* legacy_key, const char* init_key, int64_t v) {
    std::vector<std::string> keys;
    const Config* t = root.contains("trainer") ? &root["trainer"] : nullptr;
    if (legacy) {
      keys.push_back(fmt::format("runconfig.{}", legacy_key));
    } else if (t && t->is_array()) {
      for (size_t i = 0; i < t->size(); ++i)
        keys.push_back(fmt::format("trainer.{}.trainer.init.{}", i, init_key));
    } else {
      keys.push_back(fmt::format("trainer.init.{}", init_key));
    }
    for (const auto& k : keys) {
      applied.push_back(
          {parse_override(fmt::format("{}={}", k, v)), fmt::format("{} {}", flag, v)});
      apply_override(root, applied.back().ov);
    }
  };
  if (o.max_steps) apply_flag("--max_steps", "max_steps", "loop.max_steps", *o.max_steps);
  if (o.seed) apply_flag("--seed", "seed", "seed", *o.seed);

  if (!applied.empty() && cstorch::distributed::is_main_process()) {
    std::vector<std::string> texts;
    for (const auto& a : applied) texts.push_back(a.ov.text);
    fmt::print("overrides: {}\n", fmt::join(texts, " "));
    std::fflush(stdout);
  }

  RunOverrides ov;
  if (!o.model_dir.empty()) ov.model_dir = o.model_dir;
  if (!o.checkpoint_path.empty()) ov.checkpoint_path = o.checkpoint_path;
  ov.compile_only = o.compile_only;
  ov.validate_only = o.validate_only;
  ResolvedRunConfig record;
  record.params_file = o.params;
  for (const auto& a : applied) record.overrides.push_back(a.ov.text);
  try {
    if (legacy) {
      if (runner) {
        // The legacy entry point goes through the runner factory, so custom runners run.
        Config& rc = root["runconfig"];
        if (!opts.target_device.empty()) rc["target_device"] = opts.target_device;
        if (!opts.cs_ip.empty()) rc["cs_ip"] = opts.cs_ip;
        if (opts.num_csx > 0) rc["num_csx"] = opts.num_csx;
        // Recorded as the runner sees them (it also gets them through `ov`).
        if (ov.model_dir) rc["model_dir"] = *ov.model_dir;
        if (ov.compile_only) rc["compile_only"] = true;
        if (ov.validate_only) rc["validate_only"] = true;
        if (mode == Mode::Fit) launch_replicas_if_needed(required_replicas(root, true));
        record.config = root;
        set_resolved_run_config(record);
        BaseRunner::create(root, ov)->run(legacy_mode, ov);
        return;
      }
      // `fit` on a legacy file with eval_input trains and validates.
      if (legacy_mode == "train" && root.contains("eval_input")) legacy_mode = "train_and_eval";
      root = convert_legacy_params(root, legacy_mode);
    }
    apply_backend_options(root, opts);
    if (mode == Mode::Fit) launch_replicas_if_needed(required_replicas(root, false));
    // Ctrl-C stops a single process's fit after its current step (modelzoo/interrupt.h). Not
    // in a rank of an MPI launch: its communicator has a SIGTERM handler of its own.
    if (mode == Mode::Fit && cstorch::distributed::world_size() == 1) install_interrupt_handlers();
    // The record holds what each phase's Trainer is built from.
    record.config = root;
    for_each_phase_init(record.config, [&](Config& init) { apply_run_overrides(init, ov); });
    set_resolved_run_config(record);
    run_config(root, mode, ov);
  } catch (const cstorch::Error& e) {
    std::string msg = e.what();
    // An error about a legacy file names the converted key path it reports: say which key of
    // the file that is (the user wrote optimizer.learning_rate, not trainer.init.schedulers).
    std::string key = msg.substr(0, msg.find(':'));
    if (legacy) {
      const std::string from = legacy_key_of(key);
      if (!from.empty()) {
        msg += fmt::format(" (the legacy params file's {})", from);
        key = from;
      }
    }
    // An error at an overridden key says what set it (the file does not hold that value): the
    // last override of the key or of a key above it (which replaced it whole), or of a key under
    // it whose first component below the error's key the message names (an optimizer's or a
    // scheduler's errors name its block: "...optimizer.SGD: SGD: invalid momentum -5"; an
    // override that adds a second optimizer, trainer.init.optimizer.AdamW.lr=..., makes the
    // block's "expected one entry" error, which names AdamW).
    auto under = [](const std::string& path, const std::string& top) {
      return path.size() >= top.size() && path.compare(0, top.size(), top) == 0 &&
             (path.size() == top.size() ||
              std::string(".[").find(path[top.size()]) != std::string::npos);
    };
    auto named_argument = [&](const std::string& kp) {
      if (kp.size() <= key.size() + 1 || kp.compare(0, key.size() + 1, key + ".") != 0)
        return false;
      const std::string rest = kp.substr(key.size() + 1);
      const std::string arg = rest.substr(0, rest.find_first_of(".["));
      const auto word = [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      };
      for (size_t at = msg.find(arg); at != std::string::npos; at = msg.find(arg, at + 1))
        if ((at == 0 || !word(msg[at - 1])) &&
            (at + arg.size() == msg.size() || !word(msg[at + arg.size()])))
          return true;
      return false;
    };
    for (auto it = applied.rbegin(); it != applied.rend(); ++it) {
      const std::string kp = it->ov.key_path();
      if (under(key, kp) || named_argument(kp)) cstorch::fail("{} (set by {})", msg, it->origin);
    }
    if (msg != e.what()) cstorch::fail("{}", msg);
    throw;
  }
}

}  // namespace

void set_command_line(int argc, char** argv) {
  command_line().assign(argv, argv + argc);
  // The run records say how the run was started.
  set_run_command_line(command_line());
}

void fail_command(const std::string& message) {
  if (cstorch::distributed::launched_by_mpi()) cstorch::distributed::abort(message, 1);
  std::fflush(stdout);
  std::fprintf(stderr, "error: %s\n", message.c_str());
  std::fflush(stderr);
  std::exit(1);
}

void register_cszoo_commands(CLI::App& app, int& status) {
  struct Cmd {
    const char* name;
    const char* help;
    Mode mode;
    const char* legacy_mode;
  };
  static const Cmd cmds[] = {
      {"fit",
       "Train as the config says; a validation loader runs every eval_frequency steps and at the "
       "end",
       Mode::Fit, "train"},
      {"validate", "Validate a checkpoint (the latest in model_dir unless --checkpoint_path)",
       Mode::Validate, "eval"},
      {"validate_all", "Validate every checkpoint in model_dir", Mode::ValidateAll, "eval_all"},
  };
  static CommonOptions opts[3];
  for (int i = 0; i < 3; ++i) {
    auto* c = app.add_subcommand(cmds[i].name, cmds[i].help);
    add_common(c, opts[i], true);
    c->callback([i, &status] {
      run_common(opts[i], cmds[i].mode, cmds[i].legacy_mode, false);
      status = 0;
    });
  }

  // plot MODEL_DIR: the loss/LR image of a run from its metrics file.
  static std::string plot_dir, plot_out;
  auto* plot = app.add_subcommand("plot", "Draw the loss and learning-rate curves of a run");
  plot->add_option("model_dir", plot_dir, "The run's model_dir (holds metrics.jsonl or .csv)")
      ->required();
  plot->add_option("-o,--output", plot_out, "PNG file (default MODEL_DIR/loss_lr.png)");
  plot->callback([&status] {
    namespace fs = std::filesystem;
    fs::path metrics;
    for (const char* name : {"metrics.jsonl", "metrics.csv"})
      if (fs::exists(fs::path(plot_dir) / name)) {
        metrics = fs::path(plot_dir) / name;
        break;
      }
    CS_CHECK(!metrics.empty(), "plot: no metrics.jsonl or metrics.csv in '{}'", plot_dir);
    fs::path out = plot_out.empty() ? fs::path(plot_dir) / "loss_lr.png" : fs::path(plot_out);
    plot_metrics_file(metrics, out, PlotOptions{});
    fmt::print("wrote {}\n", out.string());
    status = 0;
  });

  // The legacy form: run --mode {train,eval,train_and_eval,eval_all} --params PARAMS.
  static CommonOptions legacy;
  static std::string mode;
  auto* run = app.add_subcommand("run", "Legacy form: run --mode MODE --params PARAMS");
  run->add_option("--mode", mode, "train, eval, train_and_eval or eval_all")
      ->required()
      ->check(CLI::IsMember({"train", "eval", "train_and_eval", "eval_all"}));
  run->add_option("--params", legacy.params, "params.yaml")->required();
  add_common(run, legacy, false);
  run->callback([&status] {
    Mode m = mode == "eval" ? Mode::Validate : mode == "eval_all" ? Mode::ValidateAll : Mode::Fit;
    run_common(legacy, m, mode, true);
    status = 0;
  });
}

}  // namespace modelzoo
