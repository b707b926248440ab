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
  const std::string split = args.at("split").get<std::string>();
  const bool train = split == "train";
  LoaderOptions o;
  o.batch_size = args.at("batch_size").get<int64_t>();
  o.shuffle = args.value("shuffle", train);
  o.seed = args.value("seed", uint64_t{0});
  o.drop_last = args.value("drop_last", train);
  o.worker = w;
  return std::make_shared<DatasetLoader>(
      std::make_shared<MnistDataset>(args.at("data_dir").get<std::string>(), split), o);
}

}  // namespace cstorch::data
