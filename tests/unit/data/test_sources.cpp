// Data sources and composable datasets: MNIST IDX, GPT-style HDF5 token files (written by
// h5py), flat binary token files, CSV, iterable streams with sharding and transforms; their
// values, restartable state, and the errors a DataLoader worker reports for bad files (naming
// the worker, the file and the sample) without hanging.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>

#include "cstorch/cstorch.h"
#include "cstorch/data/csv.h"
#include "cstorch/data/dataset.h"
#include "cstorch/data/mnist.h"
#include "cstorch/data/tokens.h"
#include "cstorch/utils/data.h"
#include "unit/test_util.h"

namespace cs = cstorch;
namespace fs = std::filesystem;
using cs::Batch;
using cs::Config;
using cs::testing::expect_error;
using cs::utils::data::DataLoader;
using cs::utils::data::Loader;
using cs::utils::data::WorkerInfo;
using namespace cs::data;

namespace {

// A fresh directory for this process, removed at exit.
struct TempRoot {
  fs::path path;
  TempRoot() : path(fs::temp_directory_path() / ("cstorch_sources_" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempRoot() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};
fs::path temp_root() {
  static TempRoot root;
  return root.path;
}

template <class F>
void within_timeout(F body) {
  auto fut = std::async(std::launch::async, body);
  ASSERT_EQ(fut.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "timed out: a thread is hanging";
  fut.get();
}

// A DataLoader whose workers batch `make(worker)` (no shuffle).
DataLoader loader_over(std::function<std::shared_ptr<Dataset>()> make, int workers, int64_t batch) {
  return DataLoader(
      [make, batch](const Config&, const WorkerInfo& w) -> std::shared_ptr<Loader> {
        LoaderOptions o;
        o.batch_size = batch;
        o.worker = w;
        return std::make_shared<DatasetLoader>(make(), o);
      },
      {{"num_workers", workers}});
}

std::vector<int64_t> i64(const cs::Tensor& t) {
  return t.to_vector<int64_t>();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Composition

TEST(Datasets, CollateAndTransforms) {
  Batch data{{"v", cs::from_vector(std::vector<float>{0, 1, 2, 3, 4, 5}, {3, 2})},
             {"id", cs::from_vector(std::vector<int64_t>{10, 11, 12}, {3})}};
  auto ds = std::make_shared<TensorDataset>(data);
  auto s = ds->get(1);
  EXPECT_EQ(s.at("v").shape(), (cs::Shape{2}));
  EXPECT_EQ(s.at("id").item<int64_t>(), 11);
  auto doubled = map(ds, [](Sample x) {
    x["v"] = x.at("v") * 2.0;
    return x;
  });
  auto b = doubled->get_batch({2, 0});
  EXPECT_EQ(b.at("v").to_vector<float>(), (std::vector<float>{8, 10, 0, 2}));
  EXPECT_EQ(i64(b.at("id")), (std::vector<int64_t>{12, 10}));
  EXPECT_EQ(ds->get_batch({2, 0}).at("v").to_vector<float>(), (std::vector<float>{4, 5, 0, 1}));
  EXPECT_ERROR(ds->get(3), "index 3 is outside 0..2");
  EXPECT_ERROR(collate({Sample{{"a", cs::zeros({2})}}, Sample{{"a", cs::zeros({3})}}}),
               "collate: 'a' of sample 1 is f32[3] but sample 0 has f32[2]");
  EXPECT_ERROR(collate({Sample{{"a", cs::zeros({2})}}, Sample{{"b", cs::zeros({2})}}}),
               "sample 1 has no 'a'");
  // A map-style dataset's batch names its samples by dataset index (and batch position).
  auto ragged = map(ds, [](Sample x) {
    if (x.at("id").item<int64_t>() == 12) x["v"] = cs::zeros({3});
    return x;
  });
  EXPECT_ERROR(ragged->get_batch({1, 2}),
               "collate: 'v' of sample 2 (position 1 in the batch) is f32[3] but sample 1 "
               "(position 0 in the batch) has f32[2]");
  // A transform that throws is reported with the sample index.
  auto broken = map(ds, [](Sample x) -> Sample {
    if (x.at("id").item<int64_t>() == 12) cs::fail("cannot decode");
    return x;
  });
  EXPECT_ERROR(broken->get_batch({0, 2}), "sample 2", "cannot decode");
}

TEST(Datasets, EpochIndicesShardAndShuffle) {
  auto all = epoch_indices(10, false, 0, 0, {});
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(epoch_indices(10, false, 0, 0, {1, 3}), (std::vector<int64_t>{1, 4, 7}));
  auto e0 = epoch_indices(50, true, 9, 0, {}), e1 = epoch_indices(50, true, 9, 1, {});
  EXPECT_NE(e0, e1);  // a new order every epoch
  EXPECT_EQ(e0, epoch_indices(50, true, 9, 0, {}));
  EXPECT_EQ(std::set<int64_t>(e1.begin(), e1.end()).size(), 50u);
  std::set<int64_t> shards;
  for (int w = 0; w < 3; ++w)
    for (auto i : epoch_indices(50, true, 9, 1, {w, 3})) EXPECT_TRUE(shards.insert(i).second);
  EXPECT_EQ(shards.size(), 50u);
}

TEST(Datasets, DropLastAndBatchTransform) {
  auto ds = std::make_shared<TensorDataset>(
      Batch{{"id", cs::from_vector(std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6}, {7})}});
  LoaderOptions o;
  o.batch_size = 3;
  o.drop_last = true;
  o.batch_transform = [](Batch b) {
    b["n"] = cs::scalar_tensor(static_cast<double>(b.at("id").size(0)));
    return b;
  };
  DatasetLoader l(ds, o);
  EXPECT_EQ(l.size(), 2);
  auto b0 = l.next(), b1 = l.next(), b2 = l.next();
  ASSERT_TRUE(b0 && b1);
  EXPECT_FALSE(b2);
  EXPECT_EQ(i64(b1->at("id")), (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(b1->at("n").item<float>(), 3.0f);
  o.drop_last = false;
  DatasetLoader keep(ds, o);
  EXPECT_EQ(keep.size(), 3);
}

TEST(Datasets, IterableStreamsShardedOverWorkersExactlyOnceAndRestartable) {
  auto make = [](const Config&, const WorkerInfo& w) -> std::shared_ptr<Loader> {
    std::vector<int64_t> ids(37);
    for (int64_t i = 0; i < 37; ++i) ids[static_cast<size_t>(i)] = i;
    auto ds = std::make_shared<TensorDataset>(Batch{{"id", cs::from_vector(ids, {37})}});
    auto stream = map(shard(as_iterable(ds), w), [](Sample s) {
      s["twice"] = s.at("id") * 2.0;
      return s;
    });
    LoaderOptions o;
    o.batch_size = 4;
    return std::make_shared<IterableLoader>(stream, o);
  };
  for (int workers : {1, 2, 4}) {
    DataLoader dl(make, {{"num_workers", workers}});
    std::multiset<int64_t> seen;
    while (auto b = dl.next()) {
      auto ids = i64(b->at("id")), tw = i64(b->at("twice"));
      for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(tw[i], 2 * ids[i]);
      seen.insert(ids.begin(), ids.end());
    }
    EXPECT_EQ(seen.size(), 37u) << workers << " workers";
    EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 37u);
  }
  // Resume in the middle of the second epoch.
  std::vector<std::vector<int64_t>> ref;
  {
    DataLoader dl(make, {{"num_workers", 2}});
    while (ref.size() < 20)
      if (auto b = dl.next()) ref.push_back(i64(b->at("id")));
  }
  cs::State st;
  {
    DataLoader dl(make, {{"num_workers", 2}});
    for (size_t got = 0; got < 13;)
      if (auto b = dl.next()) {
        ASSERT_EQ(i64(b->at("id")), ref[got]);
        ++got;
      }
    st = dl.state_dict();
  }
  DataLoader resumed(make, {{"num_workers", 2}});
  resumed.load_state_dict(st);
  for (size_t got = 13; got < ref.size();)
    if (auto b = resumed.next()) {
      ASSERT_EQ(i64(b->at("id")), ref[got]);
      ++got;
    }
}

// ---------------------------------------------------------------------------------------------
// MNIST

TEST(MnistDataset, MatchesTheIdxFilesAndLoadsThroughWorkers) {
  auto dir = (temp_root() / "mnist").string();
  write_synthetic_mnist(dir, 120, 30, 5);
  auto split = load_mnist_split(dir, "train");
  MnistDataset ds(dir, "train");
  ASSERT_EQ(ds.size(), 120);
  auto b = ds.get_batch({7, 3});
  ASSERT_EQ(b.at("x").shape(), (cs::Shape{2, 784}));
  auto x = b.at("x").to_vector<float>();
  for (int p = 0; p < 784; ++p)
    EXPECT_FLOAT_EQ(
        x[static_cast<size_t>(784 + p)],
        (split.images.data[3 * 784 + static_cast<size_t>(p)] / 255.0f - 0.1307f) / 0.3081f);
  EXPECT_EQ(i64(b.at("y")), (std::vector<int64_t>{split.labels.data[7], split.labels.data[3]}));
  MnistDataset raw(dir, "test", {.normalize = false, .flatten = false});
  auto s = raw.get(2);
  EXPECT_EQ(s.at("x").shape(), (cs::Shape{1, 28, 28}));
  EXPECT_EQ(s.at("y").dim(), 0);
  auto split_t = load_mnist_split(dir, "test");
  EXPECT_FLOAT_EQ(s.at("x").to_vector<float>()[400], split_t.images.data[2 * 784 + 400] / 255.0f);
  // Through a DataLoader with 2 workers: every label of the epoch once.
  auto dl = loader_over([dir] { return std::make_shared<MnistDataset>(dir, "train"); }, 2, 16);
  std::vector<int64_t> counts(10, 0);
  int64_t n = 0;
  while (auto batch = dl.next())
    for (auto y : i64(batch->at("y"))) {
      ++counts[static_cast<size_t>(y)];
      ++n;
    }
  EXPECT_EQ(n, 120);
  for (auto c : counts) EXPECT_EQ(c, 12);  // the generator balances labels
}

TEST(MnistDataset, MissingAndTruncatedFilesNameWorkerFileAndSample) {
  within_timeout([] {
    auto missing = (temp_root() / "no_such_mnist").string();
    auto dl =
        loader_over([missing] { return std::make_shared<MnistDataset>(missing, "train"); }, 2, 8);
    EXPECT_ERROR(dl.next(), "DataLoader worker 0 of 2", "input_fn failed",
                 "train-images-idx3-ubyte");
  });
  within_timeout([] {
    auto dir = (temp_root() / "mnist_trunc").string();
    write_synthetic_mnist(dir, 50, 10, 1);
    // Keep the 16-byte header and 20 whole images plus part of the 21st.
    fs::resize_file(fs::path(dir) / "train-images-idx3-ubyte", 16 + 20 * 784 + 100);
    auto dl = loader_over([dir] { return std::make_shared<MnistDataset>(dir, "train"); }, 2, 8);
    EXPECT_ERROR(dl.next(), "DataLoader worker 0 of 2", "train-images-idx3-ubyte", "truncated",
                 "sample 20 of 50 is the first one cut short");
  });
}

// ---------------------------------------------------------------------------------------------
// HDF5 token files

class Hdf5Tokens : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = temp_root() / "h5";
    std::string cmd = std::string(CSTORCH_PYTHON) + " " + CSTORCH_SOURCE_DIR +
                      "/tests/unit/data/make_token_files.py " + dir_.string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  static std::string path(const std::string& name) { return (dir_ / name).string(); }
  static fs::path dir_;
};
fs::path Hdf5Tokens::dir_;

TEST_F(Hdf5Tokens, ReadsSamplesAcrossFiles) {
  Hdf5TokenDataset ds({path("dir")});  // a directory: a.h5 (5 samples, i32), b.h5 (3, i64)
  ASSERT_EQ(ds.size(), 8);
  EXPECT_EQ(ds.max_sequence_length(), 8);
  auto b = ds.get_batch({6, 1});
  ASSERT_EQ(b.at("input_ids").shape(), (cs::Shape{2, 8}));
  auto ids = i64(b.at("input_ids")), mask = i64(b.at("attention_mask")),
       labels = i64(b.at("labels"));
  for (int64_t r = 0; r < 2; ++r) {
    int64_t g = r == 0 ? 6 : 1;
    for (int64_t k = 0; k < 8; ++k) {
      EXPECT_EQ(ids[static_cast<size_t>(r * 8 + k)], 1000 * g + k);
      EXPECT_EQ(mask[static_cast<size_t>(r * 8 + k)], k < 6 ? 1 : 0);
      EXPECT_EQ(labels[static_cast<size_t>(r * 8 + k)], 1000 * g + k + 1);
    }
  }
  auto s = ds.get(4);
  EXPECT_EQ(s.at("labels").shape(), (cs::Shape{8}));
  EXPECT_EQ(i64(s.at("input_ids"))[3], 4003);
  // Two workers, batch 3: every sample of the epoch once.
  auto files = path("dir");
  auto dl = loader_over(
      [files] { return std::make_shared<Hdf5TokenDataset>(std::vector<std::string>{files}); }, 2,
      3);
  std::multiset<int64_t> firsts;
  while (auto batch = dl.next()) {
    auto v = i64(batch->at("input_ids"));
    for (size_t i = 0; i < v.size(); i += 8) firsts.insert(v[i] / 1000);
  }
  EXPECT_EQ(firsts, (std::multiset<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

TEST_F(Hdf5Tokens, BadFilesAreClearErrors) {
  using V = std::vector<std::string>;
  EXPECT_ERROR(Hdf5TokenDataset(V{path("missing.h5")}), "missing.h5", "no such file");
  EXPECT_ERROR(Hdf5TokenDataset(V{path("not_hdf5.h5")}), "not_hdf5.h5",
               "cannot open as an HDF5 file");
  EXPECT_ERROR(Hdf5TokenDataset(V{path("truncated.h5")}), "truncated.h5",
               "cannot open as an HDF5 file (not HDF5, or truncated)");
  EXPECT_ERROR(Hdf5TokenDataset(V{path("bad_shape.h5")}), "bad_shape.h5", "shape (4, 2, 8)",
               "expected (N, 3, msl)");
  EXPECT_ERROR(Hdf5TokenDataset(V{path("dir/a.h5"), path("bad_msl.h5")}), "bad_msl.h5", "length 6",
               "has 8");
  EXPECT_ERROR(Hdf5TokenDataset(V{path("floats.h5")}), "floats.h5", "not of an integer type");
  EXPECT_ERROR(Hdf5TokenDataset(V{path("no_data.h5")}), "no_data.h5", "no dataset 'data'");
  EXPECT_ERROR(Hdf5TokenDataset(V{}), "no files given");
  // Mask values other than 0 / 1 (a 2 weighed its token twice), and a sample that counts no
  // token (a batch of such samples had a NaN loss), named when the sample is read.
  Hdf5TokenDataset two(V{path("mask_two.h5")});
  (void)two.get(0);
  EXPECT_ERROR(two.get(1), "mask_two.h5", "sample 1", "attention_mask[3] is 2", "0 (padding) or 1");
  Hdf5TokenDataset none(V{path("no_token.h5")});
  (void)none.get(1);
  EXPECT_ERROR(none.get(2), "no_token.h5", "sample 2", "no counted token");
}

TEST_F(Hdf5Tokens, WorkerErrorsNameWorkerFileAndSample) {
  within_timeout([] {
    // corrupt.h5 opens, but sample 3's compressed chunk is garbage. With 2 workers and batch 1,
    // worker 1 reads samples 1, 3, 5: its second batch fails.
    auto file = path("corrupt.h5");
    auto dl = loader_over(
        [file] { return std::make_shared<Hdf5TokenDataset>(std::vector<std::string>{file}); }, 2,
        1);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(dl.next().has_value()) << i;
    EXPECT_ERROR(dl.next(), "DataLoader worker 1 of 2", "corrupt.h5", "reading sample 3");
  });
  within_timeout([] {
    auto file = path("truncated.h5");
    auto dl = loader_over(
        [file] { return std::make_shared<Hdf5TokenDataset>(std::vector<std::string>{file}); }, 3,
        2);
    EXPECT_ERROR(dl.next(), "DataLoader worker 0 of 3", "truncated.h5");
  });
  within_timeout([] {
    auto file = path("bad_shape.h5");
    auto dl = loader_over(
        [file] { return std::make_shared<Hdf5TokenDataset>(std::vector<std::string>{file}); }, 2,
        2);
    EXPECT_ERROR(dl.size(), "DataLoader worker 0 of 2", "bad_shape.h5", "(4, 2, 8)");
  });
}

// ---------------------------------------------------------------------------------------------
// Flat binary token files

TEST(BinaryTokens, InputsAndShiftedLabels) {
  for (auto type : {TokenType::u16, TokenType::i32, TokenType::u32, TokenType::i64}) {
    auto file = (temp_root() / "tokens.bin").string();
    std::vector<int64_t> tokens(45);
    for (int64_t i = 0; i < 45; ++i) tokens[static_cast<size_t>(i)] = 100 + i;
    write_binary_tokens(file, tokens, type);
    BinaryTokenDataset ds(file, 8, type);
    ASSERT_EQ(ds.size(), 5);  // (45 - 1) / 8
    auto b = ds.get_batch({2, 0});
    auto ids = i64(b.at("input_ids")), labels = i64(b.at("labels"));
    for (int64_t k = 0; k < 8; ++k) {
      EXPECT_EQ(ids[static_cast<size_t>(k)], 100 + 16 + k);
      EXPECT_EQ(labels[static_cast<size_t>(k)], 100 + 17 + k);
      EXPECT_EQ(ids[static_cast<size_t>(8 + k)], 100 + k);
    }
    EXPECT_EQ(i64(b.at("attention_mask")), std::vector<int64_t>(16, 1));
    EXPECT_EQ(i64(ds.get(4).at("labels")).back(), 100 + 40);
  }
}

TEST(BinaryTokens, Errors) {
  auto file = (temp_root() / "bad_tokens.bin").string();
  write_binary_tokens(file, std::vector<int64_t>(21, 7));
  fs::resize_file(file, 41);  // half a token at the end
  EXPECT_ERROR(BinaryTokenDataset(file, 4), "bad_tokens.bin", "41 bytes",
               "not a whole number of 2-byte uint16 tokens");
  write_binary_tokens(file, {1, 2, 3});
  EXPECT_ERROR(BinaryTokenDataset(file, 4), "holds 3 tokens", "needs 5");
  EXPECT_ERROR(BinaryTokenDataset((temp_root() / "none.bin").string(), 4), "cannot open",
               "none.bin");
  EXPECT_ERROR(write_binary_tokens(file, {70000}), "token 70000", "does not fit uint16");
  write_binary_tokens(file, {1, 2, 3, 4, 5, 6, 7, 8, 99, 10, 11});
  BinaryTokenDataset ds(file, 5, TokenType::u16, 50);
  EXPECT_EQ(ds.get(0).at("input_ids").size(0), 5);
  within_timeout([file] {
    auto dl = loader_over(
        [file] { return std::make_shared<BinaryTokenDataset>(file, 5, TokenType::u16, 50); }, 2, 1);
    ASSERT_TRUE(dl.next().has_value());
    EXPECT_ERROR(dl.next(), "DataLoader worker 1 of 2", "bad_tokens.bin", "sample 1",
                 "token 99 at position 3", "vocabulary 0..49");
  });
}

// ---------------------------------------------------------------------------------------------
// CSV

TEST(Csv, ColumnsGroupsAndTypes) {
  auto file = (temp_root() / "t.csv").string();
  std::ofstream(file) << "a, b ,label,w\n1,2,0,0.5\n\n3.5,-4,1,1e-3\n5,6,2,7\n";
  CsvDataset ds(file, {.int_columns = {"label"}, .groups = {{"x", {"b", "a"}}}});
  ASSERT_EQ(ds.size(), 3);
  EXPECT_EQ(ds.columns(), (std::vector<std::string>{"a", "b", "label", "w"}));
  auto b = ds.get_batch({1, 2});
  EXPECT_EQ(b.at("x").shape(), (cs::Shape{2, 2}));
  EXPECT_EQ(b.at("x").to_vector<float>(), (std::vector<float>{-4, 3.5f, 6, 5}));
  EXPECT_EQ(b.at("label").dtype(), cs::DType::i64);
  EXPECT_EQ(i64(b.at("label")), (std::vector<int64_t>{1, 2}));
  EXPECT_FLOAT_EQ(b.at("w").to_vector<float>()[0], 1e-3f);
  auto s = ds.get(0);
  EXPECT_EQ(s.at("label").item<int64_t>(), 0);
  EXPECT_EQ(s.at("x").shape(), (cs::Shape{2}));
  EXPECT_EQ(b.count("a"), 0u);  // grouped columns are not separate entries
  // A UTF-8 byte-order mark is no part of the first column's name.
  std::ofstream(file) << "\xEF\xBB\xBF"
                      << "a,label\n1,0\n";
  CsvDataset bom(file, {.int_columns = {"label"}});
  EXPECT_EQ(bom.columns(), (std::vector<std::string>{"a", "label"}));
}

TEST(Csv, Errors) {
  auto file = (temp_root() / "bad.csv").string();
  std::ofstream(file) << "a,b\n1,2\n3\n";
  EXPECT_ERROR(CsvDataset{file}, "bad.csv", "line 3 (sample 1)", "expected 2 fields, found 1");
  std::ofstream(file) << "a,b\n1,2\n3,x4\n";
  EXPECT_ERROR(CsvDataset{file}, "line 3 (sample 1), column 'b'", "'x4' is not a number");
  std::ofstream(file) << "a,b\n1,2.5\n";
  EXPECT_ERROR(CsvDataset(file, {.int_columns = {"b"}}), "column 'b'", "'2.5' is not an integer");
  EXPECT_ERROR(CsvDataset(file, {.int_columns = {"c"}}), "int_columns names column 'c'");
  std::ofstream(file) << "a,a\n1,2\n";
  EXPECT_ERROR(CsvDataset{file}, "column 'a' repeats");
  std::ofstream(file) << "";
  EXPECT_ERROR(CsvDataset{file}, "bad.csv", "is empty");
  EXPECT_ERROR(CsvDataset{(temp_root() / "none.csv").string()}, "cannot open", "none.csv");
}
