// Hdf5TokenDataset: GPT-style HDF5 token files (see cstorch/data/tokens.h). The HDF5 library in
// use is the thread-safe build, so worker threads may read concurrently (HDF5 serialises).
#include <hdf5.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "cstorch/data/tokens.h"
#include "data/h5util.h"
#include "data/host_tensor.h"

namespace cstorch::data {

namespace {

// The rows the header of `path` claims (dims: N, 3, msl) must be stored in the file. A damaged
// or hostile header can claim 2^31 rows in a 1 KB file: HDF5 reads the missing data as zeros,
// and the loader would allocate for every row before reading any.
void check_rows_stored(hid_t d, const std::string& path, const hsize_t* dims, size_t elem) {
  const uint64_t file_size = std::filesystem::file_size(path);
  uint64_t claimed = 0;
  bool overflow = __builtin_mul_overflow(dims[0], dims[1], &claimed) ||
                  __builtin_mul_overflow(claimed, dims[2], &claimed) ||
                  __builtin_mul_overflow(claimed, uint64_t{elem}, &claimed);
  CS_CHECK(!overflow,
           "Hdf5TokenDataset: '{}': dataset 'data' claims {} rows of {} tokens, more bytes than "
           "any file holds: a damaged file",
           path, dims[0], dims[2]);
  hid_t dcpl = H5Dget_create_plist(d);
  H5D_layout_t layout = dcpl >= 0 ? H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
  int external = dcpl >= 0 ? H5Pget_external_count(dcpl) : 0;
  hsize_t cdims[3] = {1, 1, 1};
  int crank = layout == H5D_CHUNKED ? H5Pget_chunk(dcpl, 3, cdims) : 0;
  if (dcpl >= 0) H5Pclose(dcpl);
  H5Eclear2(H5E_DEFAULT);
  if (dims[0] == 0 || external > 0) return;  // nothing claimed / data in other files
  if (layout == H5D_CONTIGUOUS || layout == H5D_COMPACT) {
    auto stored = static_cast<uint64_t>(H5Dget_storage_size(d));
    H5Eclear2(H5E_DEFAULT);
    CS_CHECK(claimed <= stored && claimed <= file_size,
             "Hdf5TokenDataset: '{}': dataset 'data' claims {} rows of {} tokens ({} bytes) but "
             "the file stores {} bytes of it and is {} bytes long: a damaged or truncated file",
             path, dims[0], dims[2], claimed, stored, file_size);
  } else if (layout == H5D_CHUNKED && crank == 3 && cdims[0] > 0 && cdims[1] > 0 && cdims[2] > 0) {
    // Compressed chunks may be small, but every chunk the shape needs must be stored.
    uint64_t needed = 1;
    for (int k = 0; k < 3; ++k) needed *= (dims[k] + cdims[k] - 1) / cdims[k];  // <= claimed
    hsize_t have = 0;
    hid_t space = H5Dget_space(d);  // (1.10 takes no H5S_ALL here)
    herr_t st = space >= 0 ? H5Dget_num_chunks(d, space, &have) : -1;
    if (space >= 0) H5Sclose(space);
    if (st < 0) {
      H5Eclear2(H5E_DEFAULT);
      return;
    }
    CS_CHECK(have >= needed,
             "Hdf5TokenDataset: '{}': dataset 'data' claims {} rows of {} tokens but the file "
             "({} bytes) stores {} of the {} chunks those rows need: a damaged or incompletely "
             "written file",
             path, dims[0], dims[2], file_size, have, needed);
  }
}

}  // namespace

Hdf5TokenDataset::Hdf5TokenDataset(std::vector<std::string> files)
    : paths_(h5::expand_files(files, "Hdf5TokenDataset")) {
  h5::quiet();
  try {
    for (const auto& path : paths_) {
      CS_CHECK(std::filesystem::exists(path), "Hdf5TokenDataset: '{}': no such file", path);
      CS_CHECK(std::filesystem::is_regular_file(path), "Hdf5TokenDataset: '{}': not a regular file",
               path);
      hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      if (f < 0)
        fail("Hdf5TokenDataset: '{}': cannot open as an HDF5 file (not HDF5, or truncated): {}",
             path, h5::error());
      file_ids_.push_back(f);
      if (H5Lexists(f, "data", H5P_DEFAULT) <= 0) {
        H5Eclear2(H5E_DEFAULT);
        fail(
            "Hdf5TokenDataset: '{}': no dataset 'data' (GPT token files hold 'data' of shape "
            "(N, 3, msl))",
            path);
      }
      hid_t d = H5Dopen2(f, "data", H5P_DEFAULT);
      if (d < 0) fail("Hdf5TokenDataset: '{}': cannot open dataset 'data': {}", path, h5::error());
      dset_ids_.push_back(d);
      hid_t type = H5Dget_type(d);
      H5T_class_t cls = H5Tget_class(type);
      size_t elem = H5Tget_size(type);
      H5Tclose(type);
      CS_CHECK(cls == H5T_INTEGER,
               "Hdf5TokenDataset: '{}': dataset 'data' is not of an integer "
               "type (token ids)",
               path);
      hid_t space = H5Dget_space(d);
      int rank = H5Sget_simple_extent_ndims(space);
      hsize_t dims[8] = {};
      if (rank > 0 && rank <= 8) H5Sget_simple_extent_dims(space, dims, nullptr);
      H5Sclose(space);
      std::string shape = "(";
      for (int i = 0; i < rank && i < 8; ++i) shape += (i ? ", " : "") + std::to_string(dims[i]);
      shape += ")";
      CS_CHECK(rank == 3 && dims[1] == 3 && dims[2] >= 1,
               "Hdf5TokenDataset: '{}': dataset 'data' has shape {}, expected (N, 3, msl): input "
               "ids, attention mask and labels per sample",
               path, shape);
      check_rows_stored(d, path, dims, elem);
      int64_t msl = static_cast<int64_t>(dims[2]);
      if (msl_ == 0) msl_ = msl;
      CS_CHECK(msl == msl_,
               "Hdf5TokenDataset: '{}' has sequences of length {} but '{}' has {}; all files "
               "must have the same msl",
               path, msl, paths_[0], msl_);
      starts_.push_back(total_);
      total_ += static_cast<int64_t>(dims[0]);
    }
    starts_.push_back(total_);
  } catch (...) {
    for (auto d : dset_ids_) H5Dclose(d);
    for (auto f : file_ids_) H5Fclose(f);
    throw;
  }
}

Hdf5TokenDataset::~Hdf5TokenDataset() {
  for (auto d : dset_ids_) H5Dclose(d);
  for (auto f : file_ids_) H5Fclose(f);
}

void Hdf5TokenDataset::read_sample(int64_t i, int64_t* ids, int64_t* mask, int64_t* labels) const {
  CS_CHECK(i >= 0 && i < total_, "Hdf5TokenDataset: sample {} is outside 0..{}", i, total_ - 1);
  size_t f = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) -
                                 starts_.begin() - 1);
  int64_t local = i - starts_[f];
  h5::quiet();
  std::vector<int64_t> buf(static_cast<size_t>(3 * msl_));
  hid_t fspace = H5Dget_space(static_cast<hid_t>(dset_ids_[f]));
  hsize_t start[3] = {static_cast<hsize_t>(local), 0, 0};
  hsize_t count[3] = {1, 3, static_cast<hsize_t>(msl_)};
  hsize_t mdims[1] = {static_cast<hsize_t>(3 * msl_)};
  hid_t mspace = H5Screate_simple(1, mdims, nullptr);
  herr_t st = H5Sselect_hyperslab(fspace, H5S_SELECT_SET, start, nullptr, count, nullptr);
  if (st >= 0)
    st = H5Dread(static_cast<hid_t>(dset_ids_[f]), H5T_NATIVE_INT64, mspace, fspace, H5P_DEFAULT,
                 buf.data());
  std::string err = st < 0 ? h5::error() : "";
  H5Sclose(mspace);
  H5Sclose(fspace);
  if (st < 0)
    fail(
        "Hdf5TokenDataset: '{}': reading sample {} (sample {} of the file) failed (truncated or "
        "corrupt file?): {}",
        paths_[f], i, local, err);
  // The mask weighs each token's loss: 1 counted, 0 not. Another value weighed a token twice
  // (2) or against the loss (-1); a row that counts no token made the loss of a batch of such
  // rows an average over nothing, NaN.
  bool counted = false;
  for (int64_t t = 0; t < msl_; ++t) {
    const int64_t m = buf[static_cast<size_t>(msl_ + t)];
    if (m != 0 && m != 1)
      fail(
          "Hdf5TokenDataset: '{}': sample {} (of the file), attention_mask[{}] is {}: it must "
          "be 0 (padding) or 1 (a counted token)",
          paths_[f], local, t, m);
    counted |= m == 1;
  }
  if (!counted)
    fail(
        "Hdf5TokenDataset: '{}': sample {} (of the file) has no counted token (its "
        "attention_mask is all 0): its loss would be an average over nothing",
        paths_[f], local);
  std::copy(buf.begin(), buf.begin() + msl_, ids);
  std::copy(buf.begin() + msl_, buf.begin() + 2 * msl_, mask);
  std::copy(buf.begin() + 2 * msl_, buf.end(), labels);
}

std::pair<std::string, int64_t> Hdf5TokenDataset::locate(int64_t i) const {
  CS_CHECK(i >= 0 && i < total_, "Hdf5TokenDataset: sample {} is outside 0..{}", i, total_ - 1);
  size_t f = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), i) -
                                 starts_.begin() - 1);
  return {paths_[f], i - starts_[f]};
}

Sample Hdf5TokenDataset::get(int64_t i) const {
  int64_t *a, *b, *c;
  Sample s{{"input_ids", detail::host_tensor({msl_}, DType::i64, &a)},
           {"attention_mask", detail::host_tensor({msl_}, DType::i64, &b)},
           {"labels", detail::host_tensor({msl_}, DType::i64, &c)}};
  read_sample(i, a, b, c);
  return s;
}

Batch Hdf5TokenDataset::get_batch(const std::vector<int64_t>& idx) const {
  int64_t n = static_cast<int64_t>(idx.size());
  int64_t *a, *b, *c;
  Batch out{{"input_ids", detail::host_tensor({n, msl_}, DType::i64, &a)},
            {"attention_mask", detail::host_tensor({n, msl_}, DType::i64, &b)},
            {"labels", detail::host_tensor({n, msl_}, DType::i64, &c)}};
  for (int64_t j = 0; j < n; ++j)
    read_sample(idx[static_cast<size_t>(j)], a + j * msl_, b + j * msl_, c + j * msl_);
  return out;
}

}  // namespace cstorch::data
