// End to end through the cszoo command line: kill -9 during `cszoo fit` and run the same
// command again: it resumes from the latest checkpoint and ends with exactly the state of an
// uninterrupted run (weights, optimizer state, data position, RNG). Also validate, plot,
// convert, and a plugin loaded with --python_paths.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include "e2e/e2e_util.h"

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include "cstorch/data/mnist.h"
#include "cstorch/version.h"

namespace fs = std::filesystem;

using e2e::run;

namespace {

const std::string kCszoo = std::string(CSTORCH_BINARY_DIR) + "/cszoo";
const std::string kPlugins = std::string(CSTORCH_BINARY_DIR) + "/tests/plugins";

fs::path temp_dir(const std::string& name) {
  return e2e::temp_dir("cstorch_cszoo", name);
}

// A small FC-MNIST config: 60 steps, checkpoints every 20, validation every 30.
std::string write_config(const fs::path& dir, const fs::path& data, int sleep_ms) {
  std::string yaml =
      "trainer:\n"
      "  init:\n"
      "    device: CPU\n"
      "    model_dir: " +
      (dir / "model").string() +
      "\n"
      "    seed: 7\n"
      "    model: {name: fc_mnist, hidden_sizes: [32]}\n"
      "    optimizer: {SGD: {lr: 0.05, momentum: 0.9}}\n"
      "    schedulers: [{LinearLR: {initial_learning_rate: 0.05, end_learning_rate: 0.01, "
      "total_iters: 60}}]\n"
      "    precision: {enabled: true, dtype: f16}\n"
      "    loop: {max_steps: 60, eval_frequency: 30, eval_steps: 2}\n"
      "    checkpoint: {steps: 20}\n"
      "    logging: {log_steps: 5}\n"
      "    callbacks: [{SleepEachStep: {ms: " +
      std::to_string(sleep_ms) +
      "}}]\n"
      "  fit:\n"
      "    train_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
      data.string() +
      ", batch_size: 32, shuffle_seed: 3, synthetic: false}\n"
      "    val_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
      data.string() +
      ", split: test, batch_size: 100, synthetic: false}\n"
      "  validate:\n"
      "    val_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
      data.string() + ", split: test, batch_size: 100, synthetic: false}\n";
  std::string path = (dir / "fit.yaml").string();
  std::ofstream(path) << yaml;
  return path;
}

// A tiny FC-MNIST config (seconds to run): 6 steps, a validation loader and no
// eval_frequency; every command of the tests below overrides parts of it.
std::string write_tiny_config(const fs::path& dir, const fs::path& data) {
  std::string yaml =
      "trainer:\n"
      "  init:\n"
      "    device: CPU\n"
      "    model_dir: " +
      (dir / "model").string() +
      "\n"
      "    seed: 7\n"
      "    model: {name: fc_mnist, hidden_sizes: [8]}\n"
      "    optimizer: {SGD: {lr: 0.05}}\n"
      "    loop: {max_steps: 6, eval_steps: 1}\n"
      "    logging: {log_steps: 1, progress: false, plot: false}\n"
      "    loggers: [JSONLines]\n"
      "  fit:\n"
      "    train_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
      data.string() +
      ", batch_size: 20, shuffle_seed: 3, synthetic: false}\n"
      "    val_dataloader: {data_processor: MNISTDataProcessor, data_dir: " +
      data.string() + ", split: test, batch_size: 50, synthetic: false}\n";
  std::string path = (dir / "tiny.yaml").string();
  std::ofstream(path) << yaml;
  return path;
}

// Synthetic MNIST in `data`, then an uninterrupted fit of write_config in root/straight: its
// final checkpoint (step 60).
fs::path straight_run(const fs::path& root, const fs::path& data) {
  cstorch::data::write_synthetic_mnist(data.string(), 2000, 300, 11);
  auto straight = root / "straight";
  fs::create_directories(straight);
  int st = 0;
  std::string out =
      run(kCszoo + " fit " + write_config(straight, data, 0) + " --python_paths " + kPlugins, &st);
  EXPECT_EQ(st, 0) << out;
  return straight / "model" / "checkpoint_60.mdl";
}

// Starts `cszoo fit CFG --python_paths PLUGINS` in a child process, its output into `log`.
pid_t spawn_fit(const std::string& cfg, const fs::path& log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl(kCszoo.c_str(), kCszoo.c_str(), "fit", cfg.c_str(), "--python_paths", kPlugins.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits (at most a minute) until `path` exists.
void wait_for_file(const fs::path& path) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(path) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

}  // namespace

// Dotted overrides after the config, --max_steps, --seed, --version, and the errors of bad
// overrides.
TEST(CszooE2E, OverridesAndRunFlags) {
  auto root = temp_dir("overrides");
  auto data = root / "mnist";
  cstorch::data::write_synthetic_mnist(data.string(), 200, 100, 5);
  const std::string cfg = write_tiny_config(root, data);
  int st = 0;

  std::string out = run(kCszoo + " --version", &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_EQ(out, fmt::format("cszoo {} (commit {}, CPU kernels {})\n", cstorch::version(),
                             cstorch::git_commit(), cstorch::cpu_kernels()));
  // The environment picks the variant of the CPU kernels; one the build lacks is an error naming
  // the variable and listing what the build holds.
  out = run("CSTORCH_CPU_KERNELS=generic " + kCszoo + " --version", &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("CPU kernels "), std::string::npos) << out;
  out = run("CSTORCH_CPU_KERNELS=avx9000 " + kCszoo + " --version", &st);
  EXPECT_NE(st, 0) << out;
  EXPECT_NE(out.find("CSTORCH_CPU_KERNELS=avx9000: no such variant of the CPU kernels in this "
                     "build (built: "),
            std::string::npos)
      << out;

  // A first word that names no command says so, listing the commands.
  out = run(kCszoo + " frobnicate " + cfg, &st);
  EXPECT_EQ(st, 1) << out;
  EXPECT_NE(out.find("error: unknown command 'frobnicate' (commands: fit, validate, validate_all, "
                     "plot, run, checkpoint, generate; cszoo --help says more)"),
            std::string::npos)
      << out;

  // Two plugins registering the same name: an error naming both files (a copy of one plugin
  // under another name loads again and registers its callback again). The registration runs
  // inside the loader, where an exception thrown would end the process.
  const fs::path dup = root / "dup_plugins";
  fs::create_directories(dup);
  fs::copy_file(kPlugins + "/sleep_plugin.so", dup / "a.so");
  fs::copy_file(kPlugins + "/sleep_plugin.so", dup / "b.so");
  out = run(kCszoo + " fit " + cfg + " --python_paths " + dup.string(), &st);
  EXPECT_EQ(st, 1) << out;
  EXPECT_NE(out.find(fmt::format("plugin '{0}/b.so': callback 'SleepEachStep' is registered "
                                 "twice: by plugin '{0}/a.so' and by plugin '{0}/b.so'",
                                 dup.string())),
            std::string::npos)
      << out;

  // Overrides set a key of the file and create one it lacks (eval_frequency).
  out = run(kCszoo + " fit " + cfg + " trainer.init.loop.max_steps=4 " +
                "trainer.init.loop.eval_frequency=2 -o " + (root / "a").string(),
            &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("overrides: trainer.init.loop.max_steps=4 trainer.init.loop.eval_frequency=2"),
            std::string::npos)
      << out;
  EXPECT_TRUE(fs::exists(root / "a" / "checkpoint_4.mdl")) << out;
  EXPECT_FALSE(fs::exists(root / "a" / "checkpoint_6.mdl")) << out;
  EXPECT_NE(out.find("validation at step 2:"), std::string::npos) << out;
  EXPECT_NE(out.find("validation at step 4:"), std::string::npos) << out;

  // --max_steps, and --seed: the same weights as the seed set by an override, others with
  // another seed.
  out = run(kCszoo + " fit " + cfg + " --max_steps 2 --seed 5 -o " + (root / "b").string(), &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_TRUE(fs::exists(root / "b" / "checkpoint_2.mdl")) << out;
  EXPECT_FALSE(fs::exists(root / "b" / "checkpoint_6.mdl")) << out;
  out =
      run(kCszoo + " fit " + cfg + " trainer.init.seed=5 --max_steps 2 -o " + (root / "c").string(),
          &st);
  ASSERT_EQ(st, 0) << out;
  out = run(kCszoo + " fit " + cfg + " --max_steps 2 --seed 6 -o " + (root / "d").string(), &st);
  ASSERT_EQ(st, 0) << out;
  const std::string b2 = (root / "b" / "checkpoint_2.mdl").string();
  out = run(kCszoo + " checkpoint diff " + b2 + " " + (root / "c" / "checkpoint_2.mdl").string(),
            &st);
  EXPECT_EQ(st, 0) << out;
  out = run(kCszoo + " checkpoint diff " + b2 + " " + (root / "d" / "checkpoint_2.mdl").string(),
            &st);
  EXPECT_EQ(st, 2) << out;

  // Bad overrides: the error names the key and what set it; nothing runs.
  auto error_of = [&](const std::string& args) {
    std::string o = run(kCszoo + " fit " + cfg + " " + args + " -o " + (root / "e").string(), &st);
    EXPECT_EQ(st, 1) << args << ": " << o;
    return o;
  };
  out = error_of("foo=1");
  EXPECT_NE(out.find("error: foo: unknown key (valid keys: trainer) (set by the override 'foo=1')"),
            std::string::npos)
      << out;
  out = error_of("trainer.init.loop.max_steps=abc");
  EXPECT_NE(out.find("error: trainer.init.loop.max_steps: expected an integer, got \"abc\" (set "
                     "by the override 'trainer.init.loop.max_steps=abc')"),
            std::string::npos)
      << out;
  out = error_of("trainer.init.loop.max_stepz=5");
  EXPECT_NE(out.find("error: trainer.init.loop.max_stepz: unknown key (valid keys: "),
            std::string::npos)
      << out;
  // An optimizer's or scheduler's error names its block: the override that set the argument
  // it names is blamed, not an earlier one of the whole block; one that sets another argument
  // of the block is not.
  out = error_of(
      "'trainer.init.optimizer={SGD: {lr: 0.1, momentum: 0.5}}' "
      "trainer.init.optimizer.SGD.momentum=-5");
  EXPECT_NE(out.find("invalid momentum -5 (must be >= 0 and finite) (set by the override "
                     "'trainer.init.optimizer.SGD.momentum=-5')"),
            std::string::npos)
      << out;
  // (The learning rate's error named no argument, and no override was blamed.)
  out = error_of("trainer.init.optimizer.SGD.lr=-1");
  EXPECT_NE(out.find("invalid learning rate -1 (lr must be >= 0 and finite) (set by the override "
                     "'trainer.init.optimizer.SGD.lr=-1')"),
            std::string::npos)
      << out;
  out = error_of("trainer.init.optimizer.SGD.lrr=0.1");
  EXPECT_NE(out.find("unknown argument 'lrr'"), std::string::npos) << out;
  EXPECT_NE(out.find("(set by the override 'trainer.init.optimizer.SGD.lrr=0.1')"),
            std::string::npos)
      << out;
  // An override naming another optimizer adds it beside the file's: the block's error says
  // which override did.
  out = error_of("trainer.init.optimizer.AdamW.lr=0.001");
  EXPECT_NE(out.find("error: trainer.init.optimizer: expected one entry of the form {Name: "
                     "{arguments}}"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("(set by the override 'trainer.init.optimizer.AdamW.lr=0.001')"),
            std::string::npos)
      << out;
  out = error_of("trainer.init.optimizer.SGD.lr=0.2 trainer.init.optimizer.SGD.momentum=-5");
  EXPECT_NE(out.find("(set by the override 'trainer.init.optimizer.SGD.momentum=-5')"),
            std::string::npos)
      << out;
  out = error_of("trainer.init.optimizer.SGD.momentum=-5 trainer.init.optimizer.SGD.lr=0.2");
  EXPECT_NE(out.find("(set by the override 'trainer.init.optimizer.SGD.momentum=-5')"),
            std::string::npos)
      << out;
  out = error_of(
      "'trainer.init.schedulers=[{LinearLR: {initial_learning_rate: 0.1, end_learning_rate: "
      "0.01, total_iters: 4}}]' trainer.init.schedulers.0.LinearLR.total_iters=-3");
  EXPECT_NE(out.find("(set by the override 'trainer.init.schedulers.0.LinearLR.total_iters=-3')"),
            std::string::npos)
      << out;
  out = error_of("max_steps");
  EXPECT_NE(out.find("error: override 'max_steps': expected KEY.PATH=VALUE"), std::string::npos)
      << out;
  out = error_of("--max_steps 0");
  EXPECT_NE(out.find("error: trainer.init.loop.max_steps: must be at least 1, got 0 (set by "
                     "--max_steps 0)"),
            std::string::npos)
      << out;
  // A config that no longer matches model_dir's latest checkpoint: the error names the file
  // and says that fit resumes from it.
  out = run(kCszoo + " fit " + cfg + " --max_steps 3 trainer.init.model.hidden_sizes=[16] -o " +
                (root / "b").string(),
            &st);
  EXPECT_EQ(st, 1) << out;
  EXPECT_NE(out.find("error: checkpoint " + (root / "b" / "checkpoint_2.mdl").string() +
                     ": load_state_dict"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("(fit resumes from the latest checkpoint in model_dir '" +
                     (root / "b").string() + "'; another model_dir"),
            std::string::npos)
      << out;
  // An integer flag out of its type's range (CLI11 alone saturated it and ran) or not a whole
  // number: a usage error naming the flag; nothing runs.
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"--seed 99999999999999999999",
            "--seed: 99999999999999999999 is out of range (-9223372036854775808 to "
            "9223372036854775807)"},
           {"--max_steps 2x", "--max_steps: 2x is not a whole number from "},
           // (0 and -2 ran one replica, while the same num_csx in the YAML is an error.)
           // (CLI11's own message read "Value 0 not in range 0.000000 to 1.79769e+308".)
           {"--num_csx 0", "--num_csx: 0 replicas: at least 1 is needed"},
           {"--num_csx -2", "--num_csx: -2 replicas: at least 1 is needed"}}) {
    out = run(kCszoo + " fit " + cfg + " " + args + " -o " + (root / "e").string(), &st);
    EXPECT_NE(st, 0) << args << ": " << out;
    EXPECT_NE(out.find(want), std::string::npos) << out;
  }
  EXPECT_FALSE(fs::exists(root / "e" / "checkpoint_6.mdl"));
  // Usage and config mistakes found before anything runs, each named (tried as a new user
  // would: an empty -o used the config's model_dir, a file as -o failed in a logger, both
  // dry-run flags ran one of them, an empty file reported a missing 'trainer' key, a disabled
  // precision section kept an unknown dtype, `validate` without its section named no remedy).
  std::ofstream(root / "afile") << "x";
  std::ofstream(root / "empty.yaml") << "# nothing yet\n";
  std::string precision = cstorch::testing::read_file(fs::path(cfg));
  precision.insert(precision.find("    loop:"), "    precision: {enabled: false, dtype: float8}\n");
  std::ofstream(root / "precision.yaml") << precision;
  std::string fp16 = cstorch::testing::read_file(fs::path(cfg));
  fp16.insert(fp16.find("    loop:"), "    precision: {enabled: true, fp16_type: bfloat16}\n");
  std::ofstream(root / "fp16.yaml") << fp16;
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"fit " + cfg + " -o ''", "--model_dir: is empty: give a directory"},
           {"fit " + cfg + " -o " + (root / "afile").string(), "exists and is not a directory"},
           {"fit " + cfg + " --compile_only --validate_only",
            "--compile_only excludes --validate_only"},
           {"fit " + (root / "empty.yaml").string(), "the file holds no settings"},
           {"fit " + (root / "precision.yaml").string(),
            "trainer.init.precision.dtype: must be bf16 or f16, got 'float8'"},
           {"fit " + (root / "fp16.yaml").string(),
            "trainer.init.precision.fp16_type: this key is `dtype` here"},
           {"validate " + cfg,
            "trainer.validate: missing: `cszoo validate` reads its data from "
            "trainer.validate.val_dataloader"}}) {
    out = run(kCszoo + " " + args, &st);
    EXPECT_NE(st, 0) << args << ": " << out;
    EXPECT_NE(out.find(want), std::string::npos) << args << ": " << out;
  }
  EXPECT_FALSE(fs::exists(root / "model" / "checkpoint_6.mdl"));
  // A leading zero is decimal (CLI11 alone read 010 as octal, 8).
  out = run(kCszoo + " fit " + cfg + " --seed 010 --compile_only -o " + (root / "e").string(), &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("trainer.init.seed=10"), std::string::npos) << out;
  fs::remove_all(root);
}

// A given validation loader runs at the end of fit (no eval_frequency needed), the legacy
// train_and_eval mode validates, and compile_only / validate_only say what they did and where
// the report is, with no results.
TEST(CszooE2E, ValidationSemanticsAndDryRuns) {
  auto root = temp_dir("validation");
  auto data = root / "mnist";
  cstorch::data::write_synthetic_mnist(data.string(), 200, 100, 5);
  const std::string cfg = write_tiny_config(root, data);
  int st = 0;

  std::string out = run(kCszoo + " fit " + cfg + " --max_steps 3", &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_EQ(count_of(out, "validation at step"), 1u) << out;
  EXPECT_NE(out.find("validation at step 3: loss"), std::string::npos) << out;

  std::ofstream(root / "params.yaml")
      << "train_input: {data_processor: MNISTDataProcessor, data_dir: " << data.string()
      << ", batch_size: 20, synthetic: false}\n"
      << "eval_input: {data_processor: MNISTDataProcessor, data_dir: " << data.string()
      << ", split: test, batch_size: 50, synthetic: false}\n"
      << "model: {name: fc_mnist, hidden_sizes: [8]}\n"
      << "optimizer: {optimizer_type: SGD, learning_rate: 0.05}\n"
      << "runconfig: {max_steps: 3, model_dir: " << (root / "legacy").string() << "}\n";
  const std::string params = (root / "params.yaml").string();
  out = run(kCszoo + " run --mode train_and_eval --params " + params, &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("validation at step 3: loss"), std::string::npos) << out;
  // --mode train only trains; overrides work on a legacy file (its own key paths).
  out = run(kCszoo + " run --mode train --params " + params + " runconfig.max_steps=4", &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_EQ(out.find("validation at step"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(root / "legacy" / "checkpoint_4.mdl")) << out;

  for (const std::string flag : {"compile_only", "validate_only"}) {
    const fs::path dir = root / flag;
    out = run(kCszoo + " fit " + cfg + " --" + flag + " -o " + dir.string(), &st);
    ASSERT_EQ(st, 0) << out;
    const std::string kind = flag == "compile_only" ? "compile" : "validate";
    const std::string did = flag == "compile_only" ? "compiled" : "traced and checked";
    const fs::path train_report = dir / "cerebras_logs" / ("train_step-" + kind + "-0.txt");
    const fs::path eval_report = dir / "cerebras_logs" / ("eval_step-" + kind + "-0.txt");
    EXPECT_NE(out.find(flag + ": " + did +
                       " the training step (nothing ran); report: " + train_report.string()),
              std::string::npos)
        << out;
    EXPECT_NE(out.find(flag + ": " + did +
                       " the validation step (nothing ran); report: " + eval_report.string()),
              std::string::npos)
        << out;
    EXPECT_TRUE(fs::exists(train_report)) << out;
    EXPECT_TRUE(fs::exists(eval_report)) << out;
    // No results: nothing ran.
    EXPECT_EQ(out.find("validation at step"), std::string::npos) << out;
    EXPECT_EQ(out.find("nan"), std::string::npos) << out;
    // No metrics files at all (an empty metrics.jsonl and tensorboard/ were left).
    EXPECT_FALSE(fs::exists(dir / "metrics.jsonl")) << out;
    EXPECT_FALSE(fs::exists(dir / "tensorboard")) << out;
    EXPECT_FALSE(fs::exists(dir / "checkpoint_6.mdl")) << out;
    // The summary and the run record say what was done, not "completed".
    const std::string status = flag == "compile_only" ? "compiled only" : "validated only";
    EXPECT_NE(out.find("== fit " + status + ": 0 steps"), std::string::npos) << out;
    const std::string rec = cstorch::testing::read_file(dir / "run_records" / "run_0001.yaml");
    EXPECT_NE(rec.find("status: \"" + status + "\""), std::string::npos) << rec;
  }
  EXPECT_FALSE(fs::exists(root / "cerebras_logs"));

  // validate with no checkpoint to read says so (a mistyped model_dir would otherwise report
  // untrained weights' accuracy as the run's); with one, no warning.
  std::ofstream(cfg, std::ios::app)
      << "  validate:\n    val_dataloader: {data_processor: MNISTDataProcessor, data_dir: "
      << data.string() << ", split: test, batch_size: 50, synthetic: false}\n";
  out = run(kCszoo + " validate " + cfg + " -o " + (root / "empty").string(), &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("warning: validate: no checkpoint given (--checkpoint_path or "
                     "validate.ckpt_path) and none in '" +
                     (root / "empty").string() + "': validating the model's initial weights"),
            std::string::npos)
      << out;
  out = run(kCszoo + " validate " + cfg, &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("loaded checkpoint"), std::string::npos) << out;
  EXPECT_EQ(out.find("warning: validate"), std::string::npos) << out;
  // Evaluation runs on one process: --num_csx is said to be ignored, as --multireplica is (it
  // failed, advising `cszoo fit ... --num_csx 2`).
  out = run(kCszoo + " validate " + cfg + " --num_csx 2", &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("warning: --num_csx 2 is ignored in evaluation"), std::string::npos) << out;
  // Dry runs of validate and validate_all end their run records as fit's do, one record per
  // checkpoint (they were left 'running', and validate_all wrote one for all its checkpoints).
  const fs::path vdir = root / "validate_dry";
  out = run(kCszoo + " validate " + cfg + " --compile_only -o " + vdir.string(), &st);
  ASSERT_EQ(st, 0) << out;
  std::string rec = cstorch::testing::read_file(vdir / "run_records" / "run_0001.yaml");
  EXPECT_NE(rec.find("status: \"compiled only\""), std::string::npos) << rec;
  std::ofstream(cfg, std::ios::app)
      << "  validate_all:\n    val_dataloaders: {data_processor: MNISTDataProcessor, data_dir: "
      << data.string() << ", split: test, batch_size: 50, synthetic: false}\n";
  out = run(kCszoo + " validate_all " + cfg + " --validate_only -o " + (root / "legacy").string(),
            &st);
  ASSERT_EQ(st, 0) << out;
  int validated_only = 0, running = 0;
  for (const auto& e : fs::directory_iterator(root / "legacy" / "run_records")) {
    rec = cstorch::testing::read_file(e.path());
    validated_only += rec.find("status: \"validated only\"") != std::string::npos;
    running += rec.find("status: \"running\"") != std::string::npos;
  }
  EXPECT_EQ(validated_only, 2) << out;  // checkpoint_3.mdl and checkpoint_4.mdl
  EXPECT_EQ(running, 0) << out;
  fs::remove_all(root);
}

TEST(CszooE2E, KilledFitResumesToTheSameFinalState) {
  auto root = temp_dir("resume");
  auto data = root / "mnist";
  const fs::path straight_final = straight_run(root, data);
  ASSERT_TRUE(fs::exists(straight_final));
  int st = 0;
  std::string out;

  // Killed with SIGKILL after its first checkpoint, then the same command again.
  auto killed = root / "killed";
  fs::create_directories(killed);
  std::string cfg = write_config(killed, data, 40);
  pid_t pid = spawn_fit(cfg, root / "killed.log");
  ASSERT_GE(pid, 0);
  auto first = killed / "model" / "checkpoint_20.mdl";
  wait_for_file(first);
  kill(pid, SIGKILL);
  int ws = 0;
  waitpid(pid, &ws, 0);
  ASSERT_TRUE(fs::exists(first));
  ASSERT_TRUE(WIFSIGNALED(ws)) << "the run finished before it could be killed";
  ASSERT_FALSE(fs::exists(killed / "model" / "checkpoint_60.mdl"));

  out = run(kCszoo + " fit " + cfg + " --python_paths " + kPlugins, &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("loaded checkpoint"), std::string::npos) << out;

  // Every key of the final checkpoints is equal: model, optimizer, scheduler, grad scaler,
  // data position, RNG, step.
  out = run(kCszoo + " checkpoint diff " + straight_final.string() + " " +
                (killed / "model" / "checkpoint_60.mdl").string(),
            &st);
  EXPECT_EQ(st, 0) << out;

  // validate the latest checkpoint, plot, convert to .pt.
  out = run(kCszoo + " validate " + cfg + " --python_paths " + kPlugins, &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("validation at step 60: loss"), std::string::npos) << out;
  EXPECT_NE(out.find("accuracy"), std::string::npos) << out;
  out = run(kCszoo + " plot " + (killed / "model").string(), &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_TRUE(fs::exists(killed / "model" / "loss_lr.png"));
  out = run(kCszoo + " checkpoint convert " + (killed / "model" / "checkpoint_60.mdl").string() +
                " " + (root / "final.pt").string(),
            &st);
  EXPECT_EQ(st, 0) << out;
  fs::remove_all(root);
}

// SIGTERM (as Ctrl-C's SIGINT) during fit: the run stops after its current step with a
// checkpoint of that step, records itself as interrupted and ends by the signal; the same
// command then resumes to the final state of an uninterrupted run.
TEST(CszooE2E, InterruptedFitStopsAfterItsStepAndResumesToTheSameFinalState) {
  auto root = temp_dir("interrupt");
  auto data = root / "mnist";
  const fs::path straight_final = straight_run(root, data);
  ASSERT_TRUE(fs::exists(straight_final));
  int st = 0;
  std::string out;

  auto stopped = root / "stopped";
  fs::create_directories(stopped);
  const std::string cfg = write_config(stopped, data, 40);
  pid_t pid = spawn_fit(cfg, root / "stopped.log");
  ASSERT_GE(pid, 0);
  wait_for_file(stopped / "model" / "checkpoint_20.mdl");
  kill(pid, SIGTERM);
  int ws = 0;
  waitpid(pid, &ws, 0);
  out = cstorch::testing::read_file(root / "stopped.log");
  ASSERT_TRUE(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGTERM) << ws << "\n" << out;
  const auto at = out.find("stopped at step ");
  ASSERT_NE(at, std::string::npos) << out;
  const int step = std::stoi(out.substr(at + 16));
  EXPECT_GE(step, 20);
  EXPECT_LT(step, 60);
  EXPECT_NE(out.find(fmt::format("stopped at step {}: interrupted (SIGTERM); the same command "
                                 "resumes from this step's checkpoint",
                                 step)),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("== fit interrupted: "), std::string::npos) << out;
  // No final validation after the stop (one at step 30, eval_frequency's, may come before it).
  EXPECT_EQ(out.find("validation at step", at), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(stopped / "model" / fmt::format("checkpoint_{}.mdl", step))) << out;
  const std::string record =
      cstorch::testing::read_file(stopped / "model" / "run_records" / "run_0001.yaml");
  EXPECT_NE(record.find("status: \"interrupted\""), std::string::npos) << record;
  EXPECT_NE(record.find("stop_reason: \"interrupted (SIGTERM)\""), std::string::npos) << record;
  EXPECT_NE(record.find(fmt::format("end_step: {}", step)), std::string::npos) << record;

  out = run(kCszoo + " fit " + cfg + " --python_paths " + kPlugins, &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find(fmt::format("checkpoint_{}.mdl (step {})", step, step)), std::string::npos)
      << out;
  out = run(kCszoo + " checkpoint diff " + straight_final.string() + " " +
                (stopped / "model" / "checkpoint_60.mdl").string(),
            &st);
  EXPECT_EQ(st, 0) << out;
  fs::remove_all(root);
}

TEST(CszooE2E, ConfigErrorsNameTheKeyPath) {
  auto root = temp_dir("errors");
  std::ofstream(root / "bad.yaml") << "trainer:\n  init:\n    model: {name: fc_mnist}\n"
                                      "    loop: {max_steps: ten}\n  fit: {}\n";
  int st = 0;
  std::string out = run(kCszoo + " fit " + (root / "bad.yaml").string(), &st);
  EXPECT_EQ(st, 1);
  EXPECT_NE(out.find("error: trainer.init.loop.max_steps: expected an integer, got \"ten\""),
            std::string::npos)
      << out;
  out = run(kCszoo + " fit " + (root / "missing.yaml").string(), &st);
  EXPECT_EQ(st, 1);
  EXPECT_NE(out.find("cannot open"), std::string::npos) << out;
  out = run(kCszoo + " fit " + (root / "bad.yaml").string() + " --python_paths /nonexistent", &st);
  EXPECT_EQ(st, 1);
  EXPECT_NE(out.find("plugin path '/nonexistent' does not exist"), std::string::npos) << out;
  out = run(kCszoo + " fit " + (root / "bad.yaml").string() + " --plugin_paths nope.so", &st);
  EXPECT_EQ(st, 1);
  EXPECT_NE(out.find("plugin path 'nope.so' does not exist (relative to the working directory '"),
            std::string::npos)
      << out;
  // An override after --job_labels was taken as a label, and the run ignored it.
  out = run(kCszoo + " fit " + (root / "bad.yaml").string() +
                " --job_labels team=a trainer.init.loop.max_steps=2",
            &st);
  EXPECT_NE(st, 0);
  EXPECT_NE(out.find("'trainer.init.loop.max_steps=2' is an override of the config, not a job "
                     "label: the option takes every argument after it, so put overrides before "
                     "it"),
            std::string::npos)
      << out;
  fs::remove_all(root);
}

// The legacy command-line form on a legacy params.yaml, and --compile_only on the new form.
TEST(CszooE2E, LegacyRunFormAndCompileOnly) {
  auto root = temp_dir("legacy");
  auto data = root / "mnist";
  cstorch::data::write_synthetic_mnist(data.string(), 500, 200, 5);
  std::ofstream(root / "params.yaml")
      << "train_input: {data_processor: MNISTDataProcessor, data_dir: " << data.string()
      << ", batch_size: 50, synthetic: false}\n"
      << "eval_input: {data_processor: MNISTDataProcessor, data_dir: " << data.string()
      << ", split: test, batch_size: 100, synthetic: false}\n"
      << "model: {name: fc_mnist, hidden_sizes: [16]}\n"
      << "optimizer: {optimizer_type: SGD, learning_rate: 0.05, momentum: 0.9}\n"
      << "runconfig: {max_steps: 20, save_checkpoints_steps: 10, eval_frequency: 10, model_dir: "
      << (root / "legacy_model").string() << "}\n";
  int st = 0;
  std::string out =
      run(kCszoo + " run --mode train_and_eval --params " + (root / "params.yaml").string(), &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("validation at step 20"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(root / "legacy_model" / "checkpoint_10.mdl"));
  EXPECT_TRUE(fs::exists(root / "legacy_model" / "checkpoint_20.mdl"));
  out = run(kCszoo + " run --mode eval --params " + (root / "params.yaml").string(), &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_NE(out.find("loaded checkpoint"), std::string::npos) << out;
  // Errors about a legacy file name its own key too (they named only the converted key path,
  // trainer.init.schedulers for optimizer.learning_rate, tried as a new user would), and the
  // override that set it.
  for (const auto& [args, want] : std::vector<std::pair<std::string, std::string>>{
           {"optimizer.learning_rate=abc",
            "(the legacy params file's optimizer.learning_rate) (set by the override "
            "'optimizer.learning_rate=abc')"},
           {"runconfig.max_steps=abc",
            "trainer.init.loop.max_steps: expected an integer, got \"abc\" (the legacy params "
            "file's runconfig.max_steps) (set by the override 'runconfig.max_steps=abc')"},
           {"train_input.batch_sise=4", "trainer.fit.train_dataloader.batch_sise: unknown key"}}) {
    out = run(kCszoo + " run --mode train --params " + (root / "params.yaml").string() + " " + args,
              &st);
    EXPECT_NE(st, 0) << args << ": " << out;
    EXPECT_NE(out.find(want), std::string::npos) << args << ": " << out;
  }
  EXPECT_NE(out.find("(the legacy params file's train_input.batch_sise)"), std::string::npos)
      << out;

  // --compile_only: the compile report lands in the artifact directory; nothing trains.
  std::string cfg = write_config(root, data, 0);
  out =
      run("cd " + root.string() + " && " + kCszoo + " fit " + cfg +
              " --compile_only --python_paths " + kPlugins + " -o " + (root / "compiled").string(),
          &st);
  ASSERT_EQ(st, 0) << out;
  EXPECT_TRUE(fs::exists(root / "compiled" / "cerebras_logs" / "train_step-compile-0.txt")) << out;
  EXPECT_FALSE(fs::exists(root / "cerebras_logs")) << out;
  EXPECT_FALSE(fs::exists(root / "compiled" / "checkpoint_60.mdl"));
  fs::remove_all(root);
}
