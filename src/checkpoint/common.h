// Internals shared by the checkpoint formats: the skeleton of a loaded state (structure with
// tensor references), the per-format reader interface, the JSON structure description used by
// HDF5 and safetensors, crash-safe file writing and small helpers.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/internal.h"
#include "cstorch/checkpoint.h"

namespace cstorch::ckpt {

using Json = nlohmann::ordered_json;

// Nested structures deeper than this are refused (guards recursion against hostile files).
inline constexpr int kMaxDepth = 512;

// A loaded state before its tensors are read: scalars as they are, tensors as indices into
// the reader's entries.
struct SNode {
  State::Kind kind = State::Kind::None;
  State scalar;         // None / Bool / Int / Float / String
  int64_t tensor = -1;  // Tensor: index into FormatReader::entries
  std::vector<std::string> keys;
  std::vector<SNode> items;  // list elements or map values (parallel to keys)
};

struct Entry {
  CheckpointTensorInfo info;
  int64_t storage = 0;  // entries with equal storage load as one shared tensor
};

// One open checkpoint file of some format.
class FormatReader {
 public:
  virtual ~FormatReader() = default;
  virtual Tensor read(const Entry& e) = 0;  // a fresh host tensor with the entry's value
  // Fills `root` and `entries` when a reader was opened lazily (idempotent).
  virtual void load_structure() {}
  // One tensor by flattened key without the structure, where the format allows it; nullopt:
  // use the structure (load_structure, then read).
  virtual std::optional<Tensor> read_direct(const std::string& key) { return std::nullopt; }

  // Set by each read: whether the bytes just read were checked against a checksum stored in
  // the file (false: the file holds none for them, e.g. an HDF5 file written before
  // checksums, or safetensors from another writer). Damage that a check finds is an error.
  bool verified = false;

  std::string path;
  CheckpointFormat format = CheckpointFormat::HDF5;
  int64_t version = 0;
  SNode root;
  std::vector<Entry> entries;
};

// `lazy`: leave the structure for load_structure() (CheckpointReader reads single tensors
// without it).
std::unique_ptr<FormatReader> open_hdf5(const std::string& path, bool lazy = false);
std::unique_ptr<FormatReader> open_pt(const std::string& path);
std::unique_ptr<FormatReader> open_safetensors(const std::string& path);
std::unique_ptr<FormatReader> open_any(const std::string& path, bool lazy = false);

// Builds the State of `r` (tensors read one at a time; shared storages read once).
State materialize(FormatReader& r, std::optional<Device> map_location);
void check_map_location(const std::optional<Device>& d, const std::string& path);

// The file a save to `path` writes: relative to configure()'s model_dir when configure() was
// called (creating that folder), else `path`. Inside a step closure queued by a training loop,
// first refuses (naming `what`) unless the closure's step is one of the loop's checkpoint steps.
std::string save_path(const std::string& path, const char* what);

// The file a load of `path` reads: after configure(), a relative path names the file in
// model_dir when there is one there, else the file relative to the working directory (neither:
// an error naming both places); otherwise `path`.
std::string load_path(const std::string& path);

// Fills `shared_with` of entries from their storage ids.
void link_shared(std::vector<Entry>& entries);

// Flattened key of child `k` under `prefix` ("a" + "b" -> "a.b"; "" + "b" -> "b").
std::string join_key(const std::string& prefix, const std::string& k);
// Display form of a key in messages (the root is "<root>").
std::string show_key(const std::string& key);

// Rounds n float64 values (little-endian, possibly unaligned) to f32 in dst: the reading of a
// tensor the file stores as float64 (CheckpointTensorInfo::file_dtype). NaN and infinities stay;
// a finite value beyond f32's range is an error naming the file, the tensor and the element.
void narrow_f64(const void* src, float* dst, int64_t n, const std::string& path,
                const std::string& key);

// A host tensor whose buffer is filled by `fill(dst)` (nbytes = numel * itemsize).
Tensor make_host_tensor(const Shape& shape, DType dtype, const std::function<void(void*)>& fill);
// Host data of a tensor being saved; an undefined tensor is an error naming the key.
// The tensor's bytes as host memory (a copy for a device the host cannot read), for writers.
cstorch::detail::HostBytes tensor_bytes(const Tensor& t, const std::string& path,
                                        const std::string& key);
// Identity of a tensor's storage, for tied-weight detection on save.
const void* tensor_identity(const Tensor& t);

// CRC-32 (zip's and safetensors metadata's checksum; zlib's implementation). `crc` continues a
// checksum over earlier bytes. Large buffers are summed in parts on several threads.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

// Checksums of large buffers are computed in parts on several threads: how many parts for
// `n` bytes (1: on the caller's thread alone), and running f(0) .. f(parts - 1), f(0) on the
// caller's thread (f must not throw).
size_t checksum_parts(size_t n);
void run_parts(size_t parts, const std::function<void(size_t)>& f);

bool valid_utf8(const std::string& s);
std::optional<DType> dtype_from_name(const std::string& name);  // "f32", ... "bool"
int64_t checked_numel(const Shape& s, const std::string& path, const std::string& key);

// The JSON structure description (docs/checkpoint-format.md). Encoding calls `on_tensor` for
// each tensor leaf with its flattened key; it returns the JSON object describing the tensor.
Json encode_structure(
    const State& s, const std::string& path,
    const std::function<Json(const std::string& key, const Tensor& t)>& on_tensor);
// Decoding validates every field; `on_tensor` receives the tensor's key and its JSON object and
// returns the entry index it created.
SNode decode_structure(
    const Json& j, const std::string& path,
    const std::function<int64_t(const std::string& key, const Json& t)>& on_tensor);
// Parses JSON text with a nesting limit; errors name the file and `what`.
Json parse_json(const std::string& text, const std::string& path, const char* what);

// A file written crash-safely: data goes to a temporary file beside `path`; commit() fsyncs it,
// renames it over `path` and fsyncs the folder. Destroyed without commit(): the temporary file
// is removed and `path` is untouched.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  const std::string& temp_path() const { return tmp_; }
  const std::string& path() const { return path_; }
  void commit();

 private:
  std::string path_, tmp_;
  bool committed_ = false;
};

// Buffered sequential writer on a file descriptor (large blocks are written directly).
class FileWriter {
 public:
  FileWriter(const std::string& path, const std::string& shown_path);
  ~FileWriter();
  void write(const void* data, size_t n);
  // Overwrites n bytes already written at `offset` (e.g. a header filled in at the end).
  void write_at(uint64_t offset, const void* data, size_t n);
  uint64_t offset() const { return offset_; }
  void close();  // flushes; errors name the file

 private:
  void flush();
  int fd_ = -1;
  std::string shown_;
  std::vector<char> buf_;
  uint64_t offset_ = 0;
};

// Read-only file with bounds-checked positional reads; errors name the file.
class FileReader {
 public:
  explicit FileReader(const std::string& path);
  ~FileReader();
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;
  uint64_t size() const { return size_; }
  // Reads exactly n bytes at `offset` (error if outside the file).
  void read(uint64_t offset, void* dst, size_t n, const char* what) const;
  std::string read_string(uint64_t offset, size_t n, const char* what) const;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
};

// Test hook: when CSTORCH_TEST_PAUSE_SAVE names a file, an HDF5 save writes that file (its
// content: the temporary path) half way through and then sleeps until killed.
void maybe_pause_save(const std::string& temp_path);

}  // namespace cstorch::ckpt
