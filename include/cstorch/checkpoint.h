// Checkpoints: save and load a nested cstorch::State (maps, lists, tensors, numbers, strings,
// none) to a file, and exchange weights with PyTorch (.pt) and safetensors.
//
//   cstorch::save(State::map({{"model", model->state_dict().to_state()}, ...}), "ckpt.mdl");
//   State s = cstorch::load("ckpt.mdl");
//
// Formats, chosen on save by the file extension and on load by the file's content:
// - HDF5 (.mdl, .h5, .hdf5 and any other extension): the native format, documented in
//   docs/checkpoint-format.md so that other programs (h5py) can read and write it.
// - PyTorch (.pt, .pth): the zip + pickle format of torch.save; torch.load reads what we write
//   into the same nested dicts and lists of tensors, and we read what torch.save writes
//   (tensors, dicts, OrderedDicts, lists, tuples, numbers, strings, None). An optimizer state
//   dict (a map of exactly "state", keyed by decimal parameter ids, and "param_groups") is
//   written as torch.optim's: int state keys, betas / etas / step_sizes as tuples, so
//   torch.optim.<Name>.load_state_dict takes it (docs/checkpoint-format.md).
// - safetensors (.safetensors): flat tensor maps; the nested structure and non-tensor values
//   travel in the header's __metadata__ so cstorch files round-trip exactly.
//
// Saving is crash safe: the file is written to a temporary file in the same folder, flushed
// to disk (fsync) and renamed over `path`; an HDF5 file gets its __SUCCESS__ marker last. A
// failed or interrupted save leaves an existing file at `path` untouched. A tensor that appears
// under several keys (tied weights: the same tensor object) is stored once and loads as one
// shared tensor.
//
// After cstorch::configure(), saves by a relative path write into its model_dir (the first
// save creates it), and loads by a relative path read the file in model_dir when there is one
// there, else the file relative to the working directory (as torch.load would); absolute paths
// are used as they are. Without configure(), paths are relative to the working directory.
//
// Inside a step closure queued by a training loop (a DataExecutor, or a range-for over a
// DataLoader), the save functions fetch the weights only at the loop's checkpoint steps: at any
// other step they refuse with an error that names the step, lists the checkpoint steps and says
// why ("It is only possible to fetch weights on predetermined checkpoint steps ..."). Outside
// step closures a save first waits for every queued step, at any step.
//
// Every problem is a cstorch::Error naming the file and, where there is one, the key: missing
// or unreadable file, partially written file ("partially written"), a newer format version,
// damaged content, unsupported dtypes or objects.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cstorch/core/dtype.h"
#include "cstorch/core/shape.h"
#include "cstorch/state.h"
#include "cstorch/tensor.h"

namespace cstorch {

enum class CheckpointFormat { HDF5, PyTorch, SafeTensors };
const char* checkpoint_format_name(CheckpointFormat f);  // "hdf5", "pytorch", "safetensors"

// The version of the HDF5 layout this build writes (and the newest it reads).
inline constexpr int64_t kCheckpointFormatVersion = 1;

// The format save() uses for `path`: .pt/.pth -> PyTorch, .safetensors -> safetensors,
// anything else -> HDF5.
CheckpointFormat checkpoint_format_for_path(const std::string& path);
// The format of an existing file, from its first bytes; an error names the file when it is
// none of the three (or is missing).
CheckpointFormat detect_checkpoint_format(const std::string& path);

// Saves `state` to `path` in the format of its extension (see above). Tensors are read on the
// host (pending steps are waited for). Errors: undefined tensors, strings that are not UTF-8
// (PyTorch and the JSON description need UTF-8), file system errors; each names the key or path.
void save(const State& state, const std::string& path);
// Loads a checkpoint of any of the three formats (detected from the content). Tensors are
// read one at a time straight into their buffers and placed on `map_location` (CPU by default;
// a device whose backend is not built is an error).
State load(const std::string& path, std::optional<Device> map_location = {});

// The formats explicitly.
void save_hdf5(const State& state, const std::string& path);
State load_hdf5(const std::string& path, std::optional<Device> map_location = {});
void save_pt(const State& state, const std::string& path);
State load_pt(const std::string& path, std::optional<Device> map_location = {});
// safetensors holds only tensors: values that are not tensors are kept in the header's
// __metadata__ (key "cstorch_structure"), which other safetensors readers ignore.
void save_safetensors(const State& state, const std::string& path);
State load_safetensors(const std::string& path, std::optional<Device> map_location = {});

// Removes the temporary files that saves into folder `dir` left behind when their process was
// killed mid-write (".NAME.tmp-PID-N", PID no longer running); files of live writers stay.
// Returns how many were removed.
int remove_stale_checkpoint_temp_files(const std::string& dir);

// Loads `in` (any format) and saves it to `out` (format by extension). Errors: an empty path,
// `in` and `out` the same file, and an `out` whose extension names no format (anything but .mdl,
// .h5, .hdf5, .pt, .pth, .safetensors), which save() alone would write as HDF5.
void convert_checkpoint(const std::string& in, const std::string& out);

// One tensor of a checkpoint: its flattened dotted key ("model.fc1.weight", list elements by
// index: "optimizer.param_groups.0.params"), dtype, shape and size in bytes. `shared_with` is
// the key of the first tensor this one shares its storage with (tied weights), or empty.
// `file_dtype` is empty, or the type the file stores when it is one cstorch reads as `dtype`:
// "float64" (PyTorch's torch.float64, safetensors' F64) is read as f32, each value rounded to
// the nearest float (as PyTorch's load_state_dict copies it into a float32 parameter); a finite
// value beyond f32's range is an error naming the tensor and the element. `nbytes` is the size
// read into memory (4 bytes an element for a float64 tensor).
struct CheckpointTensorInfo {
  std::string key;
  DType dtype = DType::f32;
  Shape shape;
  int64_t nbytes = 0;
  std::string shared_with;
  std::string file_dtype;
};

// Opens a checkpoint without reading its tensors: lists them and reads any one by key. Reading
// one tensor of a large file reads only that tensor's bytes. The file stays open until the
// reader is destroyed. Not thread safe.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(CheckpointReader&&) noexcept;
  CheckpointReader& operator=(CheckpointReader&&) noexcept;

  const std::string& path() const;
  CheckpointFormat format() const;
  // HDF5: the file's layout version; PyTorch: the zip archive's version record; safetensors: 0.
  int64_t format_version() const;
  // Every tensor, in the order of the nested structure (tied tensors appear under each key).
  // Flattened keys can collide ({"a.b": x} and {"a": {"b": y}}); read() then finds the first.
  const std::vector<CheckpointTensorInfo>& tensors() const;
  bool contains(const std::string& key) const;
  const CheckpointTensorInfo& info(const std::string& key) const;  // error lists close keys
  // Reads one tensor by flattened key.
  Tensor read(const std::string& key, std::optional<Device> map_location = {}) const;
  // The whole nested state (what load() returns).
  State read_all(std::optional<Device> map_location = {}) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// What `cszoo checkpoint info` prints: format, version, every tensor with dtype, shape and
// size, and totals.
std::string checkpoint_info(const std::string& path);

// Comparison of two checkpoints by flattened key: keys only in one, tensors whose dtype or
// shape differ, and per common tensor the maximum absolute difference (computed in double).
// Non-tensor values are compared by value.
struct CheckpointDiff {
  std::vector<std::string> only_in_a, only_in_b;
  struct Entry {
    std::string key;
    std::string note;         // "dtype f32 vs bf16", "shape [2] vs [3]", "value 1 vs 2" or empty
    double max_abs_diff = 0;  // tensors with equal dtype and shape
  };
  std::vector<Entry> common;
  bool identical() const;
};
CheckpointDiff checkpoint_diff(const std::string& a, const std::string& b);
std::string format_checkpoint_diff(const CheckpointDiff& d);

// What `cszoo checkpoint verify` reports: every tensor of a checkpoint read and checked against
// the checksums the file stores (HDF5: Fletcher-32 per chunk, or the object header's checksum
// for a 0-d tensor; PyTorch: the zip CRC-32 of each storage; safetensors: the CRC-32 cstorch
// keeps in __metadata__). A tensor that fails (checksum mismatch, unreadable data) is listed
// with the reason; the others are intact. Damage outside the tensors' data that keeps the file
// from being opened (its structure, the zip directory, the safetensors header) is an error.
struct CheckpointVerification {
  int64_t tensors = 0;    // tensors read (each key of tied tensors counts)
  int64_t unchecked = 0;  // of those, read without a stored checksum to check (older or
                          // foreign files): readable, but damage to their values goes unseen
  struct Damage {
    std::string key;
    std::string reason;
  };
  std::vector<Damage> damaged;
  bool intact() const { return damaged.empty(); }
};
CheckpointVerification verify_checkpoint(const std::string& path);
// "damaged: KEY: REASON" lines, then "N tensors verified, all intact" or "N tensors verified,
// M damaged" (and how many had no checksum).
std::string format_checkpoint_verification(const CheckpointVerification& v);

}  // namespace cstorch
