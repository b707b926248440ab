// MnistDataset: MNIST IDX files as a map-style dataset (see cstorch/data/mnist.h).
#include <cstring>

#include "cstorch/data/mnist.h"
#include "data/host_tensor.h"

namespace cstorch::data {

MnistDataset::MnistDataset(const std::string& dir, const std::string& split, MnistOptions o)
    : split_(load_mnist_split(dir, split)), o_(o), n_(split_.images.dims[0]) {
  for (int p = 0; p < 256; ++p) {
    float v = static_cast<float>(p) / 255.0f;
    lut_[p] = o_.normalize ? (v - 0.1307f) / 0.3081f : v;
  }
}

Sample MnistDataset::get(int64_t i) const {
  CS_CHECK(i >= 0 && i < n_, "MnistDataset: sample {} is outside 0..{}", i, n_ - 1);
  Shape xs = o_.flatten ? Shape{kMnistPixels} : Shape{1, kMnistRows, kMnistCols};
  float* x = nullptr;
  int64_t* y = nullptr;
  Tensor xt = detail::host_tensor(xs, DType::f32, &x);
  Tensor yt = detail::host_tensor({}, DType::i64, &y);
  const uint8_t* img = split_.images.data.data() + static_cast<size_t>(i) * kMnistPixels;
  for (int p = 0; p < kMnistPixels; ++p) x[p] = lut_[img[p]];
  *y = split_.labels.data[static_cast<size_t>(i)];
  return Sample{{"x", std::move(xt)}, {"y", std::move(yt)}};
}

Batch MnistDataset::get_batch(const std::vector<int64_t>& idx) const {
  const int64_t b = static_cast<int64_t>(idx.size());
  Shape xs = o_.flatten ? Shape{b, kMnistPixels} : Shape{b, 1, kMnistRows, kMnistCols};
  float* x = nullptr;
  int64_t* y = nullptr;
  Tensor xt = detail::host_tensor(xs, DType::f32, &x);
  Tensor yt = detail::host_tensor({b}, DType::i64, &y);
  for (int64_t j = 0; j < b; ++j) {
    int64_t i = idx[static_cast<size_t>(j)];
    CS_CHECK(i >= 0 && i < n_, "MnistDataset: sample {} is outside 0..{}", i, n_ - 1);
    const uint8_t* img = split_.images.data.data() + static_cast<size_t>(i) * kMnistPixels;
    float* dst = x + j * kMnistPixels;
    for (int p = 0; p < kMnistPixels; ++p) dst[p] = lut_[img[p]];
    y[j] = split_.labels.data[static_cast<size_t>(i)];
  }
  return Batch{{"x", std::move(xt)}, {"y", std::move(yt)}};
}

std::shared_ptr<utils::data::Loader> mnist_input_fn(const Config& args,
                                                    const utils::data::WorkerInfo& w) {
  // Each argument checked by name (a missing key or a wrong type otherwise surfaced as the JSON
  // library's own words, naming neither).
  const char* const kArgs = "data_dir, split, batch_size (required), shuffle, drop_last, seed";
  CS_CHECK(args.is_object(), "mnist_input_fn: the arguments must be a map ({}), got {}", kArgs,
           args.dump());
  for (const auto& [k, v] : args.items())
    CS_CHECK(k == "data_dir" || k == "split" || k == "batch_size" || k == "shuffle" ||
                 k == "drop_last" || k == "seed",
             "mnist_input_fn: unknown argument '{}' (it takes {})", k, kArgs);
  auto need = [&](const char* k, bool ok, const char* what) -> const Config& {
    CS_CHECK(args.contains(k), "mnist_input_fn: missing argument '{}' ({}; it takes {})", k, what,
             kArgs);
    CS_CHECK(ok, "mnist_input_fn: '{}' must be {}, got {}", k, what, args.at(k).dump());
    return args.at(k);
  };
  auto is = [&](const char* k, bool (Config::*pred)() const) {
    return args.contains(k) && (args.at(k).*pred)();
  };
  const std::string data_dir =
      need("data_dir", is("data_dir", &Config::is_string), "a folder name").get<std::string>();
  const std::string split =
      need("split", is("split", &Config::is_string), "\"train\" or \"test\"").get<std::string>();
  CS_CHECK(split == "train" || split == "test",
           "mnist_input_fn: 'split' must be \"train\" or \"test\", got \"{}\"", split);
  const bool train = split == "train";
  LoaderOptions o;
  o.batch_size = need("batch_size",
                      is("batch_size", &Config::is_number_integer) &&
                          args.at("batch_size").get<int64_t>() >= 1,
                      "a whole number of at least 1")
                     .get<int64_t>();
  auto flag = [&](const char* k, bool def) {
    if (!args.contains(k)) return def;
    return need(k, is(k, &Config::is_boolean), "true or false").get<bool>();
  };
  o.shuffle = flag("shuffle", train);
  o.drop_last = flag("drop_last", train);
  o.seed =
      args.contains("seed")
          ? need("seed",
                 is("seed", &Config::is_number_integer) &&
                     (args.at("seed").is_number_unsigned() || args.at("seed").get<int64_t>() >= 0),
                 "a whole number of 0 or more")
                .get<uint64_t>()
          : 0;
  o.worker = w;
  return std::make_shared<DatasetLoader>(std::make_shared<MnistDataset>(data_dir, split), o);
}

}  // namespace cstorch::data
