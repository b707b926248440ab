// Arguments every data processor reads the same way from its YAML section.
#pragma once
#include <algorithm>
#include <cstdint>

#include "cstorch/config.h"
#include "cstorch/core/error.h"
#include "modelzoo/config_view.h"

namespace modelzoo::detail {

// num_workers and prefetch into `args`. num_workers 0 (PyTorch's "load in the main process",
// common in ported configs) runs the loader's default, one worker per replica
// (cluster_config.num_workers_per_csx): loading never runs on the training loop's thread here,
// and a count of 1 was too few for a multi-replica run. A negative count is an error naming its
// key path.
inline void add_loader_args(const ConfigView& a, cstorch::Config& args) {
  if (a.has("num_workers")) {
    const int64_t n = a.at("num_workers").as_int();
    if (n < 0) cstorch::fail("{}: must be 0 or more, got {}", a.child_path("num_workers"), n);
    if (n > 0) args["num_workers"] = n;
  }
  if (a.has("prefetch")) args["prefetch"] = a.at("prefetch").as_int();
}

// A processor's optional `vocab_size`: 0 (the default) leaves the data's ids unchecked; a
// negative value is an error naming its key path.
inline int64_t optional_vocab_size(const ConfigView& a) {
  const int64_t v = a.get_int("vocab_size", 0);
  if (v < 0)
    cstorch::fail("{}: must be 0 (unchecked) or more, got {}", a.child_path("vocab_size"), v);
  return v;
}

}  // namespace modelzoo::detail
