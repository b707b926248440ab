// CsvDataset: numeric CSV files (see cstorch/data/csv.h).
#include "cstorch/data/csv.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "data/host_tensor.h"

namespace cstorch::data {

namespace {
std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  size_t b = s.find_last_not_of(" \t\r");
  return s.substr(a, b - a + 1);
}
std::vector<std::string> split(const std::string& line, char d) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : line) {
    if (c == d) {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(trim(cur));
  return out;
}
}  // namespace

CsvDataset::CsvDataset(const std::string& path, CsvOptions o) : path_(path) {
  std::error_code ec;
  // Not waited on: a FIFO or device (opening one blocks until a writer comes).
  CS_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec),
           "CsvDataset: cannot open '{}': not a regular file", path);
  std::ifstream in(path);
  CS_CHECK(in.good(), "CsvDataset: cannot open '{}'", path);
  std::string line;
  int64_t lineno = 0;
  bool have_header = false;
  while (!have_header && std::getline(in, line)) {
    ++lineno;
    // A UTF-8 byte-order mark (Excel's "CSV UTF-8") is no part of the first column's name.
    if (lineno == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);
    if (trim(line).empty()) continue;
    names_ = split(line, o.delimiter);
    have_header = true;
  }
  CS_CHECK(have_header, "CsvDataset: '{}' is empty (expected a header line naming the columns)",
           path);
  std::map<std::string, size_t> col;
  for (size_t c = 0; c < names_.size(); ++c) {
    CS_CHECK(!names_[c].empty(), "CsvDataset: '{}' line {}: column {} has no name", path, lineno,
             c + 1);
    CS_CHECK(col.emplace(names_[c], c).second, "CsvDataset: '{}' line {}: column '{}' repeats",
             path, lineno, names_[c]);
  }
  auto find = [&](const std::string& name, const char* opt) {
    auto it = col.find(name);
    CS_CHECK(it != col.end(), "CsvDataset: '{}': {} names column '{}', which the header lacks",
             path, opt, name);
    return it->second;
  };
  is_int_.assign(names_.size(), false);
  for (auto& n : o.int_columns) is_int_[find(n, "int_columns")] = true;
  std::vector<bool> grouped(names_.size(), false);
  for (auto& [g, cols] : o.groups) {
    Out out{g, {}, false, true};
    CS_CHECK(!cols.empty(), "CsvDataset: '{}': group '{}' lists no columns", path, g);
    for (auto& c : cols) {
      size_t k = find(c, "a group");
      CS_CHECK(!grouped[k], "CsvDataset: '{}': column '{}' is in two groups", path, c);
      CS_CHECK(!is_int_[k], "CsvDataset: '{}': column '{}' is an int column and in group '{}'",
               path, c, g);
      grouped[k] = true;
      out.cols.push_back(k);
    }
    outs_.push_back(std::move(out));
  }
  for (size_t c = 0; c < names_.size(); ++c)
    if (!grouped[c]) outs_.push_back(Out{names_[c], {c}, static_cast<bool>(is_int_[c]), false});
  for (auto& out : outs_)
    CS_CHECK(std::count_if(outs_.begin(), outs_.end(),
                           [&](const Out& x) { return x.name == out.name; }) == 1,
             "CsvDataset: '{}': the name '{}' is used twice (a group and a column?)", path,
             out.name);

  f_.resize(names_.size());
  i_.resize(names_.size());
  while (std::getline(in, line)) {
    ++lineno;
    if (trim(line).empty()) continue;
    auto fields = split(line, o.delimiter);
    CS_CHECK(fields.size() == names_.size(),
             "CsvDataset: '{}' line {} (sample {}): expected {} fields, found {}", path, lineno,
             rows_, names_.size(), fields.size());
    for (size_t c = 0; c < fields.size(); ++c) {
      const std::string& s = fields[c];
      const char* b = s.data();
      const char* e = s.data() + s.size();
      if (is_int_[c]) {
        int64_t v = 0;
        auto r = std::from_chars(b, e, v);
        CS_CHECK(!s.empty() && r.ec == std::errc() && r.ptr == e,
                 "CsvDataset: '{}' line {} (sample {}), column '{}': '{}' is not an integer", path,
                 lineno, rows_, names_[c], s);
        i_[c].push_back(v);
      } else {
        double v = 0;
        auto r = std::from_chars(b, e, v);
        CS_CHECK(!s.empty() && r.ec == std::errc() && r.ptr == e,
                 "CsvDataset: '{}' line {} (sample {}), column '{}': '{}' is not a number", path,
                 lineno, rows_, names_[c], s);
        f_[c].push_back(v);
      }
    }
    ++rows_;
  }
}

Sample CsvDataset::get(int64_t i) const {
  CS_CHECK(i >= 0 && i < rows_, "CsvDataset: '{}': sample {} is outside 0..{}", path_, i,
           rows_ - 1);
  Sample s;
  for (auto& o : outs_) {
    if (o.is_int) {
      int64_t* p;
      s[o.name] = detail::host_tensor({}, DType::i64, &p);
      *p = i_[o.cols[0]][static_cast<size_t>(i)];
    } else {
      float* p;
      Shape sh = o.vector ? Shape{static_cast<int64_t>(o.cols.size())} : Shape{};
      s[o.name] = detail::host_tensor(sh, DType::f32, &p);
      for (size_t k = 0; k < o.cols.size(); ++k)
        p[k] = static_cast<float>(f_[o.cols[k]][static_cast<size_t>(i)]);
    }
  }
  return s;
}

Batch CsvDataset::get_batch(const std::vector<int64_t>& idx) const {
  const int64_t n = static_cast<int64_t>(idx.size());
  for (int64_t i : idx)
    CS_CHECK(i >= 0 && i < rows_, "CsvDataset: '{}': sample {} is outside 0..{}", path_, i,
             rows_ - 1);
  Batch b;
  for (auto& o : outs_) {
    if (o.is_int) {
      int64_t* p;
      b[o.name] = detail::host_tensor({n}, DType::i64, &p);
      for (int64_t j = 0; j < n; ++j) p[j] = i_[o.cols[0]][static_cast<size_t>(idx[j])];
    } else {
      float* p;
      const int64_t w = static_cast<int64_t>(o.cols.size());
      Shape sh = o.vector ? Shape{n, w} : Shape{n};
      b[o.name] = detail::host_tensor(sh, DType::f32, &p);
      for (int64_t j = 0; j < n; ++j)
        for (int64_t k = 0; k < w; ++k)
          p[j * w + k] =
              static_cast<float>(f_[o.cols[static_cast<size_t>(k)]][static_cast<size_t>(idx[j])]);
    }
  }
  return b;
}

}  // namespace cstorch::data
