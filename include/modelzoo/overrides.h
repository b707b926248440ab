// Command-line overrides of a config (`cszoo fit cfg.yaml trainer.init.loop.max_steps=50`) and
// the resolved config of the current cszoo command (after every override), for whoever records
// the run.
//
// An override is `KEY.PATH=VALUE`. The key path is the YAML key path with dots
// (`trainer.init.optimizer.SGD.lr`); a numeric component indexes a list
// (`trainer.init.schedulers.0.LinearLR.total_iters`, `trainer.1.trainer.init.seed` for the
// second phase of a list of phases). The value is YAML: `50`, `1e-3`, `true`, `[1, 2]`,
// `{SGD: {lr: 0.1}}`, `text`, `"007"` (quoted: a string); an empty value is null, which leaves
// the key to its default. Missing maps on the way are created (a numeric component on a map
// that lacks that key is an error: it was meant for a list). Nothing is checked here beyond
// the form: the overridden config goes through the same checks as the file, so an unknown key
// or a value of the wrong type is the error the same mistake in the YAML file gives, with the
// same key path.
#pragma once
#include <string>
#include <vector>

#include "cstorch/config.h"

namespace modelzoo {

using cstorch::Config;

struct ConfigOverride {
  std::vector<std::string> path;  // the key path's components
  std::string text;               // the argument as given ("a.b=1")
  Config value;                   // the parsed value
  // The key path as errors write it: "trainer.init.schedulers[0].LinearLR" (lists in []).
  std::string key_path() const;
};

// Parses `KEY.PATH=VALUE`. Errors (cstorch::Error) name the argument: no `=`, an empty key
// path or component, a value that is not YAML.
ConfigOverride parse_override(const std::string& arg);

// Sets the override's value in `root`, creating missing maps. Errors name the override and the
// key path: a component below a value that is neither a map nor a list, a list index that is
// not a number or is out of range, a number on a map without that key (its keys named).
void apply_override(Config& root, const ConfigOverride& o);

// `c` as YAML text (block style; strings quoted where they would read back as another type):
// parse_config(to_yaml(c)) == c.
std::string to_yaml(const Config& c);

// The config a cszoo command runs: set by the command before the first trainer phase is built
// (the run record in model_dir is written from it).
struct ResolvedRunConfig {
  std::string params_file;             // the config file as named on the command line
  std::vector<std::string> overrides;  // every override in the order applied, as KEY.PATH=VALUE
                                       // (--max_steps and --seed appear in this form)
  Config config;  // the config after the overrides and the command-line options (model_dir,
                  // backend options), the one the trainer phases are built from
  std::string yaml() const { return to_yaml(config); }
};

// The current command's resolved config, or null outside cszoo (a Trainer built in code).
const ResolvedRunConfig* resolved_run_config();
void set_resolved_run_config(ResolvedRunConfig r);

}  // namespace modelzoo
