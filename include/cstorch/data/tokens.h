// Language-model token data as map-style datasets. Every sample has "input_ids", "labels" and
// "attention_mask", each i64 of shape [msl] (max sequence length).
//
// * Hdf5TokenDataset: GPT-style HDF5 files (as the Model Zoo's preprocessing writes them) with
//   an integer dataset `data` of shape (N, 3, msl): row 0 input ids, row 1 the attention / loss
//   mask, row 2 the labels. Several files form one data set (samples in file order). Read with
//   the HDF5 C API one sample (hyperslab) at a time; files stay open while the dataset lives.
// * BinaryTokenDataset: a flat file of little-endian tokens (uint16, int32, uint32 or int64);
//   sample i is tokens [i*msl, i*msl + msl] split into inputs (the first msl) and labels (the
//   last msl: inputs shifted by one); the mask is all ones. N = (tokens - 1) / msl.
//
// Errors (cstorch::Error) name the file and, for reads, the sample: a missing file, a file that
// is not HDF5 or is truncated, no `data` dataset, a shape other than (N, 3, msl), files with
// different msl, a non-integer type, a binary file whose size is not a whole number of tokens
// or holds fewer than msl + 1 tokens, a token >= vocab_size (when given).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cstorch/data/dataset.h"

namespace cstorch::data {

class Hdf5TokenDataset : public Dataset {
 public:
  // `files`: HDF5 paths, or one directory whose *.h5 / *.hdf5 files (sorted by name) are used.
  explicit Hdf5TokenDataset(std::vector<std::string> files);
  ~Hdf5TokenDataset() override;
  int64_t size() const override { return total_; }
  int64_t max_sequence_length() const { return msl_; }
  Sample get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  const std::vector<std::string>& files() const { return paths_; }
  // The file holding sample `index` and the sample's row in that file.
  std::pair<std::string, int64_t> locate(int64_t index) const;

 private:
  void read_sample(int64_t index, int64_t* ids, int64_t* mask, int64_t* labels) const;
  std::vector<std::string> paths_;
  std::vector<int64_t> file_ids_, dset_ids_;  // hid_t
  std::vector<int64_t> starts_;               // first global sample of each file, then total
  int64_t msl_ = 0, total_ = 0;
};

enum class TokenType { u16, i32, u32, i64 };

class BinaryTokenDataset : public Dataset {
 public:
  // vocab_size > 0: every token read is checked against it.
  BinaryTokenDataset(std::string path, int64_t msl, TokenType type = TokenType::u16,
                     int64_t vocab_size = 0);
  ~BinaryTokenDataset() override;
  int64_t size() const override { return n_; }
  Sample get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

 private:
  void read_sample(int64_t index, int64_t* ids, int64_t* labels) const;
  std::string path_;
  int64_t msl_, vocab_, n_ = 0;
  TokenType type_;
  size_t tsize_;
  int fd_ = -1;
};

// Writes `tokens` as a flat binary token file of `type` (for tests and tools; crash-safe like
// write_idx). Errors: a token that does not fit the type, a write failure (naming the path).
void write_binary_tokens(const std::string& path, const std::vector<int64_t>& tokens,
                         TokenType type = TokenType::u16);

}  // namespace cstorch::data
