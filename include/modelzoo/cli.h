// The Model Zoo subcommands of `cszoo`: fit, validate, validate_all, the legacy
// `run --mode ... --params ...` form, and plot. tools/cszoo.cpp adds them next to the
// checkpoint commands.
#pragma once
#include <CLI/CLI.hpp>

namespace modelzoo {

// Adds the subcommands to `app`; a command that runs sets `status` (0 on success).
void register_cszoo_commands(CLI::App& app, int& status);

// `generate`: text generation from a trained causal LM (modelzoo/cli/generate.cpp).
void register_generate_command(CLI::App& app, int& status);

}  // namespace modelzoo
