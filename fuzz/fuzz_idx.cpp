// libFuzzer target: IDX (MNIST) files. The first input byte picks the mode:
// - even: the rest is one IDX file, read by read_idx;
// - odd: the rest is an MNIST split, a 4-byte little-endian length L, then L bytes of the images
//   file and the labels file after them: load_mnist_split and the MnistDataset over it (every
//   sample as one batch).
#include <cstring>

#include "cstorch/data/mnist.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cstorch;
  if (size < 1) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    FUZZ_CATCH(data::read_idx(fuzz::write_scratch("input.idx", rest)));
    return 0;
  }
  if (rest.size() < 4) return 0;
  uint32_t len = 0;
  std::memcpy(&len, rest.data(), 4);  // little-endian hosts only (x86-64, aarch64)
  rest.remove_prefix(4);
  if (len > rest.size()) len = static_cast<uint32_t>(rest.size());
  fuzz::write_scratch("train-images-idx3-ubyte", rest.substr(0, len));
  fuzz::write_scratch("train-labels-idx1-ubyte", rest.substr(len));
  FUZZ_CATCH(data::load_mnist_split(fuzz::scratch_dir(), "train"));
  FUZZ_CATCH({
    data::MnistDataset ds(fuzz::scratch_dir(), "train");
    std::vector<int64_t> all(static_cast<size_t>(ds.size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
    if (!all.empty()) ds.get_batch(all);
    if (!all.empty()) ds.get(ds.size() - 1);
  });
  return 0;
}
