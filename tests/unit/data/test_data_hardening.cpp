// Data files against hostile headers: a vocab.json nested 200000 deep, an HDF5 token file
// whose header claims rows it does not store, a sparse token file. Each is a clear error
// naming the file, found before anything is allocated for the claimed size.
#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "cstorch/data/tokenizer.h"
#include "cstorch/data/tokens.h"
#include "unit/test_util.h"

namespace cs = cstorch;
namespace fs = std::filesystem;
using cs::testing::expect_error;

namespace {

fs::path temp_dir(const std::string& name) {
  return cs::testing::temp_dir("cstorch_data_hardening", name);
}

// A token file with dataset "data" of shape (rows, 3, 8), int32. `written_rows` rows are
// written (the rest are never allocated); `chunk_rows` > 0 makes it chunked.
void write_tokens(const std::string& path, hsize_t rows, hsize_t written_rows,
                  hsize_t chunk_rows = 0) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t dims[3] = {rows, 3, 8};
  hid_t space = H5Screate_simple(3, dims, nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (chunk_rows > 0) {
    hsize_t chunk[3] = {chunk_rows, 3, 8};
    H5Pset_chunk(dcpl, 3, chunk);
  }
  hid_t d = H5Dcreate2(f, "data", H5T_STD_I32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  if (written_rows > 0) {
    std::vector<int32_t> v(static_cast<size_t>(written_rows * 24), 7);
    hsize_t start[3] = {0, 0, 0}, count[3] = {written_rows, 3, 8};
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, count, nullptr);
    hid_t mem = H5Screate_simple(3, count, nullptr);
    H5Dwrite(d, H5T_NATIVE_INT32, mem, space, H5P_DEFAULT, v.data());
    H5Sclose(mem);
  }
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
}

}  // namespace

// Building the "not an integer" message dumped the whole nested value (a recursion per level:
// SIGSEGV); the parse now stops at a depth limit.
TEST(DataHardening, DeeplyNestedVocabJsonIsAnError) {
  auto dir = temp_dir("vocab");
  std::string text;
  for (int i = 0; i < 200000; ++i) text += "{\"a\":";
  text += "1";
  text += std::string(200000, '}');
  auto vocab = dir / "vocab.json", merges = dir / "merges.txt";
  std::ofstream(vocab) << text;
  std::ofstream(merges) << "#version: 0.2\n";
  expect_error([&] { cs::data::BpeTokenizer::from_files(vocab.string(), merges.string()); },
               {"BpeTokenizer: '" + vocab.string() + "'", "nested deeper than 64 levels"});
  // One level too deep for a vocabulary still gets a short message (no dump of the value).
  std::ofstream(vocab, std::ios::trunc) << "{\"a\": {\"b\": [1, 2, 3]}, \"c\": 1}";
  expect_error([&] { cs::data::BpeTokenizer::from_files(vocab.string(), merges.string()); },
               {"token \"a\" has id an object (1 entries)"});
  fs::remove_all(dir);
}

// A header claiming 2^31 rows in a small file: refused before the loader allocates for them.
TEST(DataHardening, Hdf5TokenRowsMustBeStored) {
  auto dir = temp_dir("h5");
  auto claims = (dir / "claims.h5").string();
  write_tokens(claims, hsize_t{1} << 31, 0);
  ASSERT_LT(fs::file_size(claims), 10000u);
  expect_error([&] { cs::data::Hdf5TokenDataset ds({claims}); },
               {"Hdf5TokenDataset: '" + claims + "'", "claims 2147483648 rows of 8 tokens",
                "the file stores 0 bytes of it"});
  auto partial = (dir / "partial.h5").string();
  write_tokens(partial, 1000, 1, 1);  // chunked: one of 1000 chunks written
  expect_error([&] { cs::data::Hdf5TokenDataset ds({partial}); },
               {"Hdf5TokenDataset: '" + partial + "'", "stores 1 of the 1000 chunks"});
  // Complete files, contiguous and chunked, load.
  auto good = (dir / "good.h5").string(), chunked = (dir / "chunked.h5").string();
  write_tokens(good, 5, 5);
  write_tokens(chunked, 5, 5, 2);
  cs::data::Hdf5TokenDataset ds({good, chunked});
  EXPECT_EQ(ds.size(), 10);
  fs::remove_all(dir);
}

// A sparse 1 TiB token file holds no tokens: refused with the file named (the loader used to
// attempt an allocation for every sample it claims and fail with std::bad_alloc).
TEST(DataHardening, SparseBinaryTokenFileIsAnError) {
  auto dir = temp_dir("sparse");
  auto p = (dir / "tokens.bin").string();
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  int rc = ::ftruncate(fd, off_t{1} << 40);
  ::close(fd);
  if (rc != 0) GTEST_SKIP() << "this file system cannot hold a sparse 1 TiB file";
  expect_error([&] { cs::data::BinaryTokenDataset ds(p, 128); },
               {"BinaryTokenDataset: '" + p + "'", "1099511627776 bytes long", "sparse file"});
  // A real (small) file still loads.
  cs::data::write_binary_tokens(p, std::vector<int64_t>(4097, 1), cs::data::TokenType::u16);
  cs::data::BinaryTokenDataset ds(p, 128);
  EXPECT_EQ(ds.size(), 32);
  fs::remove_all(dir);
}
