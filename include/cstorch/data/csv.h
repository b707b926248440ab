// Numeric CSV files as a map-style dataset: one sample per data row.
//
// The first line names the columns (required). Each column becomes a 0-d sample entry named
// after it: f32 by default, i64 for the columns listed in `int_columns`; columns listed in a
// `groups` entry are instead gathered, in the listed order, into one f32 vector named by the
// group (e.g. {"x", {"a", "b", "c"}} gives "x" of shape [3]). Fields are trimmed of spaces;
// quoting is not supported. Empty lines are skipped. The file is parsed when the dataset is
// built.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "cstorch/data/dataset.h"

namespace cstorch::data {

struct CsvOptions {
  char delimiter = ',';
  std::vector<std::string> int_columns;
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
};

class CsvDataset : public Dataset {
 public:
  // Errors (naming the file, and the line, sample and column where it applies): missing or
  // empty file, an empty or repeated column name, a row with the wrong number of fields, a
  // field that is not a number (not an integer in an int column), an option naming an unknown
  // column or one column twice.
  CsvDataset(const std::string& path, CsvOptions opts = {});
  int64_t size() const override { return rows_; }
  Sample get(int64_t index) const override;
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  const std::vector<std::string>& columns() const { return names_; }

 private:
  struct Out {
    std::string name;
    std::vector<size_t> cols;  // source columns
    bool is_int = false, vector = false;
  };
  std::string path_;
  std::vector<std::string> names_;
  std::vector<std::vector<double>> f_;   // per column (float columns)
  std::vector<std::vector<int64_t>> i_;  // per column (int columns)
  std::vector<bool> is_int_;
  std::vector<Out> outs_;
  int64_t rows_ = 0;
};

}  // namespace cstorch::data
