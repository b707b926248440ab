// Internal HDF5 helpers of the text data files: quiet error stacks, the stack as a message,
// writing whole integer datasets and scalar attributes, crash-safe file creation.
#pragma once
#include <hdf5.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "cstorch/core/error.h"

namespace cstorch::data::h5 {

// Error stacks are per thread: silence automatic printing (errors become cstorch::Error).
inline void quiet() {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

inline std::string error() {
  std::string out;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* data) -> herr_t {
        auto* s = static_cast<std::string*>(data);
        if (e->desc && *e->desc) {
          if (!s->empty()) *s += "; ";
          *s += e->desc;
        }
        return 0;
      },
      &out);
  H5Eclear2(H5E_DEFAULT);
  return out.empty() ? "unknown HDF5 error" : out;
}

// Checks dataset `d` of file `path` (creation properties `plist`, shape `dims`, elements of
// `type_size` bytes in the file) against what the file stores for it, before anything is
// allocated for its shape: an error, its message starting with `where`, for a dataset never
// written, chunks never written (they would read as the fill value), fewer stored bytes than an
// uncompressed shape needs, or compressed chunks claiming more than 1032:1. Empty shapes pass.
void check_storage(hid_t d, hid_t plist, const std::string& path, const std::string& where,
                   const std::vector<hsize_t>& dims, size_t type_size);

// `files`, or, when it is a single directory, the .h5 / .hdf5 files in it (sorted). Errors name
// `what`: no files given, a directory without such files.
inline std::vector<std::string> expand_files(const std::vector<std::string>& files,
                                             const char* what) {
  namespace fs = std::filesystem;
  if (files.size() == 1 && fs::is_directory(files[0])) {
    std::vector<std::string> found;
    for (auto& e : fs::directory_iterator(files[0])) {
      auto ext = e.path().extension().string();
      if (e.is_regular_file() && (ext == ".h5" || ext == ".hdf5")) found.push_back(e.path());
    }
    std::sort(found.begin(), found.end());
    CS_CHECK(!found.empty(), "{}: directory '{}' holds no .h5 or .hdf5 files", what, files[0]);
    return found;
  }
  CS_CHECK(!files.empty(), "{}: no files given", what);
  return files;
}

// Writes `data` (row-major, int32) as dataset `name` of shape `dims` into `file`.
inline void write_i32(hid_t file, const std::string& path, const std::string& name,
                      const std::vector<hsize_t>& dims, const int32_t* data) {
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t d =
      H5Dcreate2(file, name.c_str(), H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  herr_t st = d < 0 ? -1 : H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data);
  std::string err = st < 0 ? error() : "";
  if (d >= 0) H5Dclose(d);
  H5Sclose(space);
  if (st < 0) fail("writing dataset '{}' of '{}' failed: {}", name, path, err);
}

inline void write_attr(hid_t file, const std::string& path, const std::string& name, int64_t v) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(file, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
  herr_t st = a < 0 ? -1 : H5Awrite(a, H5T_NATIVE_INT64, &v);
  std::string err = st < 0 ? error() : "";
  if (a >= 0) H5Aclose(a);
  H5Sclose(space);
  if (st < 0) fail("writing attribute '{}' of '{}' failed: {}", name, path, err);
}

// Creates `path + ".tmp"`, lets `fill(file)` write it, then renames it over `path`.
template <class F>
void write_file(const std::string& path, F fill) {
  quiet();
  std::string tmp = path + ".tmp";
  hid_t f = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) fail("cannot create HDF5 file '{}': {}", tmp, error());
  try {
    fill(f);
  } catch (...) {
    H5Fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  if (H5Fclose(f) < 0) fail("closing '{}' failed: {}", tmp, error());
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming '{}' to '{}' failed", tmp, path);
}

}  // namespace cstorch::data::h5
