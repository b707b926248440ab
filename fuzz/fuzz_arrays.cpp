// libFuzzer target: the readers of user data arrays (data/arrays.h). The first input byte picks
// the reader (mod 5: 0 .npy, 1 .npz, 2 HDF5, 3 delimited text, 4 JSON Lines text), the rest is
// the file. An array that reads is converted to a tensor of f32 and of i64, as a data
// processor would; JSON Lines documents are tokenized with a small BPE vocabulary made once.
#include "cstorch/data/arrays.h"
#include "cstorch/data/tokenizer.h"
#include "fuzz_util.h"

namespace {
const cstorch::data::BpeTokenizer& tokenizer() {
  static const cstorch::data::BpeTokenizer tok = [] {
    const std::string v = cstorch::fuzz::scratch_dir() + "/jsonl_vocab.json";
    const std::string m = cstorch::fuzz::scratch_dir() + "/jsonl_merges.txt";
    cstorch::data::train_bpe(
        {" the cat sat", " the dog ran"},
        {.vocab_size = 300, .min_frequency = 1, .special_tokens = {"<|endoftext|>"}}, v, m);
    return cstorch::data::BpeTokenizer::from_files(v, m);
  }();
  return tok;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cstorch;
  if (size < 1) return 0;
  const int reader = data[0] % 5;
  static const char* const kNames[] = {"input.npy", "input.npz", "input.h5", "input.csv",
                                       "input.jsonl"};
  const std::string path =
      fuzz::write_scratch(kNames[reader], {reinterpret_cast<const char*>(data) + 1, size - 1});
  auto use = [](const data::HostArray& a) {
    FUZZ_CATCH(data::array_to_tensor(a, DType::f32));
    FUZZ_CATCH(data::array_to_tensor(a, DType::i64));
  };
  FUZZ_CATCH({
    switch (reader) {
      case 0:
        use(data::read_npy(path));
        break;
      case 1:
        for (const auto& name : data::npz_names(path)) FUZZ_CATCH(use(data::read_npz(path, name)));
        break;
      case 2:
        // The names the corpus's files use; any other is an error listing the file's datasets.
        for (const char* name : {"x", "y", "g/z"}) FUZZ_CATCH(use(data::read_h5_array(path, name)));
        break;
      case 4:
        // The text field by its usual name and by another; ids checked against a vocabulary
        // smaller than the tokenizer's, as a model's vocab_size may be.
        FUZZ_CATCH(data::tokenize_jsonl({path}, tokenizer(), "text", 0, 0));
        FUZZ_CATCH(data::tokenize_jsonl({path}, tokenizer(), "body", 1, 40));
        break;
      default: {
        data::CsvArrayOptions labelled;  // the first column as the labels
        labelled.labels.push_back(data::ColumnRef{"", 0});
        FUZZ_CATCH(data::read_csv_arrays({path}, labelled));
        data::CsvArrayOptions plain;
        plain.header = false;
        data::read_csv_arrays({path}, plain);
      }
    }
  });
  return 0;
}
