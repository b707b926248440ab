// Arrays from user files: delimited text, .npy, HDF5 datasets, conversion to tensors, JSON Lines
// text to tokens (see cstorch/data/arrays.h). The .npz (ZIP) part is in npz.cpp.
#include "cstorch/data/arrays.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include <fmt/ranges.h>

#include "cstorch/data/tokenizer.h"
#include "data/h5util.h"
#include "data/host_tensor.h"
#include "data/npy.h"

namespace cstorch::data {

namespace fs = std::filesystem;

const char* elem_type_name(ElemType t) {
  switch (t) {
    case ElemType::f32:
      return "float32";
    case ElemType::f64:
      return "float64";
    case ElemType::i32:
      return "int32";
    case ElemType::i64:
      return "int64";
    case ElemType::u8:
      return "uint8";
    case ElemType::boolean:
      return "bool";
  }
  return "?";
}

size_t elem_size(ElemType t) {
  switch (t) {
    case ElemType::f32:
    case ElemType::i32:
      return 4;
    case ElemType::f64:
    case ElemType::i64:
      return 8;
    case ElemType::u8:
    case ElemType::boolean:
      return 1;
  }
  return 0;
}

int64_t HostArray::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---------------------------------------------------------------------------------------------
// Conversion

namespace {

// Element k of `a` as a double (floats) or an integer.
bool is_float(ElemType t) {
  return t == ElemType::f32 || t == ElemType::f64;
}
double get_f(const HostArray& a, int64_t k) {
  const uint8_t* p = a.bytes.data() + static_cast<size_t>(k) * elem_size(a.type);
  if (a.type == ElemType::f32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  double v;
  std::memcpy(&v, p, 8);
  return v;
}
int64_t get_i(const HostArray& a, int64_t k) {
  const uint8_t* p = a.bytes.data() + static_cast<size_t>(k) * elem_size(a.type);
  switch (a.type) {
    case ElemType::i32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case ElemType::i64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
    default:
      return *p;  // u8, bool
  }
}

}  // namespace

Tensor array_to_tensor(const HostArray& a, DType dtype) {
  CS_CHECK(
      dtype == DType::f32 || dtype == DType::i32 || dtype == DType::i64 || dtype == DType::boolean,
      "{}: cannot convert to {}: the data types are f32, i32, i64 and bool", a.where,
      dtype_name(dtype));
  const int64_t n = a.numel();
  CS_CHECK(static_cast<size_t>(n) * elem_size(a.type) == a.bytes.size(),
           "{}: {} bytes for {} elements of {}", a.where, a.bytes.size(), n,
           elem_type_name(a.type));
  void* out = nullptr;
  Tensor t = detail::host_tensor(Shape(a.shape.begin(), a.shape.end()), dtype, &out);
  const bool fsrc = is_float(a.type);
  auto bad = [&](int64_t k, const std::string& value, const char* why) {
    fail("{}: element {} ({}) {} {}", a.where, k, value, why, dtype_name(dtype));
  };
  for (int64_t k = 0; k < n; ++k) {
    if (dtype == DType::f32) {
      double v = fsrc ? get_f(a, k) : static_cast<double>(get_i(a, k));
      // NaN and infinities are refused, as the CSV reader refuses them: one in the features made
      // every later loss NaN while the run reported success.
      if (!std::isfinite(v))
        fail("{}: element {} ({}) is not a finite number; the data must hold finite numbers",
             a.where, k, v);
      if (std::fabs(v) > std::numeric_limits<float>::max())
        bad(k, fmt::format("{}", v), "is out of the range of");
      static_cast<float*>(out)[k] = static_cast<float>(v);
      continue;
    }
    int64_t v;
    if (fsrc) {
      double d = get_f(a, k);
      // Integral floats (labels saved as 1.0, 2.0) convert; anything else would lose the value.
      if (!(std::isfinite(d) && d == std::trunc(d) && std::fabs(d) < 9.0e18))
        bad(k, fmt::format("{}", d), "is not an integer, so it cannot become");
      v = static_cast<int64_t>(d);
    } else {
      v = get_i(a, k);
    }
    if (dtype == DType::i64) {
      static_cast<int64_t*>(out)[k] = v;
    } else if (dtype == DType::i32) {
      if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
        bad(k, std::to_string(v), "is out of the range of");
      static_cast<int32_t*>(out)[k] = static_cast<int32_t>(v);
    } else {
      if (v != 0 && v != 1) bad(k, std::to_string(v), "is neither 0 nor 1, so it cannot become");
      static_cast<uint8_t*>(out)[k] = static_cast<uint8_t>(v);
    }
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Delimited text

namespace {
constexpr size_t kMaxField = size_t{1} << 20;
constexpr size_t kMaxFields = 1000000;

std::ifstream open_file(const std::string& path, const char* what) {
  std::error_code ec;
  CS_CHECK(!fs::is_directory(path, ec), "{}: cannot open '{}': it is a directory", what, path);
  // Not waited on: a FIFO or device (opening one blocks until a writer comes).
  CS_CHECK(!fs::exists(path, ec) || fs::is_regular_file(path, ec),
           "{}: cannot open '{}': not a regular file", what, path);
  std::ifstream in(path, std::ios::binary);
  CS_CHECK(in.good(), "{}: cannot open '{}': {}", what, path, std::strerror(errno));
  return in;
}

std::string read_all(const std::string& path, const char* what) {
  std::ifstream in = open_file(path, what);
  std::stringstream s;
  s << in.rdbuf();
  CS_CHECK(!in.bad(), "{}: reading '{}' failed", what, path);
  return s.str();
}

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

std::string shown(const std::string& s) {
  return s.size() > 40 ? s.substr(0, 40) + "..." : s;
}
}  // namespace

namespace {

// Calls on_record(const CsvRecord&) for each record of `text` (see parse_csv), reusing one
// record's buffers so a large file costs its text and the output, not a string per field.
template <class OnRecord>
void scan_csv(const std::string& text, char d, const std::string& path, OnRecord&& on_record) {
  CsvRecord r;
  const size_t n = text.size();
  size_t i = 0, line_start = 0;
  int64_t line = 1;
  // A UTF-8 byte-order mark (Excel's "CSV UTF-8" writes one) is not text: left in, it became part
  // of the first column's name, and "header lacks 'f0' (columns: f0, ...)" showed no difference.
  // Columns of line 1 count from after it, as an editor shows them.
  if (text.compare(0, 3, "\xEF\xBB\xBF") == 0) i = line_start = 3;
  auto col = [&](size_t at) { return static_cast<int64_t>(at - line_start + 1); };
  auto newline_at = [&](size_t at) {  // LF, CRLF, or a CR ending the text
    return at < n &&
           (text[at] == '\n' || (text[at] == '\r' && (at + 1 == n || text[at + 1] == '\n')));
  };
  while (i < n) {
    if (newline_at(i)) {  // a blank line
      i += text[i] == '\r' ? 2 : 1;
      ++line;
      line_start = i;
      continue;
    }
    r.line = line;
    size_t nf = 0;  // fields of this record so far
    while (true) {
      const int64_t fl = line, fc = col(i);
      if (r.fields.size() <= nf) {
        r.fields.emplace_back();
        r.field_line.emplace_back();
        r.field_column.emplace_back();
      }
      std::string& f = r.fields[nf];
      f.clear();
      if (i < n && text[i] == '"') {
        ++i;
        while (true) {
          CS_CHECK(i < n, "{}:{}:{}: a quoted field is never closed (no matching '\"')", path, fl,
                   fc);
          const char c = text[i];
          if (c == '"') {
            if (i + 1 < n && text[i + 1] == '"') {
              f += '"';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          CS_CHECK(c != '\0', "{}:{}:{}: a NUL byte (is this a text file?)", path, line, col(i));
          if (c == '\n') {
            ++line;
            line_start = i + 1;
          }
          f += c;
          ++i;
          CS_CHECK(f.size() <= kMaxField, "{}:{}:{}: a field longer than {} bytes", path, fl, fc,
                   kMaxField);
        }
        CS_CHECK(i == n || text[i] == d || newline_at(i),
                 "{}:{}:{}: '{}' after the closing quote of a field (quote a field whole and "
                 "double the quotes inside it)",
                 path, line, col(i), text[i]);
      } else {
        while (i < n && text[i] != d && !newline_at(i)) {
          const char c = text[i];
          CS_CHECK(c != '"',
                   "{}:{}:{}: a quote inside an unquoted field (quote the whole field and double "
                   "the quotes inside it)",
                   path, line, col(i));
          CS_CHECK(c != '\0', "{}:{}:{}: a NUL byte (is this a text file?)", path, line, col(i));
          f += c;
          ++i;
          CS_CHECK(f.size() <= kMaxField, "{}:{}:{}: a field longer than {} bytes", path, fl, fc,
                   kMaxField);
        }
      }
      r.field_line[nf] = fl;
      r.field_column[nf] = fc;
      ++nf;
      CS_CHECK(nf <= kMaxFields, "{}:{}: a record of more than {} fields", path, r.line,
               kMaxFields);
      if (i < n && text[i] == d) {
        ++i;
        continue;
      }
      if (i < n) {  // the record's line break
        i += text[i] == '\r' ? 2 : 1;
        ++line;
        line_start = i;
      }
      break;
    }
    r.fields.resize(nf);
    r.field_line.resize(nf);
    r.field_column.resize(nf);
    on_record(r);
  }
}

}  // namespace

std::vector<CsvRecord> parse_csv(const std::string& text, char d, const std::string& path) {
  std::vector<CsvRecord> out;
  scan_csv(text, d, path, [&](const CsvRecord& r) { out.push_back(r); });
  return out;
}

namespace {

// Parses one field as `dtype` and appends it to `out`; errors start with where() (path:line:column
// and the column), formatted only then.
template <class Where>
void put_value(const std::string& raw, DType dtype, std::vector<uint8_t>* out, const Where& where) {
  std::string s = trim(raw);
  const char* b = s.data();
  const char* e = b + s.size();
  if (b != e && *b == '+') ++b;  // from_chars takes no '+'
  auto append = [&](const void* p, size_t k) {
    auto* c = static_cast<const uint8_t*>(p);
    out->insert(out->end(), c, c + k);
  };
  if (dtype == DType::boolean) {
    uint8_t v;
    if (s == "0" || s == "false" || s == "False")
      v = 0;
    else if (s == "1" || s == "true" || s == "True")
      v = 1;
    else
      fail("{}: '{}' is not a boolean (0, 1, true or false)", where(), shown(s));
    append(&v, 1);
    return;
  }
  double d = 0;
  auto r = std::from_chars(b, e, d);
  const bool number = !s.empty() && r.ec != std::errc::invalid_argument && r.ptr == e;
  if (dtype == DType::f32) {
    CS_CHECK(number && r.ec == std::errc(), "{}: '{}' is not a number", where(), shown(s));
    CS_CHECK(std::isfinite(d), "{}: '{}' is not a finite number", where(), shown(s));
    CS_CHECK(std::fabs(d) <= std::numeric_limits<float>::max(), "{}: {} is out of the range of f32",
             where(), shown(s));
    float f = static_cast<float>(d);
    append(&f, 4);
    return;
  }
  int64_t v = 0;
  auto ri = std::from_chars(b, e, v);
  if (!(ri.ec == std::errc() && ri.ptr == e && !s.empty())) {
    // An integral value written as a float ("2.0", as many tools write labels) is accepted.
    CS_CHECK(number, "{}: '{}' is not an integer", where(), shown(s));
    CS_CHECK(r.ec == std::errc() && d == std::trunc(d) && std::fabs(d) < 9.0e18,
             "{}: '{}' is not an integer in the range of {}", where(), shown(s), dtype_name(dtype));
    v = static_cast<int64_t>(d);
  }
  if (dtype == DType::i32) {
    CS_CHECK(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
             "{}: {} is out of the range of i32", where(), shown(s));
    int32_t w = static_cast<int32_t>(v);
    append(&w, 4);
    return;
  }
  append(&v, 8);
}

std::string ref_str(const ColumnRef& r) {
  return r.index >= 0 ? fmt::format("column index {}", r.index)
                      : fmt::format("column '{}'", r.name);
}

}  // namespace

CsvArrays read_csv_arrays(const std::vector<std::string>& files, const CsvArrayOptions& o) {
  const char* what = "CSV data";
  CS_CHECK(!files.empty(), "{}: no files given", what);
  for (DType t : {o.features_dtype, o.labels_dtype})
    CS_CHECK(t == DType::f32 || t == DType::i32 || t == DType::i64 || t == DType::boolean,
             "{}: dtype {} is not supported (f32, i32, i64, bool)", what, dtype_name(t));
  CsvArrays out;
  std::vector<std::string> names;  // of the first file
  std::vector<size_t> fcols, lcols;
  std::vector<uint8_t> fbytes, lbytes;
  int64_t rows = 0;
  for (const auto& path : files) {
    char d = o.delimiter;
    if (d == 0) {
      std::string ext = fs::path(path).extension().string();
      d = (ext == ".tsv" || ext == ".tab") ? '\t' : ',';
    }
    bool first = true;
    scan_csv(read_all(path, what), d, path, [&](const CsvRecord& r) {
      if (first) {
        first = false;
        std::vector<std::string> here;
        if (o.header) {
          std::set<std::string> seen;
          for (size_t c = 0; c < r.fields.size(); ++c) {
            here.push_back(trim(r.fields[c]));
            CS_CHECK(!here.back().empty(), "{}:{}:{}: column {} of the header has no name", path,
                     r.field_line[c], r.field_column[c], c);
            CS_CHECK(seen.insert(here.back()).second, "{}:{}:{}: the column name '{}' repeats",
                     path, r.field_line[c], r.field_column[c], here.back());
          }
        } else {
          for (size_t c = 0; c < r.fields.size(); ++c) here.push_back(fmt::format("column {}", c));
        }
        if (names.empty()) {
          names = here;
          // Resolve the column references against the first file.
          auto resolve = [&](const ColumnRef& ref, const char* opt) -> size_t {
            if (ref.index >= 0) {
              CS_CHECK(static_cast<size_t>(ref.index) < names.size(),
                       "{}: {} lists column index {}, but the file has {} columns (0..{})", path,
                       opt, ref.index, names.size(), names.size() - 1);
              return static_cast<size_t>(ref.index);
            }
            CS_CHECK(o.header,
                     "{}: {} names column '{}', but there is no header (header: false): "
                     "give 0-based column indices",
                     path, opt, ref.name);
            auto it = std::find(names.begin(), names.end(), ref.name);
            CS_CHECK(it != names.end(),
                     "{}: {} names column '{}', which the header lacks (columns: {})", path, opt,
                     ref.name, fmt::join(names, ", "));
            return static_cast<size_t>(it - names.begin());
          };
          std::vector<int> used(names.size(), 0);
          auto take = [&](const std::vector<ColumnRef>& refs, const char* opt,
                          std::vector<size_t>* to) {
            for (const auto& ref : refs) {
              size_t c = resolve(ref, opt);
              CS_CHECK(!used[c],
                       "{}: {} ({}) is used twice (features and labels may not share one)", path,
                       ref_str(ref), names[c]);
              used[c] = 1;
              to->push_back(c);
            }
          };
          take(o.labels, "labels", &lcols);
          take(o.features, "features", &fcols);
          if (o.features.empty())
            for (size_t c = 0; c < names.size(); ++c)
              if (!used[c]) fcols.push_back(c);
          CS_CHECK(!fcols.empty(), "{}: no feature columns (every column is a label)", path);
          for (size_t c : fcols) out.feature_columns.push_back(names[c]);
          for (size_t c : lcols) out.label_columns.push_back(names[c]);
        } else if (o.header) {
          CS_CHECK(here == names, "{}:{}: the header ({}) differs from the header of '{}' ({})",
                   path, r.line, fmt::join(here, ", "), files[0], fmt::join(names, ", "));
        }
        if (o.header) return;  // a header holds no data
      }
      if (r.fields.size() != names.size()) {
        // The column of the first extra field, or of the last field of a short record.
        const size_t at =
            std::min(r.fields.size(), names.size()) - (r.fields.size() < names.size() ? 1 : 0);
        fail("{}:{}:{}: {} fields, expected {}{}", path, r.field_line[at], r.field_column[at],
             r.fields.size(), names.size(),
             o.header ? " (as the header has)" : " (as the first line has)");
      }
      auto field = [&](size_t c, DType t, std::vector<uint8_t>* to) {
        put_value(r.fields[c], t, to, [&] {
          return fmt::format("{}:{}:{}: column '{}'", path, r.field_line[c], r.field_column[c],
                             names[c]);
        });
      };
      for (size_t c : fcols) field(c, o.features_dtype, &fbytes);
      for (size_t c : lcols) field(c, o.labels_dtype, &lbytes);
      ++rows;
    });
    CS_CHECK(!first, "{}: the file is empty{}", path,
             o.header ? " (expected a header line naming the columns)" : "");
  }
  CS_CHECK(rows > 0, "{}: no data rows in {}", what, fmt::join(files, ", "));
  auto tensor = [&](const std::vector<uint8_t>& bytes, Shape shape, DType t) {
    void* p = nullptr;
    Tensor x = detail::host_tensor(shape, t, &p);
    std::memcpy(p, bytes.data(), bytes.size());
    return x;
  };
  out.features = tensor(fbytes, {rows, static_cast<int64_t>(fcols.size())}, o.features_dtype);
  if (!lcols.empty())
    out.labels = tensor(
        lbytes, lcols.size() == 1 ? Shape{rows} : Shape{rows, static_cast<int64_t>(lcols.size())},
        o.labels_dtype);
  return out;
}

// ---------------------------------------------------------------------------------------------
// .npy

namespace {

// A strict reader of the header dict NumPy writes: {'key': value, ...} with string, boolean and
// integer-tuple values.
struct HeaderParser {
  const std::string& s;
  const std::string& where;
  size_t i = 0;
  [[noreturn]] void bad(const std::string& what) const {
    fail("{}: malformed .npy header ({} at character {}): {}", where, what, i, shown(s));
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  }
  bool eat(char c) {
    ws();
    if (i < s.size() && s[i] == c) {
      ++i;
      return true;
    }
    return false;
  }
  std::string str() {
    ws();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) bad("expected a quoted string");
    char q = s[i++];
    size_t e = s.find(q, i);
    if (e == std::string::npos) bad("unterminated string");
    std::string v = s.substr(i, e - i);
    i = e + 1;
    return v;
  }
  bool boolean() {
    ws();
    if (s.compare(i, 4, "True") == 0) {
      i += 4;
      return true;
    }
    if (s.compare(i, 5, "False") == 0) {
      i += 5;
      return false;
    }
    bad("expected True or False");
  }
  std::vector<int64_t> shape() {
    if (!eat('(')) bad("expected '(' starting the shape");
    std::vector<int64_t> dims;
    while (!eat(')')) {
      ws();
      int64_t v = 0;
      auto r = std::from_chars(s.data() + i, s.data() + s.size(), v);
      if (r.ec == std::errc::result_out_of_range) bad("a dimension too large");
      if (r.ec != std::errc()) bad("expected a dimension");
      if (v < 0) bad("a negative dimension");
      i = static_cast<size_t>(r.ptr - s.data());
      dims.push_back(v);
      if (dims.size() > 32) bad("more than 32 dimensions");
      ws();
      if (!eat(',') && !(i < s.size() && s[i] == ')')) bad("expected ',' or ')' in the shape");
    }
    return dims;
  }
};

}  // namespace

HostArray read_npy_from(NpySource& src) {
  const std::string& where = src.where;
  const uint64_t total = src.size();
  uint8_t pre[10];
  CS_CHECK(total >= 10, "{}: {} bytes, too short for a .npy file", where, total);
  src.read(pre, 10);
  CS_CHECK(std::memcmp(pre, "\x93NUMPY", 6) == 0,
           "{}: not a .npy file (the file does not start with \\x93NUMPY)", where);
  const int major = pre[6], minor = pre[7];
  CS_CHECK((major == 1 || major == 2 || major == 3) && minor == 0,
           "{}: .npy format version {}.{} is not supported (1.0, 2.0, 3.0)", where, major, minor);
  uint64_t hlen = pre[8] | (uint64_t{pre[9]} << 8);
  uint64_t prefix = 10;
  if (major >= 2) {
    CS_CHECK(total >= 12, "{}: {} bytes, too short for a .npy file", where, total);
    uint8_t more[2];
    src.read(more, 2);
    hlen |= (uint64_t{more[0]} << 16) | (uint64_t{more[1]} << 24);
    prefix = 12;
  }
  CS_CHECK(hlen <= (1u << 20), "{}: a .npy header of {} bytes (more than 1 MiB)", where, hlen);
  CS_CHECK(prefix + hlen <= total, "{}: the .npy header ({} bytes) runs past the end ({} bytes)",
           where, hlen, total);
  std::string h(hlen, '\0');
  src.read(h.data(), hlen);
  CS_CHECK(!h.empty() && h.back() == '\n', "{}: malformed .npy header (no final newline)", where);
  h.pop_back();
  while (!h.empty() && h.back() == ' ') h.pop_back();  // padding
  HeaderParser p{h, where};
  if (!p.eat('{')) p.bad("expected '{'");
  std::string descr;
  std::optional<bool> fortran;
  std::optional<std::vector<int64_t>> shape;
  bool have_descr = false;
  while (!p.eat('}')) {
    std::string key = p.str();
    if (!p.eat(':')) p.bad("expected ':' after '" + key + "'");
    if (key == "descr" && !have_descr) {
      descr = p.str();
      have_descr = true;
    } else if (key == "fortran_order" && !fortran) {
      fortran = p.boolean();
    } else if (key == "shape" && !shape) {
      shape = p.shape();
    } else {
      p.bad("an unexpected or repeated key '" + key + "'");
    }
    if (!p.eat(',')) {
      if (!p.eat('}')) p.bad("expected ',' or '}'");
      break;
    }
  }
  p.ws();
  if (p.i != h.size()) p.bad("text after the closing '}'");
  if (!have_descr || !fortran || !shape) p.bad("missing one of 'descr', 'fortran_order', 'shape'");
  static const std::map<std::string, ElemType> types = {
      {"<f4", ElemType::f32}, {"<f8", ElemType::f64},     {"<i4", ElemType::i32},
      {"<i8", ElemType::i64}, {"=f4", ElemType::f32},     {"=f8", ElemType::f64},
      {"=i4", ElemType::i32}, {"=i8", ElemType::i64},     {"|u1", ElemType::u8},
      {"<u1", ElemType::u8},  {"|b1", ElemType::boolean}, {"<b1", ElemType::boolean}};
  auto t = types.find(descr);
  CS_CHECK(t != types.end(),
           "{}: dtype '{}' is not supported (little-endian float32, float64, int32, int64, uint8 "
           "or bool: '<f4', '<f8', '<i4', '<i8', '|u1', '|b1')",
           where, descr);
  CS_CHECK(!*fortran,
           "{}: the array is stored in Fortran order (column-major); only C order is read: save "
           "it with np.save(path, np.ascontiguousarray(a))",
           where);
  HostArray a;
  a.where = where;
  a.type = t->second;
  a.shape = *shape;
  // The data size, without overflow, before anything is allocated.
  uint64_t bytes = elem_size(a.type);
  for (int64_t d : a.shape) {
    CS_CHECK(d == 0 || bytes <= (uint64_t{1} << 50) / static_cast<uint64_t>(d),
             "{}: the shape ({}) is too large", where, fmt::join(a.shape, ", "));
    bytes *= static_cast<uint64_t>(d);
  }
  CS_CHECK(prefix + hlen + bytes == total,
           "{}: the header says shape ({}) of {}, {} data bytes, but the file holds {} after the "
           "header (truncated or not a .npy file)",
           where, fmt::join(a.shape, ", "), elem_type_name(a.type), bytes, total - prefix - hlen);
  a.bytes.resize(bytes);
  src.read(a.bytes.data(), bytes);
  return a;
}

namespace {
class FileSource : public NpySource {
 public:
  explicit FileSource(const std::string& path) : in_(regular(path), std::ios::binary) {
    where = path;
    CS_CHECK(in_.good(), "cannot open '{}'", path);
    size_ = fs::file_size(path);
  }
  uint64_t size() const override { return size_; }
  // Checked before the stream opens it: opening a FIFO blocks until a writer comes.
  static const std::string& regular(const std::string& path) {
    CS_CHECK(fs::is_regular_file(path), "cannot open '{}'{}", path,
             fs::exists(path) ? ": not a regular file" : "");
    return path;
  }
  void read(void* dst, uint64_t n) override {
    in_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    CS_CHECK(in_.good(), "{}: reading {} bytes failed", where, n);
  }

 private:
  std::ifstream in_;
  uint64_t size_ = 0;
};
}  // namespace

HostArray read_npy(const std::string& path) {
  FileSource s(path);
  return read_npy_from(s);
}

// ---------------------------------------------------------------------------------------------
// HDF5

namespace {
struct H5Handle {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  ~H5Handle() {
    if (id >= 0) close(id);
  }
};

std::vector<std::string> h5_datasets(hid_t file) {
  std::vector<std::string> names;
  H5Literate(
      file, H5_INDEX_NAME, H5_ITER_INC, nullptr,
      [](hid_t g, const char* name, const H5L_info_t*, void* data) -> herr_t {
        hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
        if (d >= 0) {
          static_cast<std::vector<std::string>*>(data)->push_back(name);
          H5Dclose(d);
        }
        return 0;
      },
      &names);
  H5Eclear2(H5E_DEFAULT);
  return names;
}

}  // namespace

HostArray read_h5_array(const std::string& path, const std::string& name) {
  h5::quiet();
  const std::string where = fmt::format("{}:{}", path, name);
  CS_CHECK(fs::is_regular_file(path), "cannot open '{}'", path);
  CS_CHECK(H5Fis_hdf5(path.c_str()) > 0, "'{}' is not an HDF5 file", path);
  H5Handle f{H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose};
  CS_CHECK(f.id >= 0, "cannot open HDF5 file '{}': {}", path, h5::error());
  H5Handle d{H5Dopen2(f.id, name.c_str(), H5P_DEFAULT), H5Dclose};
  if (d.id < 0) {
    H5Eclear2(H5E_DEFAULT);
    fail("'{}' has no dataset '{}' (datasets at the top level: {})", path, name,
         fmt::join(h5_datasets(f.id), ", "));
  }
  H5Handle ft{H5Dget_type(d.id), H5Tclose};
  H5Handle space{H5Dget_space(d.id), H5Sclose};
  CS_CHECK(ft.id >= 0 && space.id >= 0, "{}: cannot read the type or shape: {}", where,
           h5::error());
  const H5T_class_t cls = H5Tget_class(ft.id);
  const size_t size = H5Tget_size(ft.id);
  HostArray a;
  a.where = where;
  hid_t mem = -1;
  H5Handle native;  // for enums
  if (cls == H5T_FLOAT && (size == 4 || size == 8)) {
    a.type = size == 4 ? ElemType::f32 : ElemType::f64;
    mem = size == 4 ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
  } else if (cls == H5T_INTEGER && size <= 8) {
    const bool is_signed = H5Tget_sign(ft.id) == H5T_SGN_2;
    CS_CHECK(is_signed || size < 8,
             "{}: unsigned 64-bit integers are not supported (their values may not fit int64)",
             where);
    if (!is_signed && size == 1) {
      a.type = ElemType::u8;
      mem = H5T_NATIVE_UINT8;
    } else if (is_signed && size <= 4) {
      a.type = ElemType::i32;
      mem = H5T_NATIVE_INT32;
    } else {
      a.type = ElemType::i64;
      mem = H5T_NATIVE_INT64;
    }
  } else if (cls == H5T_ENUM && size == 1 && H5Tget_nmembers(ft.id) == 2) {
    // h5py stores bool as an enum {FALSE: 0, TRUE: 1} over int8; the values are the integers.
    a.type = ElemType::boolean;
    native.id = H5Tget_native_type(ft.id, H5T_DIR_ASCEND);
    native.close = H5Tclose;
    mem = native.id;
  } else {
    static const std::map<int, const char*> names = {
        {H5T_INTEGER, "integer"},   {H5T_FLOAT, "float"},         {H5T_STRING, "string"},
        {H5T_COMPOUND, "compound"}, {H5T_ENUM, "enum"},           {H5T_ARRAY, "array"},
        {H5T_OPAQUE, "opaque"},     {H5T_VLEN, "variable-length"}};
    auto it = names.find(cls);
    fail("{}: a {} type of {} bytes is not supported (floats of 4 or 8 bytes, integers, bool)",
         where, it == names.end() ? "non-numeric" : it->second, size);
  }
  const int rank = H5Sget_simple_extent_ndims(space.id);
  CS_CHECK(rank >= 1, "{}: a scalar or empty dataspace; need at least one dimension (samples)",
           where);
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  H5Sget_simple_extent_dims(space.id, dims.data(), nullptr);
  uint64_t bytes = elem_size(a.type);
  for (hsize_t x : dims) {
    CS_CHECK(x == 0 || bytes <= (uint64_t{1} << 40) / x, "{}: more than 2^40 bytes", where);
    bytes *= x;
    a.shape.push_back(static_cast<int64_t>(x));
  }
  H5Handle plist{H5Dget_create_plist(d.id), H5Pclose};
  CS_CHECK(plist.id >= 0, "{}: cannot read the dataset's storage properties: {}", where,
           h5::error());
  h5::check_storage(d.id, plist.id, path, where, dims, size);
  // Within what the file holds, memory may still run short: said with the file and the size.
  try {
    a.bytes.resize(bytes);
  } catch (const std::bad_alloc&) {
    fail("{}: cannot allocate {} bytes for the dataset (shape ({}) of {}): out of memory", where,
         bytes, fmt::join(a.shape, ", "), elem_type_name(a.type));
  }
  if (bytes > 0 && H5Dread(d.id, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.bytes.data()) < 0)
    fail("{}: reading failed: {}", where, h5::error());
  return a;
}

// ---------------------------------------------------------------------------------------------
// JSON Lines

std::vector<int32_t> tokenize_jsonl(const std::vector<std::string>& files, const BpeTokenizer& tok,
                                    const std::string& field, int64_t eos_id, int64_t vocab_size) {
  CS_CHECK(!files.empty(), "JSON Lines data: no files given");
  CS_CHECK(eos_id >= 0 && (vocab_size <= 0 || eos_id < vocab_size),
           "JSON Lines data: eos id {} is outside the vocabulary 0..{}", eos_id, vocab_size - 1);
  std::vector<int32_t> out;
  for (const auto& path : files) {
    // Line by line: a corpus larger than the memory left beside its tokens is read without
    // holding its text (read whole, it was held twice while being read).
    std::ifstream in = open_file(path, "JSON Lines data");
    int64_t line = 0, docs = 0;
    std::string l;
    while (true) {
      try {
        if (!std::getline(in, l)) break;
      } catch (const std::bad_alloc&) {
        fail("{}:{}: cannot hold the line in memory: a document larger than the memory left", path,
             line + 1);
      } catch (const std::length_error&) {
        fail("{}:{}: the line is longer than a string can hold", path, line + 1);
      }
      ++line;
      if (!l.empty() && l.back() == '\r') l.pop_back();
      if (trim(l).empty()) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(l);
      } catch (const nlohmann::json::parse_error& err) {
        fail("{}:{}:{}: invalid JSON ({})", path, line, err.byte, err.what());
      } catch (const nlohmann::json::exception& err) {
        // Not only syntax: a number beyond a double ("7e777") is the parser's out_of_range.
        fail("{}:{}: invalid JSON ({})", path, line, err.what());
      }
      CS_CHECK(j.is_object(), "{}:{}: expected a JSON object, got {}", path, line, j.type_name());
      auto it = j.find(field);
      CS_CHECK(it != j.end(), "{}:{}: the object has no field '{}' (its text)", path, line, field);
      CS_CHECK(it->is_string(), "{}:{}: field '{}' is a {}, not a string", path, line, field,
               it->type_name());
      for (int64_t id : tok.encode(it->get<std::string>())) {
        CS_CHECK(vocab_size <= 0 || id < vocab_size,
                 "{}:{}: token id {} ('{}') is outside the model's vocabulary of {} (vocab_size); "
                 "the tokenizer has {} tokens",
                 path, line, id, tok.id_to_token(id), vocab_size, tok.vocab_size());
        out.push_back(static_cast<int32_t>(id));
      }
      out.push_back(static_cast<int32_t>(eos_id));
      ++docs;
    }
    CS_CHECK(!in.bad(), "JSON Lines data: reading '{}' failed after line {}", path, line);
    CS_CHECK(docs > 0, "{}: no documents (every line is blank)", path);
  }
  return out;
}

}  // namespace cstorch::data
