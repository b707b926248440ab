// cszoo: the Model Zoo command line. Each command group registers its subcommands on the app
// (see kCommandGroups); `cszoo checkpoint {info, diff, convert, verify}` is the first group, the
// Trainer adds fit / validate / validate_all the same way.
//
//   cszoo checkpoint info model_dir/checkpoint_100.mdl
//   cszoo checkpoint diff a.mdl b.pt
//   cszoo checkpoint convert checkpoint_100.mdl weights.safetensors
//   cszoo checkpoint verify checkpoint_100.mdl
//
//   cszoo fit configs/fc_mnist.yaml trainer.init.loop.max_steps=50 --seed 3
//   cszoo --version
//
// Exit status: 0 on success; 1 on an error (printed as "error: ..."); diff exits 2 when the
// checkpoints differ (like diff(1)); verify exits 2 when a tensor is damaged.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include "cstorch/checkpoint.h"
#include "cstorch/core/error.h"
#include "cstorch/version.h"
#include "modelzoo/cli.h"
#include "modelzoo/interrupt.h"

namespace {

// A command group adds its subcommands to `app`; the callback it installs sets `status`.
using RegisterCommands = std::function<void(CLI::App& app, int& status)>;

void register_checkpoint(CLI::App& app, int& status) {
  auto* ckpt = app.add_subcommand("checkpoint", "Inspect, compare, convert and verify checkpoints");
  ckpt->require_subcommand(1);

  auto* info = ckpt->add_subcommand(
      "info", "List keys, dtypes, shapes and sizes of a checkpoint (.mdl/.h5, .pt, .safetensors)");
  static std::string info_path;
  info->add_option("path", info_path, "Checkpoint file")->required();
  info->callback([&status] {
    std::fputs(cstorch::checkpoint_info(info_path).c_str(), stdout);
    status = 0;
  });

  auto* diff = ckpt->add_subcommand(
      "diff", "Compare two checkpoints: keys in only one, and the max abs difference per tensor");
  static std::string diff_a, diff_b;
  diff->add_option("a", diff_a, "First checkpoint")->required();
  diff->add_option("b", diff_b, "Second checkpoint")->required();
  diff->callback([&status] {
    auto d = cstorch::checkpoint_diff(diff_a, diff_b);
    std::fputs(cstorch::format_checkpoint_diff(d).c_str(), stdout);
    status = d.identical() ? 0 : 2;
  });

  auto* convert = ckpt->add_subcommand(
      "convert",
      "Convert a checkpoint; the output format follows its extension (.mdl/.h5: HDF5, "
      ".pt/.pth: PyTorch, .safetensors)");
  static std::string conv_in, conv_out;
  convert->add_option("input", conv_in, "Checkpoint to read (any format)")->required();
  convert->add_option("output", conv_out, "File to write")->required();
  convert->callback([&status] {
    cstorch::convert_checkpoint(conv_in, conv_out);
    std::printf("wrote %s (%s)\n", conv_out.c_str(),
                cstorch::checkpoint_format_name(cstorch::checkpoint_format_for_path(conv_out)));
    status = 0;
  });

  auto* verify = ckpt->add_subcommand(
      "verify",
      "Read every tensor of a checkpoint and check it against the file's checksums; list the "
      "damaged ones (exit status 2 when there are any)");
  static std::string verify_path;
  verify->add_option("path", verify_path, "Checkpoint file")->required();
  verify->callback([&status] {
    auto v = cstorch::verify_checkpoint(verify_path);
    std::fputs(cstorch::format_checkpoint_verification(v).c_str(), stdout);
    status = v.intact() ? 0 : 2;
  });
}

// The error for a command word that names no command of the group it is given to (`cszoo
// frobnicate`, `cszoo checkpoint frob`), or for a group given none (`cszoo`, `cszoo checkpoint`),
// or "" (CLI11 would say only "A subcommand is required").
std::string unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* group = &app;
  std::string words = "cszoo";  // the command line so far
  std::string given;            // its command words, without "cszoo"
  for (int i = 1;; ++i) {
    std::vector<std::string> names;
    for (const CLI::App* sub : group->get_subcommands([](CLI::App*) { return true; }))
      names.push_back(sub->get_name());
    if (names.empty()) return "";
    const std::string what =
        group == &app ? std::string("commands") : fmt::format("{} commands", group->get_name());
    if (i >= argc)
      return fmt::format("error: '{}' needs a command ({}: {}; {} --help says more)\n", words, what,
                         fmt::join(names, ", "), words);
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return "";
    given += (given.empty() ? "" : " ") + word;
    if (std::find(names.begin(), names.end(), word) == names.end())
      return fmt::format("error: unknown command '{}' ({}: {}; {} --help says more)\n", given, what,
                         fmt::join(names, ", "), words);
    group = group->get_subcommand(word);
    words += " " + word;
  }
}

const std::vector<RegisterCommands> kCommandGroups = {
    modelzoo::register_cszoo_commands, register_checkpoint, modelzoo::register_generate_command};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cszoo: train, validate and manage cstorch Model Zoo runs"};
  app.require_subcommand(1);
  // A function: the CPU kernels are chosen (and CSTORCH_CPU_KERNELS checked) only when asked.
  app.set_version_flag("--version", std::function<std::string()>([] {
                         return fmt::format("cszoo {} (commit {}, CPU kernels {})",
                                            cstorch::version(), cstorch::git_commit(),
                                            cstorch::cpu_kernels());
                       }));
  int status = 0;
  modelzoo::set_command_line(argc, argv);
  for (const auto& reg : kCommandGroups) reg(app, status);
  if (const std::string bad = unknown_command(app, argc, argv); !bad.empty()) {
    std::fputs(bad.c_str(), stderr);
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    // A failing replica must stop the others too (they would wait in a collective).
    modelzoo::fail_command(e.what());
  }
  // A fit stopped by Ctrl-C ends by that signal once wound up, as a shell expects.
  modelzoo::exit_if_interrupted();
  return status;
}
