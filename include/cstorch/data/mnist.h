// MNIST data: IDX file reading/writing, loading a train/test split, and a deterministic generator
// of synthetic handwritten-like digits written in the real MNIST file layout (no download needed).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cstorch/data/dataset.h"

namespace cstorch::data {

inline constexpr int kMnistRows = 28;
inline constexpr int kMnistCols = 28;
inline constexpr int kMnistPixels = kMnistRows * kMnistCols;  // 784 bytes per image

// A dense row-major array as stored in an IDX file. Only the unsigned-byte type (0x08) is
// supported, which is what MNIST uses. Invariant: data.size() == product of dims.
struct IdxArray {
  std::vector<int64_t> dims;  // 1..4 dimensions, outermost first, each >= 1
  std::vector<uint8_t> data;  // row-major
};

// Reads an IDX file: bytes 00 00 <type> <rank>, then `rank` big-endian u32 dimensions, then the
// data. Reads the real MNIST files (train-images-idx3-ubyte, ...) unchanged, also as the site
// ships them, gzip-compressed (any file whose bytes are gzip's is decompressed while read; its
// errors then count decompressed bytes, and damaged compressed data is an error). Throws
// cstorch::Error
// naming the file and the problem when it cannot be opened, is shorter than its header, has a bad
// magic, a type other than 0x08, rank 0 or > 4, a zero or absurd (>= 2^31, or > 1 TiB in all)
// dimension, fewer data bytes than the dimensions need, or extra bytes after the data.
IdxArray read_idx(const std::string& path);

// Writes `a` as an unsigned-byte (0x08) IDX file. Crash-safe: writes `path + ".tmp"`, fsyncs it,
// then renames it over `path`, so `path` is either the old file or the complete new one. Throws
// cstorch::Error naming the path if `a` is malformed (rank not 1..4, a dimension outside
// 1..2^32-1, data size != product of dims) or any write step fails.
void write_idx(const std::string& path, const IdxArray& a);

// One MNIST split: images of shape N x 28 x 28 and labels of shape N, each label in 0..9.
struct MnistSplit {
  IdxArray images;
  IdxArray labels;
};

// Loads `{dir}/{prefix}-images-idx3-ubyte` and `{dir}/{prefix}-labels-idx1-ubyte` (or, where a
// file is not there, the same name with `.gz`, as downloaded), where prefix is "train" for split
// "train" and "t10k" for split "test". Throws cstorch::Error for any other
// split name, any read_idx error, images not N x 28 x 28, labels not rank 1, image/label counts
// that differ (naming both files), or a label > 9 (naming the file and the first bad index).
MnistSplit load_mnist_split(const std::string& dir, const std::string& split);

// The names of the four MNIST files (train/t10k images and labels) that `dir` lacks, neither
// plain nor .gz: empty when all are there.
std::vector<std::string> mnist_files_missing(const std::string& dir);

// True if all four MNIST files (train/t10k images and labels, each plain or .gz) exist in `dir`
// as regular files.
// Checks existence only; load_mnist_split validates the contents.
bool mnist_files_exist(const std::string& dir);

// Renders one synthetic digit (0..9) as a 28x28 row-major image, white strokes (up to 255) on
// black, roughly centred in the middle 20x20 box like MNIST. Every random choice (scale, shift,
// rotation, shear, stroke width, stroke jitter, noise) derives from `seed` alone via a
// counter-based hash, so the same (digit, seed) gives the same bytes on every machine. Throws
// cstorch::Error if `digit` is not in 0..9.
void render_digit(int digit, uint64_t seed, uint8_t out[kMnistPixels]);

// Writes a synthetic MNIST data set in `dir` (created if missing) under the four real MNIST file
// names: n_train training and n_test test samples. Labels are balanced (i % 10, shuffled
// deterministically). Output depends only on (n_train, n_test, seed): it is byte-identical on
// every machine and for any OpenMP thread count. Throws cstorch::Error if a count is < 1 or
// > 2^31-1, the directory or a file cannot be written, or `dir` holds some of the four MNIST
// files but not all (an incomplete download, whose files it would overwrite; the error names
// the missing ones). A folder with all four is written over (a fresh synthetic set).
void write_synthetic_mnist(const std::string& dir, int64_t n_train, int64_t n_test, uint64_t seed);

// 28 lines (each ending in '\n') drawing a 28x28 image with characters by intensity, from ' '
// (0) to '@' (255). Each pixel is two characters wide so the digit keeps its aspect ratio in a
// terminal. For debugging and documentation.
std::string ascii_art(const uint8_t* img);

// MNIST as a map-style dataset: sample i is {"x": image i, "y": label i as i64}. Images are
// f32, scaled to [0, 1] and, with `normalize`, standardised with the usual MNIST mean and std
// ((p / 255 - 0.1307) / 0.3081); shape [784] with `flatten`, else [1, 28, 28]. The split is
// read once (load_mnist_split, with its errors: missing or truncated files name the file and
// the first incomplete sample); batches are filled straight from the bytes.
struct MnistOptions {
  bool normalize = true;
  bool flatten = true;
};
class MnistDataset : public Dataset {
 public:
  MnistDataset(const std::string& dir, const std::string& split, MnistOptions opts = {});
  int64_t size() const override { return n_; }
  Sample get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;

 private:
  MnistSplit split_;
  MnistOptions o_;
  int64_t n_;
  float lut_[256];
};

// A DataLoader input_fn over one MNIST split: a DatasetLoader of MnistDataset (normalised,
// flattened) for worker `w`. `args`: data_dir, split ("train" or "test"), batch_size, and
// optionally shuffle and drop_last (default: true for the train split) and seed (0).
std::shared_ptr<utils::data::Loader> mnist_input_fn(const Config& args,
                                                    const utils::data::WorkerInfo& w);

}  // namespace cstorch::data
