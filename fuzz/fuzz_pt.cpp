// libFuzzer target: a checkpoint file in the PyTorch format (zip archive, pickle, storages), loaded
// every way (checkpoint_common.h).
#include "checkpoint_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cstorch::fuzz::fuzz_checkpoint(data, size, "input.pt",
                                 [](const std::string& p) { return cstorch::load_pt(p); });
  return 0;
}
