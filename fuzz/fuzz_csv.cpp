// libFuzzer target: numeric CSV files (data::CsvDataset). The first input byte picks the
// options (bit 0: ';' as the delimiter; bit 1: the first column as an integer column; bit 2:
// the other columns gathered into one vector "v"), the rest is the file. A file that loads is
// read back whole, as samples and as one batch.
#include "cstorch/data/csv.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace cstorch;
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string path =
      fuzz::write_scratch("input.csv", {reinterpret_cast<const char*>(data) + 1, size - 1});
  data::CsvOptions o;
  if (mode & 1) o.delimiter = ';';
  FUZZ_CATCH({
    std::vector<std::string> cols;
    {
      data::CsvDataset plain(path, o);
      cols = plain.columns();
    }
    // The options name columns the file has (and, with bit 7, one it lacks: an error).
    if ((mode & 2) && !cols.empty()) o.int_columns.push_back(cols[0]);
    if ((mode & 4) && cols.size() > 1)
      o.groups.push_back({"v", std::vector<std::string>(cols.begin() + 1, cols.end())});
    if (mode & 128) o.int_columns.push_back("no such column");
    data::CsvDataset ds(path, o);
    std::vector<int64_t> all;
    for (int64_t i = 0; i < ds.size(); ++i) {
      ds.get(i);
      all.push_back(i);
    }
    if (!all.empty()) ds.get_batch(all);
  });
  return 0;
}
