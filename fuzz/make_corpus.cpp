// Writes the seed corpus of every fuzz target into OUT_DIR/<target>/ (scripts/fuzz.sh passes
// build-fuzz/corpus): valid inputs made with the project's own writers and files, so each
// target starts from inputs that get deep into its reader. Nothing is downloaded.
//
//   make_corpus OUT_DIR
#include <hdf5.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cstorch/checkpoint.h"
#include "cstorch/cstorch.h"
#include "cstorch/data/mnist.h"
#include "cstorch/data/tokenizer.h"

namespace fs = std::filesystem;
using namespace cstorch;

namespace {

fs::path out_root;

std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  fs::path dir = out_root / target;
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary) << bytes;
}

// A state with every kind of value the checkpoint formats hold: dtypes, 0-d and empty tensors,
// tied tensors (one storage under two keys), numbers, strings, none and nested lists.
State rich_state() {
  Tensor tied = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {3, 2});
  return State::map(
      {{"model", State::map({{"w", from_vector(std::vector<float>{0.5f, -1, 2, 3}, {2, 2})},
                             {"b", from_vector(std::vector<float>{1, 2}, {2}).to(DType::bf16)},
                             {"h", from_vector(std::vector<float>{3, 4}, {2}).to(DType::f16)},
                             {"i", from_vector(std::vector<int64_t>{1, -2}, {2})},
                             {"j", from_vector(std::vector<int32_t>{7}, {1})},
                             {"m", from_vector(std::vector<uint8_t>{1, 0}, {2}, DType::boolean)},
                             {"s", scalar_tensor(2)},
                             {"e", zeros({0})},
                             {"tied_a", tied},
                             {"tied_b", tied}})},
       {"opt", State::map({{"lr", 0.1}, {"step", 3}, {"name", "sgd"}, {"none", nullptr}})},
       {"list", State(std::vector<State>{1, 2.5, true, State(std::vector<State>{"x"})})}});
}

State flat_state() {
  return State::map(
      {{"weight", from_vector(std::vector<float>{1, 2, 3}, {3})}, {"bias", scalar_tensor(0.25)}});
}

void checkpoints(const fs::path& scratch) {
  // HDF5: small metadata blocks keep the files a few KiB (the default reserves 256 KiB).
  ::setenv("CSTORCH_TEST_HDF5_META_BLOCK_BYTES", "512", 1);
  const std::pair<const char*, const char*> kinds[] = {
      {"pt", ".pt"}, {"safetensors", ".safetensors"}, {"hdf5", ".mdl"}};
  for (auto [target, ext] : kinds) {
    int n = 0;
    for (const State& s : {flat_state(), rich_state()}) {
      fs::path p = scratch / (std::string("ckpt") + ext);
      save(s, p.string());
      std::string bytes = read_all(p);
      put(target, "state" + std::to_string(n) + ext, bytes);
      // The header's own checksum stops most mutations of a cstorch safetensors header before
      // it is parsed: a seed whose checksum keys are renamed (same lengths, not recognised, as
      // in a file of another writer) lets the fuzzer reach the header parser.
      bool renamed = false;
      for (size_t at = bytes.find("\"cstorch."); at != std::string::npos;
           at = bytes.find("\"cstorch.", at + 1)) {
        bytes[at + 1] = 'x';
        renamed = true;
      }
      if (renamed) put(target, "state" + std::to_string(n) + "_unchecked" + ext, bytes);
      ++n;
    }
  }
  // HDF5 tensors split into several chunks (each with its Fletcher-32 checksum).
  ::setenv("CSTORCH_TEST_HDF5_CHUNK_BYTES", "8", 1);
  fs::path p = scratch / "chunked.mdl";
  save(flat_state(), p.string());
  put("hdf5", "chunked.mdl", read_all(p));
  ::unsetenv("CSTORCH_TEST_HDF5_CHUNK_BYTES");
  ::unsetenv("CSTORCH_TEST_HDF5_META_BLOCK_BYTES");
}

void configs(const fs::path& source_dir) {
  for (const auto& e : fs::directory_iterator(source_dir / "configs"))
    if (e.path().extension() == ".yaml")
      put("config", e.path().filename().string(), read_all(e.path()));
  put("config", "legacy.yaml",
      "train_input: {data_processor: MNISTDataProcessor, batch_size: 8}\n"
      "eval_input: {data_processor: MNISTDataProcessor, batch_size: 8, split: test}\n"
      "model: {name: fc_mnist, hidden_sizes: [16]}\n"
      "optimizer:\n  optimizer_type: SGD\n  learning_rate:\n"
      "    - {scheduler: Linear, initial_learning_rate: 0.1, end_learning_rate: 0, total_iters: "
      "5}\n"
      "runconfig: {max_steps: 10, save_checkpoints_steps: 5, model_dir: m, mode: train}\n");
  put("config", "anchors.yaml",
      "base: &b {lr: 0.1, betas: [0.9, 0.99]}\nopt: *b\nmerged: {<<: *b, lr: 0.2}\n"
      "text: \"quoted \\u00e9\"\nblock: |\n  line one\n  line two\nnums: [0x1f, 1e3, -.5, ~]\n");
}

void idx(const fs::path& scratch) {
  auto idx_bytes = [&](const data::IdxArray& a) {
    fs::path p = scratch / "a.idx";
    data::write_idx(p.string(), a);
    return read_all(p);
  };
  data::IdxArray labels{{3}, {1, 7, 9}};
  data::IdxArray cube{{2, 2, 3}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}};
  put("idx", "labels", std::string(1, '\0') + idx_bytes(labels));
  put("idx", "cube", std::string(1, '\0') + idx_bytes(cube));
  // Mode 1: an MNIST split of two images (synthetic digits) and their labels.
  data::IdxArray images{{2, data::kMnistRows, data::kMnistCols}, {}};
  images.data.resize(2 * data::kMnistPixels);
  data::render_digit(3, 1, images.data.data());
  data::render_digit(8, 2, images.data.data() + data::kMnistPixels);
  std::string im = idx_bytes(images), lb = idx_bytes(data::IdxArray{{2}, {3, 8}});
  uint32_t len = static_cast<uint32_t>(im.size());
  std::string split(1, '\1');
  split.append(reinterpret_cast<const char*>(&len), 4);  // little-endian hosts, as the target
  put("idx", "split", split + im + lb);
}

void tokenizers(const fs::path& scratch) {
  const std::vector<std::string> texts = {
      "Hello world, hello tokens! It's 2024.", "The quick brown fox jumps over the lazy dog.",
      "  spaces\tand\nnewlines ",
      "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 <|endoftext|>"};
  data::BpeTrainerOptions o;
  o.vocab_size = 300;
  o.min_frequency = 1;
  o.special_tokens = {"<|endoftext|>"};
  fs::path v = scratch / "vocab.json", m = scratch / "merges.txt";
  data::train_bpe(texts, o, v.string(), m.string());
  const std::string files = read_all(v) + '\0' + read_all(m) + '\0';
  for (size_t i = 0; i < texts.size(); ++i)
    put("bpe", "text" + std::to_string(i), files + texts[i]);

  const std::string vocab =
      "[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\nquick\nbrown\nfox\nun\n##aff\n##able\n##s\n##ing\n"
      "hello\nworld\n,\n!\n.\ncafe\n\xe4\xb8\xad\n";
  const char opts[] = {static_cast<char>(3 | 25 << 2), static_cast<char>(0 | 4 << 2)};
  int n = 0;
  for (char c : opts)
    for (const char* text :
         {"Unaffable! The quick brown foxes.", "Caf\xc3\xa9 \xe4\xb8\xad hello,world"})
      put("wordpiece", "case" + std::to_string(n++), std::string(1, c) + vocab + '\0' + text);
}

void csv() {
  const std::string table = "a,b,c\n1,2.5,-3\n4,5e-1,6\n\n7, 8 ,9\n";
  put("csv", "plain", std::string(1, '\0') + table);
  put("csv", "int_first", std::string(1, '\2') + table);
  put("csv", "grouped", std::string(1, '\6') + table);
  put("csv", "semicolon", std::string(1, '\1') + "x;y\n1;2\n3;4\n");
}

// A .npy file (version 1.0) of `descr` and `shape` holding `data` (the header padded with spaces
// to a multiple of 64 bytes, as NumPy writes it).
std::string npy(const std::string& descr, const std::string& shape, const std::string& data) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string h = std::string("\x93NUMPY\x01\x00", 8);
  h += static_cast<char>(dict.size() & 0xff);
  h += static_cast<char>(dict.size() >> 8);
  return h + dict + data;
}

template <class T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// A ZIP archive of stored (uncompressed) members, as np.savez writes one.
std::string stored_zip(const std::vector<std::pair<std::string, std::string>>& members) {
  auto u16 = [](std::string& o, uint32_t v) {
    o += static_cast<char>(v & 0xff);
    o += static_cast<char>((v >> 8) & 0xff);
  };
  auto u32 = [&](std::string& o, uint32_t v) {
    u16(o, v & 0xffff);
    u16(o, v >> 16);
  };
  std::string out, dir;
  for (const auto& member : members) {
    // (Named, not bound: clang 15 does not capture structured bindings in lambdas.)
    const std::string& name = member.first;
    const std::string& data = member.second;
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(data.data()), static_cast<uInt>(data.size())));
    const uint32_t offset = static_cast<uint32_t>(out.size());
    auto common = [&](std::string& o) {  // version .. extra length, shared by both headers
      u16(o, 20);
      u16(o, 0);
      u16(o, 0);  // stored
      u16(o, 0);
      u16(o, 0x21);  // a valid DOS date
      u32(o, crc);
      u32(o, static_cast<uint32_t>(data.size()));
      u32(o, static_cast<uint32_t>(data.size()));
      u16(o, static_cast<uint32_t>(name.size()));
      u16(o, 0);
    };
    u32(out, 0x04034b50);
    common(out);
    out += name + data;
    u32(dir, 0x02014b50);
    u16(dir, 20);
    common(dir);
    u16(dir, 0);  // comment
    u16(dir, 0);  // disk
    u16(dir, 0);  // internal attributes
    u32(dir, 0);  // external attributes
    u32(dir, offset);
    dir += name;
  }
  const uint32_t dir_at = static_cast<uint32_t>(out.size());
  out += dir;
  u32(out, 0x06054b50);
  u16(out, 0);
  u16(out, 0);
  u16(out, static_cast<uint32_t>(members.size()));
  u16(out, static_cast<uint32_t>(members.size()));
  u32(out, static_cast<uint32_t>(dir.size()));
  u32(out, dir_at);
  u16(out, 0);
  return out;
}

// Seeds of fuzz_arrays: the first byte picks the reader (0 .npy, 1 .npz, 2 HDF5, 3 text,
// 4 JSON Lines).
void arrays(const fs::path& scratch) {
  const std::string x = npy("<f4", "(3, 2)", bytes_of(std::vector<float>{1, 2, 3, 4, 5, 6}));
  const std::string y = npy("<i8", "(3,)", bytes_of(std::vector<int64_t>{0, 1, 2}));
  put("arrays", "f4.npy", std::string(1, '\0') + x);
  put("arrays", "i8.npy", std::string(1, '\0') + y);
  put("arrays", "b1.npy", std::string(1, '\0') + npy("|b1", "(2,)", std::string("\1\0", 2)));
  put("arrays", "xy.npz", std::string(1, '\1') + stored_zip({{"x.npy", x}, {"y.npy", y}}));
  // HDF5: a contiguous f32 "x", an i64 "y" and a chunked, deflated f32 "g/z".
  const fs::path h5 = scratch / "arrays.h5";
  hid_t f = H5Fcreate(h5.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (f < 0) throw std::runtime_error("cannot create " + h5.string());
  auto write = [&](const char* name, hid_t type, std::vector<hsize_t> dims, const void* v,
                   hid_t dcpl) {
    hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    hid_t d = H5Dcreate2(f, name, type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (d < 0 || H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) < 0)
      throw std::runtime_error(std::string("cannot write dataset ") + name);
    H5Dclose(d);
    H5Sclose(space);
  };
  const std::vector<float> xv{1, 2, 3, 4, 5, 6}, zv(16, 0.5f);
  const std::vector<int64_t> yv{0, 1, 2};
  write("x", H5T_IEEE_F32LE, {3, 2}, xv.data(), H5P_DEFAULT);
  write("y", H5T_STD_I64LE, {3}, yv.data(), H5P_DEFAULT);
  hid_t g = H5Gcreate2(f, "g", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Gclose(g);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  const hsize_t chunk[2] = {2, 4};
  H5Pset_chunk(dcpl, 2, chunk);
  H5Pset_deflate(dcpl, 4);
  write("g/z", H5T_IEEE_F32LE, {4, 4}, zv.data(), dcpl);
  H5Pclose(dcpl);
  H5Fclose(f);
  put("arrays", "xyz.h5", std::string(1, '\2') + read_all(h5));
  put("arrays", "table.csv", std::string(1, '\3') + "label,a,b\n0,1.5,2\n1,-3,4e2\n");
  put("arrays", "bom.csv", std::string(1, '\3') + "\xEF\xBB\xBFlabel\ta\n1\t2\n");
  put("arrays", "docs.jsonl",
      std::string(1, '\4') +
          "{\"text\": \"the cat sat\", \"body\": \"ran\"}\r\n\n{\"text\": \"dog\"}");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  try {
    out_root = argv[1];
    fs::path scratch = out_root / ".scratch";
    fs::create_directories(scratch);
    checkpoints(scratch);
    configs(CSTORCH_SOURCE_DIR);
    idx(scratch);
    tokenizers(scratch);
    csv();
    arrays(scratch);
    fs::remove_all(scratch);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
