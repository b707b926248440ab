// The readers of user data (cstorch/data/arrays.h) and the data processors built on them:
// delimited text (RFC 4180 quoting, positions in errors, limits), .npy/.npz (strict header,
// sizes against the file, Fortran order), HDF5 datasets, JSON Lines text to GPT tokens, and the
// processors' keys, shape checks and sharding. NumPy and HDF5 files are written by Python
// (numpy, h5py), as a user's tools would.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "cstorch/cstorch.h"
#include "cstorch/data/arrays.h"
#include "cstorch/data/text.h"
#include "cstorch/data/tokenizer.h"
#include "modelzoo/config_view.h"
#include "modelzoo/model.h"
#include "unit/test_util.h"

namespace cs = cstorch;
namespace fs = std::filesystem;
using namespace cs::data;
using cs::testing::read_file;
using cs::testing::write_file;

namespace {

fs::path root() {
  static fs::path r = cs::testing::temp_dir("cstorch_arrays", "t");
  return r;
}
std::string put(const std::string& name, const std::string& text) {
  write_file(root() / name, text);
  return (root() / name).string();
}
// Runs Python `code` in the temp folder (NumPy and h5py imported as np and h5py).
void py(const std::string& code) {
  std::string file = put("make.py", "import numpy as np, h5py\n" + code + "\n");
  std::string cmd = "cd " + root().string() + " && " + CSTORCH_PYTHON + " " + file;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << code;
}

modelzoo::DataLoaderPtr processor(const cs::Config& c) {
  return modelzoo::data_processors().create(c.at("data_processor").get<std::string>(),
                                            modelzoo::ConfigView(c, "train_dataloader"),
                                            "train_dataloader");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Delimited text

TEST(CsvParse, QuotedFieldsAsRfc4180) {
  auto r = parse_csv("a,\"b,c\",\"say \"\"hi\"\"\"\r\n\n\"two\nlines\",,x\n", ',', "t.csv");
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].fields, (std::vector<std::string>{"a", "b,c", "say \"hi\""}));
  EXPECT_EQ(r[0].line, 1);
  EXPECT_EQ(r[0].field_column, (std::vector<int64_t>{1, 3, 9}));
  EXPECT_EQ(r[1].fields, (std::vector<std::string>{"two\nlines", "", "x"}));
  EXPECT_EQ(r[1].line, 3);             // the blank line 2 is skipped
  EXPECT_EQ(r[1].field_line[2], 4);    // after the line break inside the quotes
  EXPECT_EQ(r[1].field_column[2], 9);  // l-i-n-e-s-"-,-, then x
  // A trailing delimiter is an empty last field; no final newline is fine; TSV.
  EXPECT_EQ(parse_csv("1,\n", ',', "t")[0].fields, (std::vector<std::string>{"1", ""}));
  EXPECT_EQ(parse_csv("1\t\"a\tb\"", '\t', "t")[0].fields, (std::vector<std::string>{"1", "a\tb"}));
}

TEST(CsvParse, MalformedQuotingNamesFileLineColumn) {
  EXPECT_ERROR(parse_csv("a,b\n1,x\"y\n", ',', "q.csv"),
               "q.csv:2:4:", "a quote inside an unquoted field");
  EXPECT_ERROR(parse_csv("a,b\n\"x\"y,1\n", ',', "q.csv"), "q.csv:2:4:", "after the closing quote");
  EXPECT_ERROR(parse_csv("a,b\n1,\"open\nmore\n", ',', "q.csv"), "q.csv:2:3:", "never closed");
  EXPECT_ERROR(parse_csv(std::string("a,b\n1,\0\n", 8), ',', "q.csv"), "q.csv:2:3:", "NUL");
  // Limits: a field over 1 MiB, quoted or not.
  EXPECT_ERROR(parse_csv("a\n" + std::string((1 << 20) + 1, '7'), ',', "big.csv"),
               "big.csv:2:1:", "longer than 1048576 bytes");
  EXPECT_ERROR(parse_csv("\"" + std::string((1 << 20) + 1, '7') + "\"", ',', "big.csv"),
               "big.csv:1:1:", "longer than");
}

TEST(CsvArrays, ColumnsByNameOrIndexWithDtypes) {
  std::string f =
      put("t.csv", "\"id\",a,b,\"the label\"\n7, 1.5 ,-2,1\n8,+3,4e1,\"0\"\n9,5,6,2.0\n");
  auto t = read_csv_arrays({f}, {.features = {{"b"}, {"", 1}}, .labels = {{"the label"}}});
  EXPECT_EQ(t.features.shape(), (cs::Shape{3, 2}));
  EXPECT_EQ(t.features.to_vector<float>(), (std::vector<float>{-2, 1.5, 40, 3, 6, 5}));
  EXPECT_EQ(t.labels.dtype(), cs::DType::i64);
  EXPECT_EQ(t.labels.to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 2}));  // "2.0" is 2
  EXPECT_EQ(t.feature_columns, (std::vector<std::string>{"b", "a"}));
  // Default features: every column but the labels; two label columns give [N, 2].
  auto u =
      read_csv_arrays({f}, {.labels = {{"id"}, {"the label"}}, .labels_dtype = cs::DType::i32});
  EXPECT_EQ(u.feature_columns, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(u.labels.shape(), (cs::Shape{3, 2}));
  EXPECT_EQ(u.labels.to_vector<int32_t>(), (std::vector<int32_t>{7, 1, 8, 0, 9, 2}));
  // No header: indices only; .tsv is tab-separated; several files make one data set.
  std::string g = put("t.tsv", "1\t2\t0\n3\t4\t1\n");
  std::string h = put("u.tsv", "5\t6\t1\n");
  auto v = read_csv_arrays({g, h}, {.header = false, .labels = {{"", 2}}});
  EXPECT_EQ(v.features.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(v.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1}));
}

TEST(CsvArrays, BadRowsAndValuesNameFileLineColumn) {
  std::string f = put("bad.csv", "a,b,y\n1,2,0\n\"multi\nline\",2,0\n");
  EXPECT_ERROR(read_csv_arrays({f}, {.labels = {{"y"}}}), "bad.csv:3:1: column 'a'",
               "'multi\nline' is not a number");
  f = put("bad.csv", "a,b,y\n1,2,0\n1,2\n");
  EXPECT_ERROR(read_csv_arrays({f}, {.labels = {{"y"}}}), "bad.csv:3:3: 2 fields, expected 3");
  f = put("bad.csv", "a,b,y\n1,2,0,9\n");
  EXPECT_ERROR(read_csv_arrays({f}, {.labels = {{"y"}}}), "bad.csv:2:7: 4 fields, expected 3");
  f = put("bad.csv", "a,b,y\n1,x2,0\n");
  EXPECT_ERROR(read_csv_arrays({f}, {.labels = {{"y"}}}), "bad.csv:2:3: column 'b'",
               "'x2' is not a number");
  f = put("bad.csv", "a,b,y\n1,2,0.5\n");
  EXPECT_ERROR(read_csv_arrays({f}, {.labels = {{"y"}}}), "bad.csv:2:5: column 'y'",
               "'0.5' is not an integer");
  f = put("bad.csv", "a,b,y\n1,nan,0\n");
  EXPECT_ERROR(read_csv_arrays({f}, {.labels = {{"y"}}}), "bad.csv:2:3:", "not a finite number");
  // Limits of the dtypes.
  f = put("bad.csv", "a,b,y\n1,1e39,0\n");
  EXPECT_ERROR(read_csv_arrays({f}, {.labels = {{"y"}}}),
               "bad.csv:2:3:", "out of the range of f32");
  f = put("bad.csv", "a,b,y\n1,2,3000000000\n");
  EXPECT_ERROR(read_csv_arrays({f}, {.labels = {{"y"}}, .labels_dtype = cs::DType::i32}),
               "bad.csv:2:5:", "out of the range of i32");
  // Columns that do not exist or are used twice; empty files; headers that differ.
  f = put("ok.csv", "a,b,y\n1,2,0\n");
  EXPECT_ERROR(read_csv_arrays({f}, {.labels = {{"label"}}}), "ok.csv: labels names column 'label'",
               "columns: a, b, y");
  EXPECT_ERROR(read_csv_arrays({f}, {.labels = {{"", 3}}}), "column index 3", "3 columns (0..2)");
  EXPECT_ERROR(read_csv_arrays({f}, {.features = {{"y"}}, .labels = {{"y"}}}), "used twice");
  EXPECT_ERROR(read_csv_arrays({put("h.csv", "a,a\n1,2\n")}, {}), "h.csv:1:3:", "'a' repeats");
  EXPECT_ERROR(read_csv_arrays({put("e.csv", "a,y\n")}, {}), "no data rows");
  EXPECT_ERROR(read_csv_arrays({put("e.csv", "")}, {}), "e.csv: the file is empty");
  EXPECT_ERROR(read_csv_arrays({f, put("o.csv", "a,c,y\n1,2,0\n")}, {}), "o.csv:1: the header",
               "differs");
  EXPECT_ERROR(read_csv_arrays({(root() / "none.csv").string()}, {}), "cannot open", "none.csv",
               "No such file or directory");
  EXPECT_ERROR(read_csv_arrays({root().string()}, {}), "cannot open", "it is a directory");
}

// A UTF-8 byte-order mark (Excel's "CSV UTF-8") is skipped: it was read into the first column's
// name, and naming that column failed with "header lacks 'f0' (columns: f0, f1, label)".
TEST(CsvArrays, ByteOrderMarkIsSkipped) {
  const std::string bom = "\xEF\xBB\xBF";
  std::string f = put("bom.csv", bom + "f0,f1,label\n1,2,0\n3,4,1\n");
  auto t = read_csv_arrays({f}, {.features = {{"f0"}}, .labels = {{"label"}}});
  EXPECT_EQ(t.feature_columns, (std::vector<std::string>{"f0"}));
  EXPECT_EQ(t.features.to_vector<float>(), (std::vector<float>{1, 3}));
  EXPECT_EQ(t.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
  // Each file's mark: one file with it and one without have the same header.
  auto u = read_csv_arrays({f, put("nobom.csv", "f0,f1,label\n5,6,1\n")}, {.labels = {{"label"}}});
  EXPECT_EQ(u.features.to_vector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // Columns of line 1 count from after the mark, as an editor shows them.
  EXPECT_ERROR(read_csv_arrays({put("bom.csv", bom + "a,a\n1,2\n")}, {}),
               "bom.csv:1:3:", "'a' repeats");
  EXPECT_EQ(parse_csv(bom + "x,y\n", ',', "t")[0].field_column, (std::vector<int64_t>{1, 3}));
  EXPECT_ERROR(read_csv_arrays({put("bom.csv", bom)}, {}), "bom.csv: the file is empty");
}

// ---------------------------------------------------------------------------------------------
// NumPy

TEST(Npy, ReadsEachDtypeInCOrder) {
  py("np.save('f4.npy', np.arange(6, dtype='<f4').reshape(2, 3))\n"
     "np.save('f8.npy', np.array([0.5, -1e300]))\n"
     "np.save('i8.npy', np.array([-5, 2**40], dtype='<i8'))\n"
     "np.save('i4.npy', np.array([[1], [2]], dtype='<i4'))\n"
     "np.save('u1.npy', np.array([0, 255], dtype='u1'))\n"
     "np.save('b1.npy', np.array([True, False, True]))\n"
     "np.save('nan.npy', np.array([[0.5, 1.0], [np.nan, 2.0]], dtype='<f4'))\n"
     "np.save('inf.npy', np.array([1.0, -np.inf]))\n"
     "np.lib.format.write_array(open('v2.npy', 'wb'), np.ones((2, 2), 'f4'), version=(2, 0))\n"
     "np.savez('a.npz', x=np.arange(4, dtype='f8').reshape(2, 2), y=np.array([1, 0]))\n"
     "np.savez_compressed('c.npz', x=np.zeros((3, 5), 'f4'))");
  auto r = [](const std::string& n) { return read_npy((root() / n).string()); };
  HostArray a = r("f4.npy");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(array_to_tensor(a, cs::DType::f32).to_vector<float>(),
            (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(r("f8.npy").type, ElemType::f64);
  EXPECT_ERROR(array_to_tensor(r("f8.npy"), cs::DType::f32), "f8.npy: element 1",
               "out of the range");
  EXPECT_EQ(array_to_tensor(r("i8.npy"), cs::DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{-5, int64_t{1} << 40}));
  EXPECT_ERROR(array_to_tensor(r("i8.npy"), cs::DType::i32), "element 1 (1099511627776)",
               "out of the range of i32");
  EXPECT_EQ(array_to_tensor(r("i4.npy"), cs::DType::f32).shape(), (cs::Shape{2, 1}));
  EXPECT_EQ(array_to_tensor(r("u1.npy"), cs::DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{0, 255}));
  EXPECT_ERROR(array_to_tensor(r("u1.npy"), cs::DType::boolean), "255", "neither 0 nor 1");
  // Not finite: refused as the CSV reader refuses it (a NaN feature trained to NaN losses).
  EXPECT_ERROR(array_to_tensor(r("nan.npy"), cs::DType::f32), "nan.npy: element 2 (nan)",
               "is not a finite number");
  EXPECT_ERROR(array_to_tensor(r("inf.npy"), cs::DType::f32), "inf.npy: element 1 (-inf)",
               "is not a finite number");
  cs::Tensor b = array_to_tensor(r("b1.npy"), cs::DType::boolean);
  EXPECT_EQ(b.dtype(), cs::DType::boolean);
  EXPECT_EQ(array_to_tensor(r("b1.npy"), cs::DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(r("v2.npy").shape, (std::vector<int64_t>{2, 2}));
  // Float labels convert to integers only when integral.
  EXPECT_EQ(array_to_tensor(read_npz((root() / "a.npz").string(), "x"), cs::DType::i64)
                .to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_ERROR(array_to_tensor(r("f8.npy"), cs::DType::i64), "element 0 (0.5)", "not an integer");
  EXPECT_EQ(npz_names((root() / "a.npz").string()), (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(read_npz((root() / "c.npz").string(), "x").shape, (std::vector<int64_t>{3, 5}));
  EXPECT_ERROR(read_npz((root() / "a.npz").string(), "z"), "a.npz' has no array 'z'",
               "arrays: x, y");
}

TEST(Npy, StrictHeaderAndSizeChecks) {
  py("np.save('fo.npy', np.asfortranarray(np.ones((2, 3), 'f4')))\n"
     "np.save('be.npy', np.ones(3, '>f4'))\n"
     "np.save('c8.npy', np.ones(3, 'c8'))\n"
     "np.save('ok.npy', np.ones((4, 4), 'f4'))\n"
     "np.savez('fo.npz', x=np.asfortranarray(np.ones((2, 3))))");
  auto p = [](const std::string& n) { return (root() / n).string(); };
  EXPECT_ERROR(read_npy(p("fo.npy")), "fo.npy", "Fortran order", "np.ascontiguousarray");
  EXPECT_ERROR(read_npz(p("fo.npz"), "x"), "fo.npz:x", "Fortran order");
  EXPECT_ERROR(read_npy(p("be.npy")), "be.npy: dtype '>f4' is not supported");
  EXPECT_ERROR(read_npy(p("c8.npy")), "dtype '<c8' is not supported");
  const std::string ok = read_file(p("ok.npy"));
  // Truncated, or longer than the header says.
  EXPECT_ERROR(read_npy(put("cut.npy", ok.substr(0, ok.size() - 1))), "cut.npy",
               "shape (4, 4) of float32, 64 data bytes, but the file holds 63");
  EXPECT_ERROR(read_npy(put("long.npy", ok + "x")), "holds 65");
  EXPECT_ERROR(read_npy(put("magic.npy", "PK" + ok)), "magic.npy: not a .npy file");
  EXPECT_ERROR(read_npy(put("short.npy", "\x93NUMPY")), "too short");
  // A header whose shape claims far more than the file: refused before allocating.
  auto with_header = [](std::string dict) {
    dict += std::string(118 - dict.size(), ' ') + "\n";
    std::string s = std::string("\x93NUMPY\x01\x00", 8) + char(dict.size() & 0xff) +
                    char(dict.size() >> 8) + dict;
    return s + std::string(16, '\0');
  };
  EXPECT_ERROR(read_npy(put("huge.npy", with_header("{'descr': '<f4', 'fortran_order': False, "
                                                    "'shape': (1099511627776, 1099511627776), }"))),
               "huge.npy", "too large");
  EXPECT_ERROR(read_npy(put("big.npy", with_header("{'descr': '<f4', 'fortran_order': False, "
                                                   "'shape': (1000000000,), }"))),
               "4000000000 data bytes, but the file holds 16");
  EXPECT_ERROR(read_npy(put("key.npy", with_header("{'descr': '<f4', 'fortran_order': False, "
                                                   "'shape': (4,), 'extra': 1}"))),
               "key.npy: malformed .npy header", "'extra'");
  EXPECT_ERROR(read_npy(put("neg.npy", with_header("{'descr': '<f4', 'fortran_order': False, "
                                                   "'shape': (-4,), }"))),
               "negative dimension");
  EXPECT_ERROR(read_npy(put("nof.npy", with_header("{'descr': '<f4', 'shape': (4,), }"))),
               "missing one of");
  EXPECT_ERROR(read_npz(put("notzip.npz", ok), "x"), "notzip.npz' is not a readable .npz");
  // An archive whose directory claims a huge member: refused before allocating.
  py("import struct\n"
     "np.savez('lie.npz', x=np.ones(4, 'f4'))\n"
     "b = bytearray(open('lie.npz', 'rb').read())\n"
     "c = b.index(b'PK\\x01\\x02')\n"
     "b[c + 24:c + 28] = struct.pack('<I', 0xfffffff0)\n"
     "open('lie.npz', 'wb').write(b)");
  EXPECT_ERROR(read_npz(p("lie.npz"), "x"), "lie.npz:x", "corrupt archive");
  // A flipped data byte: found by the member's CRC-32, stored or deflated (a stored member's
  // flipped byte was read as data, a deflated one's trained on; numpy says 'Bad CRC-32').
  py("import zlib, zipfile\n"
     "np.savez('crc.npz', x=np.arange(64, dtype='f4'))\n"
     "b = bytearray(open('crc.npz', 'rb').read())\n"
     "b[b.index(b'PK\\x01\\x02') - 9] ^= 1\n"
     "open('crc.npz', 'wb').write(b)\n"
     "with zipfile.ZipFile('crcz.npz', 'w', zipfile.ZIP_DEFLATED) as z:\n"
     "  z.writestr('x.npy', open('ok.npy', 'rb').read())\n"
     "b = bytearray(open('crcz.npz', 'rb').read())\n"
     "c = b.index(b'PK\\x01\\x02')\n"
     "raw = bytes(b[30 + 5:c])\n"
     "ok = open('ok.npy', 'rb').read()\n"
     "def flip():\n"
     "  # a bit of the deflate stream whose flip still inflates to a valid header: data only\n"
     "  for i in range(len(raw) - 8, 0, -1):\n"
     "    for bit in range(8):\n"
     "      t = bytearray(raw); t[i] ^= 1 << bit\n"
     "      try:\n"
     "        out = zlib.decompressobj(-15).decompress(bytes(t))\n"
     "      except zlib.error:\n"
     "        continue\n"
     "      if len(out) == len(ok) and out[:128] == ok[:128] and out != ok:\n"
     "        b[30 + 5 + i] ^= 1 << bit\n"
     "        return\n"
     "  raise SystemExit('no such bit')\n"
     "flip()\n"
     "open('crcz.npz', 'wb').write(b)");
  EXPECT_ERROR(read_npz(p("crc.npz"), "x"), "crc.npz:x: the archive member is damaged", "CRC");
  EXPECT_ERROR(read_npz(p("crcz.npz"), "x"), "crcz.npz:x: the archive member is damaged", "CRC");
}

// ---------------------------------------------------------------------------------------------
// HDF5

TEST(H5Arrays, ReadsDatasetsByNameWithTypeChecks) {
  py("with h5py.File('d.h5', 'w') as f:\n"
     "  f['f4'] = np.arange(6, dtype='f4').reshape(3, 2)\n"
     "  f['f8'] = np.array([1.0, 2.0])\n"
     "  f['i2'] = np.array([-3, 4], dtype='i2')\n"
     "  f['u2'] = np.array([65535], dtype='u2')\n"
     "  f['u1'] = np.array([7], dtype='u1')\n"
     "  f['b'] = np.array([True, False])\n"
     "  f['g/x'] = np.array([5], dtype='i8')\n"
     "  f['s'] = np.array([b'ab', b'cd'])\n"
     "  f['u8'] = np.array([1], dtype='u8')\n"
     "  f['scalar'] = 3.0\n");
  const std::string f = (root() / "d.h5").string();
  EXPECT_EQ(array_to_tensor(read_h5_array(f, "f4"), cs::DType::f32).to_vector<float>(),
            (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(read_h5_array(f, "f4").shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(read_h5_array(f, "f8").type, ElemType::f64);
  EXPECT_EQ(array_to_tensor(read_h5_array(f, "i2"), cs::DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{-3, 4}));
  EXPECT_EQ(array_to_tensor(read_h5_array(f, "u2"), cs::DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{65535}));
  EXPECT_EQ(read_h5_array(f, "u1").type, ElemType::u8);
  EXPECT_EQ(array_to_tensor(read_h5_array(f, "b"), cs::DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(array_to_tensor(read_h5_array(f, "/g/x"), cs::DType::i64).to_vector<int64_t>(),
            (std::vector<int64_t>{5}));
  EXPECT_ERROR(read_h5_array(f, "s"), "d.h5:s", "string type", "not supported");
  EXPECT_ERROR(read_h5_array(f, "u8"), "d.h5:u8", "unsigned 64-bit");
  EXPECT_ERROR(read_h5_array(f, "scalar"), "d.h5:scalar", "scalar");
  EXPECT_ERROR(read_h5_array(f, "nope"), "d.h5' has no dataset 'nope'", "b, f4, f8");
  EXPECT_ERROR(read_h5_array(put("x.h5", "not hdf5"), "a"), "x.h5' is not an HDF5 file");
  // A damaged dataset header claiming 10^9 rows of the 1000 stored: refused before allocating
  // the 400 GB (HDF5 itself notices a file cut short).
  py("import struct\n"
     "with h5py.File('dims.h5', 'w') as f:\n"
     "  f['big'] = np.ones((1000, 100), 'f4')\n"
     "b = open('dims.h5', 'rb').read()\n"
     "assert b.count(struct.pack('<QQ', 1000, 100)) >= 1\n"
     "b = b.replace(struct.pack('<QQ', 1000, 100), struct.pack('<QQ', 10**9, 100))\n"
     "open('dims.h5', 'wb').write(b)");
  EXPECT_ERROR(read_h5_array((root() / "dims.h5").string(), "big"), "dims.h5:big",
               "400000000000 bytes do not fit the file (400000 stored bytes");
}

// What the file stores bounds what a dataset's shape may claim, checked before anything is
// allocated: a 1.6 KB file whose chunks were never written claimed 16 GB (it took 10 GB and a
// minute, or ended in a bare std::bad_alloc naming no file). Legitimate layouts still read:
// partial edge chunks, gzip at its best ratio with shuffle and checksum, a grown dataset, 0 rows.
TEST(H5Arrays, StoredBytesBoundTheShape) {
  py("with h5py.File('s.h5', 'w') as f:\n"
     "  f.create_dataset('edge', data=np.arange(30, dtype='f4').reshape(10, 3), chunks=(3, 2))\n"
     "  f.create_dataset('gz', data=np.zeros((100000, 4), 'f8'), chunks=(10000, 4),\n"
     "                   compression='gzip', compression_opts=9, shuffle=True, fletcher32=True)\n"
     "  d = f.create_dataset('grown', shape=(0, 2), dtype='i8', maxshape=(None, 2),\n"
     "                       chunks=(4, 2))\n"
     "  d.resize((10, 2))\n"
     "  d[:] = np.arange(20).reshape(10, 2)\n"
     "  f.create_dataset('none', shape=(0, 2), dtype='f4', maxshape=(None, 2))\n"
     "  f.create_dataset('x', shape=(2**36, 2), dtype='f4', chunks=(1024, 2))\n"
     "  f.create_dataset('y', shape=(2**37,), dtype='i8', chunks=(1024,))\n"
     "  f.create_dataset('flat', shape=(10**6, 2), dtype='f4')\n"
     "  d = f.create_dataset('half', shape=(100, 2), dtype='f4', chunks=(10, 2))\n"
     "  d[:50] = 1\n");
  const std::string f = (root() / "s.h5").string();
  EXPECT_EQ(array_to_tensor(read_h5_array(f, "edge"), cs::DType::f32).to_vector<float>()[29], 29);
  EXPECT_EQ(read_h5_array(f, "gz").shape, (std::vector<int64_t>{100000, 4}));
  EXPECT_EQ(array_to_tensor(read_h5_array(f, "grown"), cs::DType::i64).to_vector<int64_t>()[19],
            19);
  EXPECT_EQ(read_h5_array(f, "none").shape, (std::vector<int64_t>{0, 2}));
  // Chunks never written (the fill value, stored nowhere): 2^39 and 2^40 bytes claimed by a file
  // of a few KB, refused at once, not allocated.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_ERROR(read_h5_array(f, "x"),
               "s.h5:x: only 0 of the dataset's 67108864 chunks were ever written (shape "
               "(68719476736, 2) of 4-byte elements, 549755813888 bytes; 0 bytes stored)",
               "fill value");
  EXPECT_ERROR(read_h5_array(f, "y"), "s.h5:y: only 0 of the dataset's 134217728 chunks",
               "1099511627776 bytes");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 10);
  // A contiguous dataset never written; one whose later chunks were never written.
  EXPECT_ERROR(read_h5_array(f, "flat"),
               "s.h5:flat: the dataset (shape (1000000, 2) of 4-byte elements, 8000000 bytes) was "
               "never written");
  EXPECT_ERROR(read_h5_array(f, "half"), "s.h5:half: only 5 of the dataset's 10 chunks",
               "resize the dataset to the rows written");
  // A damaged gzip dataset whose shape and chunk claim 16 MB of its few stored bytes: beyond
  // deflate's 1032:1, refused (libhdf5 reads past its buffer on it; h5py crashes).
  py("import struct\n"
     "with h5py.File('bomb.h5', 'w') as f:\n"
     "  f.create_dataset('x', data=np.zeros((1000, 4), 'f4'), chunks=(1000, 4),\n"
     "                   compression='gzip')\n"
     "b = open('bomb.h5', 'rb').read()\n"
     "assert b.count(struct.pack('<III', 1000, 4, 4)) == 1\n"
     "b = b.replace(struct.pack('<QQ', 1000, 4), struct.pack('<QQ', 10**6, 4))\n"
     "b = b.replace(struct.pack('<III', 1000, 4, 4), struct.pack('<III', 10**6, 4, 4))\n"
     "open('bomb.h5', 'wb').write(b)");
  EXPECT_ERROR(read_h5_array((root() / "bomb.h5").string(), "x"),
               "bomb.h5:x: the dataset (shape (1000000, 4) of 4-byte elements, 16000000 bytes) has",
               "compressed with deflate: more than the 1032:1");
}

// ---------------------------------------------------------------------------------------------
// JSON Lines text

namespace {
BpeTokenizer small_tokenizer() {
  std::string v = (root() / "vocab.json").string(), m = (root() / "merges.txt").string();
  if (!fs::exists(v))
    train_bpe({" the cat sat", " the dog ran"},
              {.vocab_size = 300, .min_frequency = 1, .special_tokens = {"<|endoftext|>"}}, v, m);
  return BpeTokenizer::from_files(v, m);
}
}  // namespace

TEST(JsonlText, TokensOfEachDocumentThenEos) {
  BpeTokenizer tok = small_tokenizer();
  std::string f =
      put("d.jsonl", "{\"text\": \"the cat\", \"id\": 1}\r\n\n{\"body\": 2, \"text\": \"ran\"}\n");
  auto ids = tokenize_jsonl({f}, tok, "text", 0, 0);
  std::vector<int32_t> want;
  for (auto t : tok.encode("the cat")) want.push_back(static_cast<int32_t>(t));
  want.push_back(0);
  for (auto t : tok.encode("ran")) want.push_back(static_cast<int32_t>(t));
  want.push_back(0);
  EXPECT_EQ(ids, want);
  EXPECT_ERROR(tokenize_jsonl({put("b.jsonl", "{\"text\": \"a\"}\n{\"text\": \"b\",}\n")}, tok,
                              "text", 0, 0),
               "b.jsonl:2:", "invalid JSON");
  EXPECT_ERROR(tokenize_jsonl({put("b.jsonl", "[1]\n")}, tok, "text", 0, 0),
               "b.jsonl:1:", "expected a JSON object");
  EXPECT_ERROR(tokenize_jsonl({put("b.jsonl", "\n{\"txt\": \"a\"}\n")}, tok, "text", 0, 0),
               "b.jsonl:2:", "no field 'text'");
  EXPECT_ERROR(tokenize_jsonl({put("b.jsonl", "{\"text\": 5}\n")}, tok, "text", 0, 0),
               "b.jsonl:1:", "is a number, not a string");
  EXPECT_ERROR(tokenize_jsonl({put("b.jsonl", "\n\n")}, tok, "text", 0, 0), "no documents");
  EXPECT_ERROR(tokenize_jsonl({f}, tok, "text", 0, 100),
               "d.jsonl:1:", "outside the model's vocabulary of 100");
  // Read line by line: a last line without its newline is a document as well, and a directory
  // or a missing file is an error naming it.
  EXPECT_EQ(tokenize_jsonl({put("n.jsonl", "{\"text\": \"the cat\"}\r\n{\"text\": \"ran\"}")}, tok,
                           "text", 0, 0),
            want);
  EXPECT_ERROR(tokenize_jsonl({root().string()}, tok, "text", 0, 0), "JSON Lines data",
               "it is a directory");
  EXPECT_ERROR(tokenize_jsonl({(root() / "absent.jsonl").string()}, tok, "text", 0, 0),
               "cannot open", "absent.jsonl");
}

// The JSONL processor makes exactly the batches the flat-token GPT processor makes from the same
// token stream (documents joined by eos, windows of msl + 1), so the GPT-2 model trains from it
// as from the shipped data.
TEST(JsonlText, ProcessorMatchesTheGptFlatTokenProcessor) {
  const fs::path dir = root() / "gpt";
  write_synthetic_gpt_data(dir.string(), 16, {.train_documents = 40, .val_documents = 2});
  std::string jsonl;
  for (const auto& d : synthetic_documents(40, 2024)) {
    std::string text;
    for (const auto& s : d) text += " " + s;  // as the synthetic writer encodes each sentence
    jsonl += cs::Config{{"text", text}}.dump() + "\n";
  }
  write_file(dir / "train.jsonl", jsonl);
  auto flat = processor({{"data_processor", "GptFlatTokenDataProcessor"},
                         {"data_dir", dir.string()},
                         {"max_sequence_length", 16},
                         {"batch_size", 4},
                         {"shuffle", false}});
  auto mine = processor({{"data_processor", "JSONLTextDataProcessor"},
                         {"data_dir", dir.string()},
                         {"files", "train.jsonl"},
                         {"vocab_file", "vocab.json"},
                         {"merges_file", "merges.txt"},
                         {"eos_token", "<|endoftext|>"},
                         {"max_sequence_length", 16},
                         {"vocab_size", 512},
                         {"batch_size", 4},
                         {"shuffle", false}});
  EXPECT_EQ(mine->size(), flat->size());
  int batches = 0;
  while (auto a = flat->next()) {
    auto b = mine->next();
    ASSERT_TRUE(b.has_value());
    for (const char* k : {"input_ids", "labels", "attention_mask"}) {
      EXPECT_EQ(b->at(k).dtype(), cs::DType::i32);
      EXPECT_EQ(b->at(k).to_vector<int32_t>(), a->at(k).to_vector<int32_t>()) << k;
    }
    ++batches;
  }
  EXPECT_GT(batches, 10);
  EXPECT_ERROR(processor({{"data_processor", "JSONLTextDataProcessor"},
                          {"data_dir", dir.string()},
                          {"files", "train.jsonl"},
                          {"vocab_file", "vocab.json"},
                          {"merges_file", "merges.txt"},
                          {"eos_token", "</s>"},
                          {"batch_size", 4}}),
               "train_dataloader.eos_token: '</s>' is not in the vocabulary");
  // vocab_size 0 leaves ids unchecked; a negative one is an error (it was taken as 0).
  EXPECT_ERROR(processor({{"data_processor", "JSONLTextDataProcessor"},
                          {"data_dir", dir.string()},
                          {"files", "train.jsonl"},
                          {"vocab_file", "vocab.json"},
                          {"merges_file", "merges.txt"},
                          {"eos_token", "<|endoftext|>"},
                          {"vocab_size", -1},
                          {"batch_size", 4}}),
               "train_dataloader.vocab_size: must be 0 (unchecked) or more, got -1");
  EXPECT_ERROR(processor({{"data_processor", "GptFlatTokenDataProcessor"},
                          {"data_dir", dir.string()},
                          {"max_sequence_length", 16},
                          {"vocab_size", -1},
                          {"batch_size", 4}}),
               "train_dataloader.vocab_size: must be 0 (unchecked) or more, got -1");
}

// ---------------------------------------------------------------------------------------------
// Processors

TEST(ArrayProcessors, UnknownKeysListTheValidOnes) {
  for (std::string name :
       {"CSVDataProcessor", "NumpyDataProcessor", "HDF5DataProcessor", "JSONLTextDataProcessor"}) {
    SCOPED_TRACE(name);
    EXPECT_ERROR(processor({{"data_processor", name}, {"batch_size", 2}, {"label", "y"}}),
                 "train_dataloader.label: unknown key", "batch_size", "shuffle_seed", "drop_last");
  }
  EXPECT_ERROR(processor({{"data_processor", "CSVDataProcessor"},
                          {"files", put("p.csv", "a,y\n1,0\n")},
                          {"labels", "y"},
                          {"labels_dtype", "f64"},
                          {"batch_size", 2}}),
               "train_dataloader.labels_dtype: must be f32, i32, i64 or bool");
  EXPECT_ERROR(processor({{"data_processor", "CSVDataProcessor"},
                          {"files", put("p.csv", "a,y\n1,0\n")},
                          {"labels", "y"},
                          {"features_key", "y"},
                          {"batch_size", 2}}),
               "train_dataloader: features_key and labels_key are both 'y'");
  EXPECT_ERROR(processor({{"data_processor", "CSVDataProcessor"},
                          {"files", put("p.csv", "a,y\n1,0\n")},
                          {"delimiter", ";;"},
                          {"batch_size", 2}}),
               "train_dataloader.delimiter");
}

// num_workers 0 (PyTorch's main-process loading, in a ported config) runs one worker; a
// negative count is an error naming its key path.
TEST(ArrayProcessors, NumWorkersZeroRunsOneWorker) {
  auto l = processor({{"data_processor", "CSVDataProcessor"},
                      {"files", put("w.csv", "a,y\n1,0\n2,1\n")},
                      {"labels", "y"},
                      {"num_workers", 0},
                      {"batch_size", 1}});
  EXPECT_EQ(l->num_workers(), 1);
  int batches = 0;
  while (l->next()) ++batches;
  EXPECT_EQ(batches, 2);
  EXPECT_ERROR(processor({{"data_processor", "CSVDataProcessor"},
                          {"files", put("w.csv", "a,y\n1,0\n")},
                          {"labels", "y"},
                          {"num_workers", -1},
                          {"batch_size", 1}}),
               "train_dataloader.num_workers: must be 0 or more, got -1");
}

TEST(ArrayProcessors, EachReadsTheSameTableAndChecksShapes) {
  py("x = np.arange(40, dtype='f4').reshape(10, 4)\n"
     "y = np.arange(10) % 3\n"
     "np.save('x.npy', x); np.save('y.npy', y); np.savez('xy.npz', feats=x, labs=y)\n"
     "with h5py.File('xy.h5', 'w') as f:\n"
     "  f['feats'] = x; f['labs'] = y\n"
     "with open('xy.csv', 'w') as f:\n"
     "  f.write('a,b,c,d,label\\n')\n"
     "  for r, l in zip(x.tolist(), y.tolist()): f.write(','.join(map(str, r)) + ',%d\\n' % l)\n");
  const std::string d = root().string();
  std::vector<cs::Config> cases = {
      {{"data_processor", "CSVDataProcessor"}, {"files", "xy.csv"}, {"labels", "label"}},
      {{"data_processor", "NumpyDataProcessor"}, {"features", "x.npy"}, {"labels", "y.npy"}},
      {{"data_processor", "NumpyDataProcessor"},
       {"file", "xy.npz"},
       {"features", "feats"},
       {"labels", "labs"}},
      {{"data_processor", "HDF5DataProcessor"},
       {"file", "xy.h5"},
       {"features", "feats"},
       {"labels", "labs"}}};
  for (cs::Config c : cases) {
    SCOPED_TRACE(c.dump());
    c["data_dir"] = d;
    c["batch_size"] = 3;
    c["shuffle"] = false;
    c["num_workers"] = 2;  // two workers: each takes every other sample
    auto loader = processor(c);
    std::multiset<float> firsts;
    std::vector<int64_t> labels;
    while (auto b = loader->next()) {
      EXPECT_EQ(b->at("x").dtype(), cs::DType::f32);
      EXPECT_EQ(b->at("x").size(1), 4);
      auto x = b->at("x").to_vector<float>();
      auto y = b->at("y").to_vector<int64_t>();
      for (size_t i = 0; i < y.size(); ++i) {
        firsts.insert(x[i * 4]);
        EXPECT_EQ(y[i], static_cast<int64_t>(x[i * 4]) / 4 % 3);  // rows stay whole
      }
    }
    EXPECT_EQ(firsts, (std::multiset<float>{0, 4, 8, 12, 16, 20, 24, 28, 32, 36}));
    c["features_shape"] = {5};
    EXPECT_ERROR(processor(c), "each sample has shape [4]",
                 "train_dataloader.features_shape is [5]");
  }
  EXPECT_ERROR(processor({{"data_processor", "HDF5DataProcessor"},
                          {"file", (root() / "xy.h5").string()},
                          {"features", "feats"},
                          {"labels", "missing"},
                          {"batch_size", 2}}),
               "xy.h5' has no dataset 'missing'", "feats, labs");
  EXPECT_ERROR(processor({{"data_processor", "NumpyDataProcessor"},
                          {"data_dir", d},
                          {"features", "x.npy"},
                          {"labels", "xy.npz"},
                          {"batch_size", 2}}),
               "train_dataloader.labels", "is a .npz archive");
  py("np.save('y5.npy', np.zeros(5, 'i8'))");
  EXPECT_ERROR(processor({{"data_processor", "NumpyDataProcessor"},
                          {"data_dir", d},
                          {"features", "x.npy"},
                          {"labels", "y5.npy"},
                          {"batch_size", 2}}),
               "x.npy has 10 samples but", "y5.npy has 5");
}

// fc_mnist takes any table (input_size, num_classes) and says in the data's terms when the
// batch does not fit it.
TEST(ArrayProcessors, FcModelChecksTheBatchAgainstItsSizes) {
  cs::Config args = {{"input_size", 4}, {"num_classes", 3}, {"hidden_sizes", {8}}};
  auto model = modelzoo::models().create("fc_mnist", modelzoo::ConfigView(args, "model"), "model");
  cs::Tensor x = cs::testing::rt({2, 4});
  EXPECT_TRUE(model->loss({{"x", x}, {"y", cs::testing::iv({0, 2})}}).defined());
  EXPECT_ERROR(model->loss({{"x", cs::testing::rt({2, 5})}, {"y", cs::testing::iv({0, 2})}}),
               "x must be f32 [B, 4] (input_size 4), got f32 [2, 5]");
  EXPECT_ERROR(model->loss({{"x", x}, {"y", cs::testing::iv({0, 3})}}),
               "y[1] = 3 is outside the classes 0..2 (num_classes 3)");
  // The same check on the host batch, as the Trainer runs it before a traced step.
  EXPECT_ERROR(model->check_batch_values({{"x", x}, {"y", cs::testing::iv({-1, 2})}}),
               "y[0] = -1 is outside the classes 0..2");
  model->check_batch_values({{"x", x}, {"y", cs::testing::iv({0, 2})}});
  EXPECT_ERROR(model->loss({{"x", x}, {"y", cs::testing::fv({0, 1})}}), "y must be i64");
  EXPECT_ERROR(model->loss({{"x", x}}), "no \"y\"");
  cs::Config bad = {{"num_classes", 1}};
  EXPECT_ERROR(modelzoo::models().create("fc_mnist", modelzoo::ConfigView(bad, "model"), "model"),
               "num_classes must be at least 2");
}
