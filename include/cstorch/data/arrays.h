// Arrays from files a user brings: delimited text (CSV/TSV, quoting as RFC 4180), NumPy .npy and
// .npz files, and HDF5 datasets, read whole into host memory and converted to tensors. The Model
// Zoo's CSVDataProcessor, NumpyDataProcessor and HDF5DataProcessor are built on these
// (docs/your-own-data.md); the JSON Lines text reader for GPT-style tokens is here too.
//
//   auto t = data::read_csv_arrays({"train.csv"}, {.labels = {{"label"}}});
//   // t.features: f32 [N, F] (every column but "label"), t.labels: i64 [N]
//   data::HostArray a = data::read_npz("train.npz", "x");   // raw bytes, shape, element type
//   Tensor x = data::array_to_tensor(a, DType::f32);         // checked conversion
//
// Errors (cstorch::Error) always name the file and where in it: file:line:column for text,
// the array or dataset name for binary files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cstorch/tensor.h"

namespace cstorch::data {

// Element types a file may hold. Tensors have no f64 or u8: array_to_tensor converts.
enum class ElemType { f32, f64, i32, i64, u8, boolean };
const char* elem_type_name(ElemType t);  // "float32", "float64", "int32", "int64", "uint8", "bool"
size_t elem_size(ElemType t);            // bytes per element

// A dense row-major (C order) array read from a file. `where` names it in error messages
// ("train.npz:x", "data.h5:/features").
struct HostArray {
  std::vector<int64_t> shape;  // empty for a scalar
  ElemType type = ElemType::f32;
  std::vector<uint8_t> bytes;  // numel * elem_size(type), native (little-endian) order
  std::string where;
  int64_t numel() const;
};

// Converts to a host tensor of `dtype` (f32, i32, i64 or boolean). Conversions that would change
// a value are errors naming `a.where`, the flat element index and the value: a non-integral or
// out-of-range float to an integer type, an integer outside i32 to i32, a finite f64 beyond f32's
// range to f32, anything but 0/1 to boolean. NaN and infinities are errors too (as in CSV data).
// bf16/f16 targets are errors.
Tensor array_to_tensor(const HostArray& a, DType dtype);

// ---------------------------------------------------------------------------------------------
// Delimited text

// One record of a delimited file: its fields (unquoted), the line each record starts on
// (1-based) and each field's starting line and column (1-based, in bytes).
struct CsvRecord {
  std::vector<std::string> fields;
  std::vector<int64_t> field_line, field_column;
  int64_t line = 0;
};

// Splits `text` into records as RFC 4180 describes: fields separated by `delimiter`, records by
// LF or CRLF; a field starting with '"' is quoted and may hold delimiters, line breaks and '""'
// (one quote). Blank lines (no characters at all) are skipped. `path` names the text in errors:
// a quote inside an unquoted field, characters after a closing quote, a quoted field never
// closed (path:line:column of the field), a NUL byte, a field of more than 1 MiB or a record of
// more than 1,000,000 fields.
std::vector<CsvRecord> parse_csv(const std::string& text, char delimiter, const std::string& path);

// A column of a delimited file: by header name, or by 0-based index when `index` >= 0.
struct ColumnRef {
  std::string name;
  int64_t index = -1;
};

struct CsvArrayOptions {
  char delimiter = 0;               // 0: '\t' for .tsv/.tab files, ',' otherwise
  bool header = true;               // the first record names the columns (then it holds no data)
  std::vector<ColumnRef> features;  // empty: every column that is not a label
  std::vector<ColumnRef> labels;    // empty: no labels
  DType features_dtype = DType::f32;
  DType labels_dtype = DType::i64;
};

struct CsvArrays {
  Tensor features;  // [N, F]
  Tensor labels;    // [N] for one label column, [N, L] for several; undefined without labels
  std::vector<std::string> feature_columns, label_columns;  // names (or "column K" without header)
};

// Reads `files` (one data set, records in file order; a leading UTF-8 byte-order mark is skipped;
// every file must have the same header, or
// the same number of fields without one). Numbers: decimal as strtod/strtoll read them, spaces
// around a field ignored; integer dtypes take integers only; boolean takes 0/1/true/false.
// Errors: a file that cannot be read, no data rows, a header with an empty or repeated name, a
// column reference that is unknown or out of range (listing the columns), one column used twice,
// a record with the wrong number of fields (path:line:column of the first extra or the last
// field), a value that is not a number of the
// dtype or is out of its range (path:line:column, naming the column).
CsvArrays read_csv_arrays(const std::vector<std::string>& files, const CsvArrayOptions& o);

// ---------------------------------------------------------------------------------------------
// NumPy

// Reads a .npy file (format versions 1.0, 2.0, 3.0). The header must be the dict NumPy writes,
// {'descr': ..., 'fortran_order': False, 'shape': (...)}, nothing else; descr one of <f4 <f8 <i4
// <i8 |u1 |b1 (also with '=' or, for one-byte types, '<'). The data size the header implies is
// checked against the file size before anything is allocated. Errors name the file: not a .npy
// file, an unsupported version, a malformed or over-long header (> 1 MiB), another dtype
// (big-endian, object, ...), fortran_order True ("Fortran order; save with
// np.ascontiguousarray"), a negative or overflowing shape, a file shorter or longer than its
// header says.
HostArray read_npy(const std::string& path);
// Reads member `name` (without ".npy") of a .npz archive (ZIP, stored or deflated), with the same
// checks against the member's size in the archive. Errors: not a ZIP file, no such member (listing
// the members), a member that is not a valid .npy, a member whose CRC-32 does not match its bytes
// (damaged).
HostArray read_npz(const std::string& path, const std::string& name);
// The array names in a .npz archive, in archive order.
std::vector<std::string> npz_names(const std::string& path);

// ---------------------------------------------------------------------------------------------
// HDF5

// Reads dataset `name` (a path inside the file, e.g. "features" or "/group/x") whole. Types:
// IEEE floats of 4 or 8 bytes; signed integers of 1, 2, 4 or 8 bytes (read as i32 or i64);
// unsigned integers of 1 byte (u8), 2 or 4 bytes (read as i64); h5py's bool (an enum of 0/1 on
// one byte). Errors name the file and the dataset: not HDF5, no such dataset (listing the
// top-level datasets), another type class (strings, compounds, ...), a 64-bit unsigned type, a
// scalar or empty dataspace, more than 2^40 bytes; and, checked before anything is allocated, a
// dataset whose storage does not hold its shape: never written, chunks never written (they would
// read as the fill value), contiguous or uncompressed chunked bytes fewer than the shape needs,
// compressed chunks claiming more than 1032:1; memory that runs out is an error naming the size.
HostArray read_h5_array(const std::string& path, const std::string& name);

// ---------------------------------------------------------------------------------------------
// JSON Lines text

class BpeTokenizer;

// Tokens of JSON Lines files: each non-blank line is a JSON object whose string member
// `text_field` is one document; every document's tokens are followed by `eos_id`. Errors
// (path:line): invalid JSON (with the column the parser stopped at), a line that is not an
// object, a missing or non-string field, an empty file; a token id >= `vocab_size` when
// vocab_size > 0 (naming the token and the vocabulary size).
std::vector<int32_t> tokenize_jsonl(const std::vector<std::string>& files,
                                    const BpeTokenizer& tokenizer, const std::string& text_field,
                                    int64_t eos_id, int64_t vocab_size);

}  // namespace cstorch::data
