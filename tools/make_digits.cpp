// make_digits: writes a deterministic synthetic MNIST data set (the four IDX files under their
// real MNIST names) and optionally prints a few samples as ASCII art.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

#include <CLI/CLI.hpp>

#include "cstorch/core/error.h"
#include "cstorch/data/mnist.h"

int main(int argc, char** argv) {
  CLI::App app{"Write a synthetic MNIST-like digits data set (IDX files) with no download"};
  std::string out;
  int64_t n_train = 60000, n_test = 10000;
  uint64_t seed = 0;
  int show = 0;
  app.add_option("--out", out, "Output directory (created if missing)")->required();
  app.add_option("--train", n_train, "Number of training samples")
      ->check(CLI::Range(1, 2147483647));
  app.add_option("--test", n_test, "Number of test samples")->check(CLI::Range(1, 2147483647));
  app.add_option("--seed", seed, "Seed; the same seed gives byte-identical files everywhere");
  app.add_option("--show", show, "Print this many training samples as ASCII art")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    cstorch::data::write_synthetic_mnist(out, n_train, n_test, seed);
    std::printf("wrote %lld train + %lld test samples (seed %llu) to %s\n",
                static_cast<long long>(n_train), static_cast<long long>(n_test),
                static_cast<unsigned long long>(seed), out.c_str());
    if (show > 0) {
      // Read back what was written, so the printout shows exactly the file contents.
      const auto train = cstorch::data::load_mnist_split(out, "train");
      const int64_t k = std::min<int64_t>(show, train.labels.dims[0]);
      for (int64_t i = 0; i < k; ++i) {
        std::printf(
            "sample %lld: label %d\n%s\n", static_cast<long long>(i),
            train.labels.data[static_cast<size_t>(i)],
            cstorch::data::ascii_art(train.images.data.data() + i * cstorch::data::kMnistPixels)
                .c_str());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_digits: %s\n", e.what());
    return 1;
  }
  return 0;
}
