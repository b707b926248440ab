// The Model Zoo subcommands of `cszoo`: fit, validate, validate_all, the legacy
// `run --mode ... --params ...` form, and plot. tools/cszoo.cpp adds them next to the
// checkpoint commands.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

namespace modelzoo {

// Adds the subcommands to `app`; a command that runs sets `status` (0 on success).
void register_cszoo_commands(CLI::App& app, int& status);

// `generate`: text generation from a trained causal LM (modelzoo/cli/generate.cpp).
void register_generate_command(CLI::App& app, int& status);

// The program's own command line, which `cszoo fit PARAMS --num_csx N` (started without a
// launcher) re-runs under mpirun with N processes.
void set_command_line(int argc, char** argv);

// Reports a failed command: "error: <message>" and status 1 in a launch of one process; in an
// MPI launch "error: rank R of N: <message>" and every process of the launch is stopped.
[[noreturn]] void fail_command(const std::string& message);

}  // namespace modelzoo
