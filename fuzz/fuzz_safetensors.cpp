// libFuzzer target: a checkpoint file in safetensors (length, JSON header, tensor bytes), loaded
// every way (checkpoint_common.h).
#include "checkpoint_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cstorch::fuzz::fuzz_checkpoint(data, size, "input.safetensors",
                                 [](const std::string& p) { return cstorch::load_safetensors(p); });
  return 0;
}
