// h5::check_storage (data/h5util.h): a dataset's shape against what its file stores, before
// anything is allocated for it. Shared by the data-array reader and the checkpoint reader.
#include <algorithm>
#include <filesystem>
#include <limits>

#include <fmt/ranges.h>

#include "data/h5util.h"

namespace cstorch::data::h5 {

namespace fs = std::filesystem;

// Checks what `path` stores for dataset `d` (creation properties `plist`, shape `dims`, elements
// of `type_size` bytes in the file) against what its shape claims, before anything is allocated
// for it: a 1.6 KB file whose chunks were never written claimed 16 GB, which was allocated,
// zero-filled and read as fill values. Data of no shape (0 rows) need no check.
void check_storage(hid_t d, hid_t plist, const std::string& path, const std::string& where,
                   const std::vector<hsize_t>& dims, size_t type_size) {
  uint64_t in_file = type_size;  // bytes of the file's type
  for (hsize_t x : dims) {
    CS_CHECK(x == 0 || in_file <= std::numeric_limits<uint64_t>::max() / x,
             "{}: the dataset's shape ({}) is too large (damaged)", where, fmt::join(dims, ", "));
    in_file *= x;
  }
  if (in_file == 0) return;
  const std::string claim = fmt::format("shape ({}) of {}-byte elements, {} bytes",
                                        fmt::join(dims, ", "), type_size, in_file);
  std::error_code ec;
  const uint64_t file_size = fs::file_size(path, ec);
  CS_CHECK(!ec, "{}: cannot read the size of '{}': {}", where, path, ec.message());
  const hsize_t stored = H5Dget_storage_size(d);  // 0 also when unknown: refused below
  const H5D_layout_t layout = H5Pget_layout(plist);
  if (layout == H5D_CONTIGUOUS || layout == H5D_COMPACT) {
    // Space that was never allocated was never written: it would read as the fill value.
    CS_CHECK(stored > 0,
             "{}: the dataset ({}) was never written: the file stores none of its data (it would "
             "read as the fill value, not data)",
             where, claim);
    // Contiguous bytes are in the file as they are: a size that disagrees is a damaged file.
    const haddr_t at = layout == H5D_CONTIGUOUS ? H5Dget_offset(d) : 0;
    CS_CHECK(stored == in_file && at != HADDR_UNDEF && at + stored <= file_size,
             "{}: the dataset's {} bytes do not fit the file ({} stored bytes at offset {} of a "
             "{}-byte file; truncated or damaged)",
             where, in_file, stored, at, file_size);
    return;
  }
  // Virtual datasets map other datasets (libhdf5 reads them); any other layout is chunked.
  if (layout != H5D_CHUNKED) return;
  CS_CHECK(stored <= file_size,
           "{}: the dataset's chunks claim {} stored bytes, more than the {}-byte file holds "
           "(damaged)",
           where, stored, file_size);
  // Chunks never written read as the fill value: no data of the user's, and stored nowhere, so
  // they would bound nothing below. (H5Dget_space_status cannot tell: it compares byte counts,
  // which compression and partial edge chunks make differ when every chunk is written.)
  const int rank = static_cast<int>(dims.size());
  std::vector<hsize_t> chunk(dims.size());
  CS_CHECK(H5Pget_chunk(plist, rank, chunk.data()) == rank,
           "{}: cannot read the dataset's chunk shape: {}", where, error());
  uint64_t need = 1;  // at most the element count: every dimension is at least 1 here
  for (size_t k = 0; k < dims.size(); ++k) {
    CS_CHECK(chunk[k] > 0, "{}: a chunk dimension of 0 (damaged)", where);
    need *= (dims[k] + chunk[k] - 1) / chunk[k];
  }
  hsize_t written = 0;
  {
    // (HDF5 1.10 takes the dataset's own file space here, not H5S_ALL.)
    const hid_t space = H5Dget_space(d);
    const bool ok = space >= 0 && H5Dget_num_chunks(d, space, &written) >= 0;
    if (space >= 0) H5Sclose(space);
    CS_CHECK(ok, "{}: cannot read the dataset's chunk index: {}", where, error());
  }
  CS_CHECK(written >= need,
           "{}: only {} of the dataset's {} chunks were ever written ({}; {} bytes stored); the "
           "rest would read as the fill value, not data: write every row, or resize the dataset "
           "to the rows written",
           where, written, need, claim, stored);
  // What the stored chunks can expand to. The byte shuffle and the checksum keep the size, N-bit
  // packing keeps at least a bit an element; deflate reaches at most 1032:1, and that is the
  // bound taken for the other filters too (a ratio beyond it is a damaged file or a
  // decompression bomb, not data).
  const int nfilters = H5Pget_nfilters(plist);
  CS_CHECK(nfilters >= 0, "{}: cannot read the dataset's filters: {}", where, error());
  uint64_t ratio = 1;
  std::vector<std::string> filters;
  for (int k = 0; k < nfilters; ++k) {
    unsigned flags = 0, config = 0, values[8];
    size_t nvalues = 8;
    char fname[64] = "";
    const H5Z_filter_t id = H5Pget_filter2(plist, static_cast<unsigned>(k), &flags, &nvalues,
                                           values, sizeof fname, fname, &config);
    CS_CHECK(id >= 0, "{}: cannot read the dataset's filters: {}", where, error());
    fname[sizeof fname - 1] = '\0';
    filters.push_back(fname[0] ? fname : fmt::format("filter {}", id));
    const uint64_t r = id == H5Z_FILTER_SHUFFLE || id == H5Z_FILTER_FLETCHER32 ? 1
                       : id == H5Z_FILTER_NBIT                                 ? 8 * type_size
                                                                               : 1032;
    ratio = std::min<uint64_t>(ratio * r, uint64_t{1} << 44);
  }
  if (ratio == 1)
    CS_CHECK(stored >= in_file,
             "{}: the dataset ({}) has {} bytes stored in the file (truncated or damaged)", where,
             claim, stored);
  else
    CS_CHECK((in_file + ratio - 1) / ratio <= stored,
             "{}: the dataset ({}) has {} bytes stored, compressed with {}: more than the {}:1 "
             "these filters are taken to reach (a damaged file or a decompression bomb)",
             where, claim, stored, fmt::join(filters, ", "), ratio);
}
}  // namespace cstorch::data::h5
