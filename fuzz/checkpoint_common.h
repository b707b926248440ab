// The checkpoint targets (fuzz_pt, fuzz_safetensors, fuzz_hdf5): the input is a whole file,
// read every way a user can: the format's own load function, the CheckpointReader (list, read
// each tensor by key), and `cszoo checkpoint verify` / `info`.
#pragma once
#include <string>

#include "cstorch/checkpoint.h"
#include "fuzz_util.h"

namespace cstorch::fuzz {

template <class Load>
void fuzz_checkpoint(const uint8_t* data, size_t size, const char* file_name, Load load_format) {
  const std::string path = write_scratch(file_name, {reinterpret_cast<const char*>(data), size});
  FUZZ_CATCH(load_format(path));
  FUZZ_CATCH({
    CheckpointReader r(path);
    // (read_all() is what load() does; it is left out to keep the target fast.)
    for (const auto& t : r.tensors()) FUZZ_CATCH(r.read(t.key));
  });
  FUZZ_CATCH(verify_checkpoint(path));
  FUZZ_CATCH(checkpoint_info(path));
}

}  // namespace cstorch::fuzz
