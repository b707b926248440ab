// Internal: the .npy parser reads from a byte source, so one parser serves plain .npy files and
// .npz members (npz.cpp).
#pragma once
#include <cstdint>
#include <string>

#include "cstorch/data/arrays.h"

namespace cstorch::data {

// Sequential reads from a file or an archive member of known size.
struct NpySource {
  virtual ~NpySource() = default;
  virtual uint64_t size() const = 0;
  // Reads exactly `n` bytes (an error naming `where` otherwise).
  virtual void read(void* dst, uint64_t n) = 0;
  std::string where;  // names the source in errors
};

// Parses and checks the header, then reads the data (see read_npy).
HostArray read_npy_from(NpySource& src);

}  // namespace cstorch::data
