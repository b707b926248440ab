// libFuzzer target: a YAML config file read as `cszoo fit CONFIG` reads it: load_config_file
// (yaml-cpp, then the conversion to a Config with its depth and size limits), the top-level
// check, and for a legacy params file its conversion to the Trainer form in every mode.
// Building the Trainer from the result (models, data, optimizers) is not a file reader and is
// left out: a config may legitimately ask for a model of any size.
#include "cstorch/config.h"
#include "fuzz_util.h"
#include "modelzoo/legacy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::string path = cstorch::fuzz::write_scratch("params.yaml", text);
  FUZZ_CATCH({
    cstorch::Config root = cstorch::load_config_file(path);
    if (!root.is_object()) return 0;  // cszoo's error: "the top level is a list ..."
    if (modelzoo::is_legacy_params(root))
      for (const char* mode : {"", "train", "eval", "train_and_eval", "eval_all"})
        FUZZ_CATCH(modelzoo::convert_legacy_params(root, mode));
  });
  // The in-memory parser (configs given on the command line or in code).
  FUZZ_CATCH(cstorch::parse_config(text));
  return 0;
}
