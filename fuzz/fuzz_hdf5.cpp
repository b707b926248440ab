// libFuzzer target: a checkpoint file in the native HDF5 format (libhdf5 opens it; our reader walks
// groups, attributes and datasets), loaded every way (checkpoint_common.h).
#include "checkpoint_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  cstorch::fuzz::fuzz_checkpoint(data, size, "input.mdl",
                                 [](const std::string& p) { return cstorch::load_hdf5(p); });
  return 0;
}
