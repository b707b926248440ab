// The native checkpoint format: HDF5 through the libhdf5 C API. Layout (docs/checkpoint-format.md):
// one dataset per stored tensor named by its flattened key, a "dtype" attribute on each, and
// root attributes cstorch_format_version, cstorch_structure (JSON) and __SUCCESS__ (written
// last). Files use the HDF5 1.10 object format, whose metadata carries checksums, so damaged
// metadata is reported by the library instead of being parsed. Tensor data is checksummed too:
// each dataset is chunked (one chunk up to 64 MiB, see max_chunk_bytes) with HDF5's Fletcher-32
// filter, a 0-d tensor is a compact dataset (its value inside the checksummed object header). The
// writer computes the checksum itself and writes each chunk whole (H5Dwrite_chunk); the reader
// reads each chunk straight into the tensor and verifies the checksum itself, as HDF5 would (h5py
// and other HDF5 programs read the files through the filter as usual).
#include <fcntl.h>
#include <hdf5.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "checkpoint/common.h"
#include "data/h5util.h"

namespace cstorch {
namespace ckpt {
namespace {

// HDF5's exit handler closes the files still open, and crashes on one whose close failed: a
// save abandoned under a file-size limit (RLIMIT_FSIZE, which holds for the memory file that
// WriteFile points the descriptor at too) fails its close. Every file of the project's is
// closed where it is used, so the handler has nothing else to do; it is not installed. (Runs
// as the library loads, before any HDF5 call: H5dont_atexit works only then.)
[[maybe_unused]] const bool g_no_hdf5_exit_handler = [] {
  H5dont_atexit();
  return true;
}();

static_assert(std::endian::native == std::endian::little,
              "checkpoint files are little-endian; a big-endian host would need byte swaps");

// Every HDF5 failure becomes a cstorch::Error: the library's own printing to stderr is off and
// its error stack is folded into our message.
void h5_init() {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

std::string h5_error() {
  std::vector<std::string> descs;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* d) -> herr_t {
        if (e->desc && *e->desc) {
          std::string desc = e->desc;  // (a write error's holds a ctime() newline)
          desc.erase(std::remove(desc.begin(), desc.end(), '\n'), desc.end());
          static_cast<std::vector<std::string>*>(d)->push_back(desc);
        }
        return 0;
      },
      &descs);
  H5Eclear2(H5E_DEFAULT);
  if (descs.empty()) return "HDF5 error";
  // The innermost entries say what actually went wrong.
  size_t from = descs.size() > 2 ? descs.size() - 2 : 0;
  std::string s;
  for (size_t i = from; i < descs.size(); ++i) s += (s.empty() ? "" : ": ") + descs[i];
  return s;
}

// An HDF5 identifier closed on scope exit.
class Hid {
 public:
  Hid() = default;
  Hid(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  Hid& operator=(Hid&& o) noexcept {
    std::swap(id_, o.id_);
    std::swap(close_, o.close_);
    return *this;
  }
  ~Hid() { reset(); }
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = -1;
  }
  herr_t close() {
    herr_t r = id_ >= 0 && close_ ? close_(id_) : 0;
    id_ = -1;
    return r;
  }
  bool ok() const { return id_ >= 0; }
  operator hid_t() const { return id_; }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// IEEE binary16, little-endian, as h5py defines it (HDF5 1.10 has no predefined half type).
hid_t half_type() {
  static hid_t t = [] {
    hid_t h = H5Tcopy(H5T_IEEE_F32LE);
    H5Tset_fields(h, 15, 10, 5, 0, 10);
    H5Tset_size(h, 2);
    H5Tset_ebias(h, 15);
    H5Tlock(h);
    return h;
  }();
  return t;
}

// The file (and, on this little-endian host, memory) type of each dtype. bf16 has no HDF5 type:
// its bits are stored as uint16 and the "dtype" attribute says "bf16".
hid_t storage_type(DType t) {
  switch (t) {
    case DType::f32:
      return H5T_IEEE_F32LE;
    case DType::f16:
      return half_type();
    case DType::bf16:
      return H5T_STD_U16LE;
    case DType::i32:
      return H5T_STD_I32LE;
    case DType::i64:
      return H5T_STD_I64LE;
    case DType::boolean:
      return H5T_STD_U8LE;
  }
  return H5T_STD_U8LE;
}

// ---------------------------------------------------------------------------------------------
// Fletcher-32 exactly as HDF5's filter computes it (H5_checksum_fletcher32): the data as
// big-endian 16-bit words (an odd last byte is a word with a zero low byte), sums folded with
// end-around carry. Both sums are kept modulo 65535 instead; the folded form is the same
// residue, except that a sum of non-zero words that is a multiple of 65535 folds to 0xFFFF
// (folding never makes a positive number 0). Words are summed in blocks of 8 lanes (vectorised
// by the compiler): about 4x HDF5's own loop; large buffers in parts on several threads.
class Fletcher32 {
 public:
  void update(const void* data, size_t n) {
    auto* p = static_cast<const uint8_t*>(data);
    if (n == 0) return;
    if (has_odd_) {
      const uint8_t w[2] = {odd_, p[0]};
      words(w, 1);
      ++p;
      --n;
      has_odd_ = false;
    }
    const size_t nw = n / 2, parts = checksum_parts(n);
    if (parts <= 1) {
      words(p, nw);
    } else {
      // Parts summed on their own threads, then joined: appending k words to sums (s1, s2)
      // adds k * s1 to s2.
      const size_t len = (nw / parts + 31) & ~size_t{31};  // words per part
      std::vector<Fletcher32> part(parts);
      run_parts(parts, [&](size_t i) {
        size_t b = std::min(nw, i * len), e = std::min(nw, b + len);
        part[i].words(p + 2 * b, e - b);
      });
      for (size_t i = 0; i < parts; ++i) {
        size_t b = std::min(nw, i * len), e = std::min(nw, b + len);
        s2_ = (s2_ + (e - b) % 65535 * s1_ + part[i].s2_) % 65535;
        s1_ = (s1_ + part[i].s1_) % 65535;
        nonzero_ = nonzero_ || part[i].nonzero_;
      }
    }
    if (n % 2) {
      odd_ = p[n - 1];
      has_odd_ = true;
    }
  }
  uint32_t value() const {
    Fletcher32 f = *this;
    if (f.has_odd_) {
      const uint8_t w[2] = {f.odd_, 0};
      f.words(w, 1);
    }
    auto fold = [&](uint64_t s) {
      return f.nonzero_ ? static_cast<uint32_t>((s + 65534) % 65535 + 1) : 0u;
    };
    return fold(f.s2_) << 16 | fold(f.s1_);
  }

 private:
  void words(const uint8_t* p, size_t n) {
    while (n > 0) {
      // A block of k words: s2 gains k * s1 plus each word weighted by its distance from the
      // block's end; 8 lanes of running sums (r) and sums of running sums (q). 256 rows keep
      // q below 2^32.
      size_t rows = std::min<size_t>(n / 8, 256);
      uint64_t a = 0, b = 0, k = 0;
      if (rows > 0) {
        uint32_t r[8] = {}, q[8] = {};
        for (size_t row = 0; row < rows; ++row) {
          uint16_t w[8];
          std::memcpy(w, p + 16 * row, 16);
          for (int l = 0; l < 8; ++l) {
            r[l] += __builtin_bswap16(w[l]);  // big-endian words
            q[l] += r[l];
          }
        }
        for (int l = 0; l < 8; ++l) {
          a += r[l];
          b += 8 * uint64_t{q[l]} - uint64_t(l) * r[l];
        }
        k = 8 * rows;
      } else {
        k = n;  // fewer than 8 words
        for (size_t i = 0; i < k; ++i) {
          uint64_t w = static_cast<uint64_t>(p[2 * i]) << 8 | p[2 * i + 1];
          a += w;
          b += (k - i) * w;
        }
      }
      s2_ = (s2_ + k * s1_ + b) % 65535;
      s1_ = (s1_ + a) % 65535;
      nonzero_ = nonzero_ || a != 0;
      p += 2 * k;
      n -= k;
    }
  }
  uint64_t s1_ = 0, s2_ = 0;
  bool nonzero_ = false;
  bool has_odd_ = false;
  uint8_t odd_ = 0;
};

// HDF5 also accepts the checksum with the bytes of each half swapped (what versions before
// 1.6.3 wrote on little-endian hosts).
bool fletcher_matches(uint32_t stored, uint32_t computed) {
  uint32_t swapped = (computed & 0x00FF00FFu) << 8 | (computed & 0xFF00FF00u) >> 8;
  return stored == computed || stored == swapped;
}

// Chunks of at most about this many bytes (HDF5 1.10 allows up to 4 GiB): tensors up to it are
// one chunk (most are); larger ones are split along their leading dimensions into near-equal
// chunks, each a row-major contiguous range of the tensor. The save holds one chunk in memory.
// Test hook: CSTORCH_TEST_HDF5_CHUNK_BYTES sets another limit, to make small tensors several
// chunks.
uint64_t max_chunk_bytes() {
  static constexpr uint64_t kMaxChunkBytes = uint64_t{64} << 20;
  const char* h = std::getenv("CSTORCH_TEST_HDF5_CHUNK_BYTES");
  return h && std::atoll(h) > 0 ? static_cast<uint64_t>(std::atoll(h)) : kMaxChunkBytes;
}

// The chunking of a dataset with dimensions `dims` (rank >= 1, no zero) and `item`-byte
// elements: chunk = [1, ..., 1, rows, dims[axis+1], ...]. Chunk i along `axis` holds rows
// [i * rows, min((i + 1) * rows, dims[axis])); the last one is padded to full size.
struct ChunkGrid {
  std::vector<hsize_t> dims, chunk;
  size_t axis = 0;
  uint64_t inner = 0;      // bytes of one row along `axis` (the trailing dimensions)
  uint64_t per_group = 0;  // chunks along `axis`
  uint64_t groups = 0;     // product of dims[0 .. axis)

  uint64_t count() const { return groups * per_group; }
  uint64_t chunk_bytes() const { return chunk[axis] * inner; }
  // Chunk `i` (0 .. count()): its start coordinates, and its valid bytes' range in the
  // row-major tensor.
  void locate(uint64_t i, std::vector<hsize_t>& coord, uint64_t& begin, uint64_t& valid) const {
    uint64_t g = i / per_group, c = i % per_group;
    coord.assign(dims.size(), 0);
    uint64_t rest = g;
    for (size_t j = axis; j-- > 0;) {
      coord[j] = rest % dims[j];
      rest /= dims[j];
    }
    coord[axis] = c * chunk[axis];
    uint64_t rows = std::min<uint64_t>(chunk[axis], dims[axis] - coord[axis]);
    begin = (g * dims[axis] + coord[axis]) * inner;
    valid = rows * inner;
  }
};

ChunkGrid plan_chunks(const std::vector<hsize_t>& dims, size_t item) {
  ChunkGrid g;
  g.dims = dims;
  size_t r = dims.size();
  // The first axis whose trailing row fits in a chunk.
  std::vector<uint64_t> inner(r);
  uint64_t acc = item;
  for (size_t j = r; j-- > 0;) {
    inner[j] = acc;
    acc *= dims[j];
  }
  const uint64_t limit = max_chunk_bytes();
  while (g.axis + 1 < r && inner[g.axis] > limit) ++g.axis;
  g.inner = inner[g.axis];
  uint64_t d = dims[g.axis];
  uint64_t parts = std::max<uint64_t>(1, (d * g.inner + limit - 1) / limit);
  uint64_t rows = (d + parts - 1) / parts;
  g.per_group = (d + rows - 1) / rows;
  g.groups = 1;
  for (size_t j = 0; j < g.axis; ++j) g.groups *= dims[j];
  g.chunk.assign(r, 1);
  g.chunk[g.axis] = rows;
  for (size_t j = g.axis + 1; j < r; ++j) g.chunk[j] = dims[j];
  return g;
}

// The same grid for an existing dataset with chunk dimensions `chunk`, when it has that form
// (h5py and others choose other chunk shapes: those are read through HDF5).
std::optional<ChunkGrid> grid_of(const std::vector<hsize_t>& dims,
                                 const std::vector<hsize_t>& chunk, size_t item) {
  size_t r = dims.size();
  if (r == 0 || chunk.size() != r) return std::nullopt;
  for (auto d : dims)
    if (d == 0) return std::nullopt;
  ChunkGrid g;
  g.dims = dims;
  g.chunk = chunk;
  while (g.axis + 1 < r && chunk[g.axis] == 1) ++g.axis;
  if (chunk[g.axis] == 0 || chunk[g.axis] > dims[g.axis]) return std::nullopt;
  g.inner = item;
  for (size_t j = g.axis + 1; j < r; ++j) {
    if (chunk[j] != dims[j]) return std::nullopt;
    g.inner *= dims[j];
  }
  g.per_group = (dims[g.axis] + chunk[g.axis] - 1) / chunk[g.axis];
  g.groups = 1;
  for (size_t j = 0; j < g.axis; ++j) g.groups *= dims[j];
  return g;
}

std::string escape_name(const std::string& key) {
  // HDF5 link names cannot contain '/' and "." names the group itself.
  std::string s;
  for (char c : key) {
    if (c == '%')
      s += "%25";
    else if (c == '/')
      s += "%2F";
    else
      s += c;
  }
  if (s.empty() || s == ".") s = "%" + s;
  return s;
}

void write_int_attr(hid_t obj, const char* name, int64_t v, const std::string& path) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid a(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!a.ok() || H5Awrite(a, H5T_NATIVE_INT64, &v) < 0)
    fail("save {}: cannot write attribute {}: {}", path, name, h5_error());
}

void write_string_attr(hid_t obj, const char* name, const std::string& v, const std::string& path,
                       const std::string& key) {
  // Fixed-length (not variable-length) strings: their bytes sit in checksummed metadata.
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, std::max<size_t>(v.size(), 1));
  H5Tset_strpad(type, H5T_STR_NULLPAD);
  H5Tset_cset(type, H5T_CSET_UTF8);
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid a(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  std::string buf = v.empty() ? std::string(1, '\0') : v;
  if (!a.ok() || H5Awrite(a, type, buf.data()) < 0)
    fail("save {}: cannot write attribute {} of '{}': {}", path, name, show_key(key), h5_error());
}

// Reads a scalar string attribute (fixed or variable length). `what` names it in errors.
std::string read_string_attr(hid_t obj, const char* name, const std::string& path,
                             const std::string& what) {
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!a.ok()) fail("checkpoint {}: cannot read {}: {}", path, what, h5_error());
  Hid type(H5Aget_type(a), H5Tclose);
  Hid space(H5Aget_space(a), H5Sclose);
  if (!type.ok() || !space.ok() || H5Tget_class(type) != H5T_STRING ||
      H5Sget_simple_extent_npoints(space) != 1)
    fail("checkpoint {}: {} is not a single string", path, what);
  htri_t var = H5Tis_variable_str(type);
  if (var < 0) fail("checkpoint {}: {}: {}", path, what, h5_error());
  if (var > 0) {
    Hid mt(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mt, H5T_VARIABLE);
    H5Tset_cset(mt, H5Tget_cset(type));
    char* p = nullptr;
    if (H5Aread(a, mt, &p) < 0) fail("checkpoint {}: cannot read {}: {}", path, what, h5_error());
    std::string s = p ? p : "";
    if (p) H5free_memory(p);
    return s;
  }
  size_t n = H5Tget_size(type);
  if (n == 0 || n > (size_t{1} << 30)) fail("checkpoint {}: {} has an impossible size", path, what);
  std::string s(n, '\0');
  Hid mt(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mt, n);
  H5Tset_strpad(mt, H5T_STR_NULLPAD);
  H5Tset_cset(mt, H5Tget_cset(type));
  if (H5Aread(a, mt, s.data()) < 0)
    fail("checkpoint {}: cannot read {}: {}", path, what, h5_error());
  s.resize(std::strlen(s.c_str()));  // up to the first NUL (padding)
  return s;
}

std::optional<int64_t> read_int_attr(hid_t obj, const char* name, const std::string& path) {
  htri_t ex = H5Aexists(obj, name);
  if (ex < 0) fail("checkpoint {}: cannot read attribute {}: {}", path, name, h5_error());
  if (ex == 0) return std::nullopt;
  Hid a(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  Hid type(a.ok() ? H5Aget_type(a) : -1, H5Tclose);
  Hid space(a.ok() ? H5Aget_space(a) : -1, H5Sclose);
  if (!type.ok() || !space.ok() || H5Tget_class(type) != H5T_INTEGER ||
      H5Sget_simple_extent_npoints(space) != 1)
    fail("checkpoint {}: attribute {} is not a single integer", path, name);
  int64_t v = 0;
  if (H5Aread(a, H5T_NATIVE_INT64, &v) < 0)
    fail("checkpoint {}: cannot read attribute {}: {}", path, name, h5_error());
  return v;
}

// Writes tensor `t` as dataset `name`: chunked with the Fletcher-32 filter (the checksum
// computed here, each chunk written whole through `scratch`), compact for a 0-d tensor (its
// value sits in the checksummed object header), contiguous when it has no elements.
void write_dataset(hid_t file, const std::string& name, const Tensor& t, const std::string& path,
                   const std::string& key, std::vector<char>& scratch) {
  const auto held = tensor_bytes(t, path, key);
  const char* data = static_cast<const char*>(held.data());
  const Shape& s = t.shape();
  hid_t type = storage_type(t.dtype());
  size_t item = itemsize(t.dtype());
  std::vector<hsize_t> dims(s.begin(), s.end());
  Hid space;
  if (s.empty())
    space = Hid(H5Screate(H5S_SCALAR), H5Sclose);
  else
    space = Hid(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
  Hid dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER);  // every byte is written below
  std::optional<ChunkGrid> grid;
  if (s.empty()) {
    H5Pset_layout(dcpl, H5D_COMPACT);
  } else if (t.numel() == 0) {
    H5Pset_layout(dcpl, H5D_CONTIGUOUS);
  } else {
    grid = plan_chunks(dims, item);
    if (H5Pset_chunk(dcpl, static_cast<int>(dims.size()), grid->chunk.data()) < 0 ||
        H5Pset_fletcher32(dcpl) < 0)
      fail("save {}: cannot set up the chunks of '{}': {}", path, show_key(key), h5_error());
  }
  Hid ds(H5Dcreate2(file, name.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT), H5Dclose);
  if (!ds.ok())
    fail("save {}: cannot create the dataset of '{}': {}", path, show_key(key), h5_error());
  if (grid) {
    const uint64_t cb = grid->chunk_bytes();
    if (scratch.size() < cb + 4) scratch.resize(cb + 4);
    std::vector<hsize_t> coord;
    for (uint64_t i = 0; i < grid->count(); ++i) {
      uint64_t begin = 0, valid = 0;
      grid->locate(i, coord, begin, valid);
      std::memcpy(scratch.data(), data + begin, valid);
      std::memset(scratch.data() + valid, 0, cb - valid);  // the last chunk's padding
      Fletcher32 f;
      f.update(scratch.data(), cb);
      uint32_t sum = f.value();  // stored little-endian, as the filter does
      std::memcpy(scratch.data() + cb, &sum, 4);
      if (H5Dwrite_chunk(ds, H5P_DEFAULT, 0, coord.data(), cb + 4, scratch.data()) < 0)
        fail("save {}: cannot write tensor '{}': {}", path, show_key(key), h5_error());
    }
  } else if (t.numel() > 0 && H5Dwrite(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
    fail("save {}: cannot write tensor '{}': {}", path, show_key(key), h5_error());
  }
  write_string_attr(ds, "dtype", dtype_name(t.dtype()), path, key);
  // The flattened key, so a reader can find one tensor without the structure description.
  write_string_attr(ds, "cstorch_key", key, path, key);
}

// The temporary file being written, closed on every path. HDF5 1.10 cannot close a file
// whose flush failed: the metadata cache is left in a state that makes the close, or the
// library's exit handler, crash. So
// - before each flush (and the close, which flushes) the file's space up to its end of
//   allocation (everything HDF5 has placed, metadata included) is reserved, so a full disk is
//   found before the flush writes anything;
// - after an error the file's descriptor is pointed at an anonymous memory file before the
//   close: the close then writes there and succeeds (the temporary file is removed anyway).
class WriteFile {
 public:
  WriteFile(hid_t id, std::string path) : id_(id), path_(std::move(path)) {}
  WriteFile(const WriteFile&) = delete;
  WriteFile& operator=(const WriteFile&) = delete;
  ~WriteFile() {
    if (id_ >= 0) abandon();
  }
  bool ok() const { return id_ >= 0; }
  operator hid_t() const { return id_; }

  // Makes sure the disk holds the space the next flush writes to; an error otherwise.
  void reserve(const char* before) {
    int* fd = descriptor();
    hsize_t size = 0;
    if (!fd || H5Fget_filesize(id_, &size) < 0) {
      H5Eclear2(H5E_DEFAULT);
      return;  // nothing to check against: the flush itself reports a problem
    }
    int err = 0;
    if (test_hook_no_space(before)) {
      err = ENOSPC;
    } else if (::fallocate(*fd, 0, 0, static_cast<off_t>(size)) != 0) {
      err = errno;
      if (err != ENOSPC && err != EDQUOT && err != EFBIG) {
        // The file system cannot reserve (EOPNOTSUPP and the like): compare with its free
        // space instead.
        struct stat st {};
        struct statvfs vfs {};
        err = 0;
        if (::fstat(*fd, &st) == 0 && ::fstatvfs(*fd, &vfs) == 0) {
          uint64_t have = static_cast<uint64_t>(st.st_blocks) * 512;
          uint64_t need = size > have ? size - have : 0;
          if (static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < need) err = ENOSPC;
        }
      }
    }
    if (err != 0)
      fail("save {}: {} failed: cannot reserve {} bytes for the file: {}", path_, before,
           static_cast<uint64_t>(size), std::strerror(err));
  }

  herr_t flush() {
    herr_t r = H5Fflush(id_, H5F_SCOPE_GLOBAL);
    if (r < 0) flush_failed_ = true;
    return r;
  }
  herr_t close() {
    herr_t r = H5Fclose(id_);
    id_ = -1;  // closed, or (failed) in a state no further call may touch
    return r;
  }

  // Test hook: CSTORCH_TEST_SAVE_NO_SPACE=data makes the disk full (the file's descriptor
  // writes to /dev/full) half way through the tensors; =flush makes the reservation before
  // the flush find no space.
  void test_hook_disk_full() {
    const char* h = std::getenv("CSTORCH_TEST_SAVE_NO_SPACE");
    int* fd = h && std::string(h) == "data" ? descriptor() : nullptr;
    if (!fd) return;
    int full = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
    if (full >= 0) {
      ::dup2(full, *fd);
      ::close(full);
    }
  }

 private:
  static bool test_hook_no_space(const char* before) {
    const char* h = std::getenv("CSTORCH_TEST_SAVE_NO_SPACE");
    return h && std::string(h) == "flush" && std::string(before) == "flush";
  }
  int* descriptor() {
    void* handle = nullptr;
    if (H5Fget_vfd_handle(id_, H5P_DEFAULT, &handle) < 0 || !handle) {
      H5Eclear2(H5E_DEFAULT);
      return nullptr;
    }
    return static_cast<int*>(handle);  // the default (sec2) driver's descriptor
  }
  void abandon() {
    if (int* fd = descriptor()) {
      int sink = ::memfd_create("cstorch-abandoned-save", MFD_CLOEXEC);
      if (sink >= 0) {
        ::dup2(sink, *fd);  // also releases the temporary file's disk space
        ::close(sink);
      }
    }
    // After a failed flush (an I/O error despite the reservation) closing would crash: the
    // handle is left open, its descriptor on the memory file.
    if (!flush_failed_) H5Fclose(id_);
    H5Eclear2(H5E_DEFAULT);
    id_ = -1;
  }
  hid_t id_;
  std::string path_;
  bool flush_failed_ = false;
};

int64_t count_tensors(const State& s) {
  if (s.is_tensor()) return 1;
  if (!s.is_list() && !s.is_map()) return 0;
  int64_t n = 0;
  for (auto& c : s.items()) n += count_tensors(c);
  return n;
}

// ---------------------------------------------------------------------------------------------

class Hdf5Reader : public FormatReader {
 public:
  Hdf5Reader(const std::string& p, bool lazy) : raw_(p) {
    path = p;
    format = CheckpointFormat::HDF5;
    h5_init();
    Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    file_ = Hid(H5Fopen(p.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose);
    if (!file_.ok()) {
      std::string why = h5_error();
      // HDF5 1.10 files carry a "file is open for writing" flag in the superblock, cleared on
      // close: a writer that was killed leaves it set.
      if (why.find("already open for write") != std::string::npos)
        fail(
            "checkpoint {} is partially written: the process writing it did not close it (it "
            "crashed, was killed, or is still running); use an earlier checkpoint",
            p);
      fail("cannot open checkpoint {}: not a readable HDF5 file ({})", p, why);
    }
    auto v = read_int_attr(file_, "cstorch_format_version", p);
    CS_CHECK(v.has_value(),
             "checkpoint {}: not a cstorch checkpoint (no cstorch_format_version attribute)", p);
    CS_CHECK(*v >= 1, "checkpoint {}: invalid format version {}", p, *v);
    CS_CHECK(*v <= kCheckpointFormatVersion,
             "checkpoint {} has format version {}, newer than this build of cstorch reads (up to "
             "{}): update cstorch to load it",
             p, *v, kCheckpointFormatVersion);
    version = *v;
    auto ok = read_int_attr(file_, "__SUCCESS__", p);
    CS_CHECK(ok.has_value() && *ok == 1,
             "checkpoint {} is partially written (no __SUCCESS__ marker): the save that wrote "
             "it did not finish; use an earlier checkpoint",
             p);
    if (!lazy) load_structure();
  }

  void load_structure() override {
    if (loaded_) return;
    loaded_ = true;
    const std::string& p = path;
    Json j = parse_json(read_string_attr(file_, "cstorch_structure", p, "the structure attribute"),
                        p, "structure attribute (cstorch_structure)");
    std::map<std::string, int64_t> storage_of;
    root = decode_structure(j, p, [&](const std::string& key, const Json& t) -> int64_t {
      auto bad = [&](const char* what) {
        fail("checkpoint {}: damaged structure description of tensor '{}': {}", p, show_key(key),
             what);
      };
      auto ds = t.find("dataset");
      auto dt = t.find("dtype");
      auto sh = t.find("shape");
      if (ds == t.end() || !ds->is_string() || ds->get_ref<const std::string&>().empty())
        bad("\"dataset\" is not a dataset name");
      if (dt == t.end() || !dt->is_string()) bad("\"dtype\" is not a string");
      auto dtype = dtype_from_name(dt->get<std::string>());
      if (!dtype) bad("unknown dtype (expected f32, bf16, f16, i32, i64 or bool)");
      if (sh == t.end() || !sh->is_array() || sh->size() > 64) bad("\"shape\" is not a shape");
      Shape shape;
      for (auto& d : *sh) {
        if (!d.is_number_integer()) bad("\"shape\" holds a non-integer");
        if (d.is_number_unsigned() && d.get<uint64_t>() > (uint64_t{1} << 62))
          bad("\"shape\" holds an impossible size");
        shape.push_back(d.get<int64_t>());
      }
      int64_t n = checked_numel(shape, p, key);
      const std::string& name = ds->get_ref<const std::string&>();
      auto [it, fresh] = storage_of.emplace(name, static_cast<int64_t>(datasets_.size()));
      if (fresh) datasets_.push_back(name);
      Entry e;
      e.info.key = key;
      e.info.dtype = *dtype;
      e.info.shape = shape;
      e.info.nbytes = n * static_cast<int64_t>(itemsize(*dtype));
      e.storage = it->second;
      // One dataset under two keys must be one tensor: dtype and shape agree.
      for (auto& o : entries)
        if (o.storage == e.storage && (o.info.dtype != e.info.dtype || o.info.shape != shape))
          fail(
              "checkpoint {}: tensors '{}' and '{}' share dataset '{}' but differ in dtype or "
              "shape",
              p, show_key(o.info.key), show_key(key), name);
      entries.push_back(std::move(e));
      return static_cast<int64_t>(entries.size() - 1);
    });
    link_shared(entries);
  }

  // The dataset named after `key` when it says it holds `key` (attribute cstorch_key, written
  // since this build; older files, tied keys and renamed collisions use the structure).
  std::optional<Tensor> read_direct(const std::string& key) override {
    const std::string name = escape_name(key);
    if (H5Lexists(file_, name.c_str(), H5P_DEFAULT) <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return std::nullopt;
    }
    Hid ds(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.ok() || H5Aexists(ds, "cstorch_key") <= 0 || H5Aexists(ds, "dtype") <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return std::nullopt;
    }
    if (read_string_attr(ds, "cstorch_key", path, "dataset attribute cstorch_key") != key)
      return std::nullopt;
    auto dtype = dtype_from_name(read_string_attr(ds, "dtype", path, "dataset attribute dtype"));
    if (!dtype) return std::nullopt;
    Hid space(H5Dget_space(ds), H5Sclose);
    if (!space.ok()) return std::nullopt;
    Shape shape;
    H5S_class_t sc = H5Sget_simple_extent_type(space);
    if (sc == H5S_SIMPLE) {
      int rank = H5Sget_simple_extent_ndims(space);
      if (rank < 0 || rank > 64) return std::nullopt;
      std::vector<hsize_t> dims(static_cast<size_t>(rank));
      H5Sget_simple_extent_dims(space, dims.data(), nullptr);
      for (auto d : dims) shape.push_back(static_cast<int64_t>(d));
    } else if (sc != H5S_SCALAR) {
      return std::nullopt;
    }
    Entry e;
    e.info.key = key;
    e.info.dtype = *dtype;
    e.info.shape = shape;
    e.info.nbytes = checked_numel(shape, path, key) * static_cast<int64_t>(itemsize(*dtype));
    return read_named(name, e);
  }

  Tensor read(const Entry& e) override {
    return read_named(datasets_[static_cast<size_t>(e.storage)], e);
  }

  // Reads dataset `name` as entry `e`, checking shape and type against it.
  Tensor read_named(const std::string& name, const Entry& e) {
    const std::string& key = e.info.key;
    auto where = [&] { return fmt::format("tensor '{}' (dataset '{}')", show_key(key), name); };
    Hid ds(H5Dopen2(file_, name.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.ok()) fail("checkpoint {}: {} is missing or damaged: {}", path, where(), h5_error());
    // Shape.
    Hid space(H5Dget_space(ds), H5Sclose);
    if (!space.ok()) fail("checkpoint {}: {}: {}", path, where(), h5_error());
    H5S_class_t sc = H5Sget_simple_extent_type(space);
    Shape shape;
    if (sc == H5S_SIMPLE) {
      int rank = H5Sget_simple_extent_ndims(space);
      if (rank < 0 || rank > 64) fail("checkpoint {}: {} has a damaged shape", path, where());
      std::vector<hsize_t> dims(static_cast<size_t>(rank));
      H5Sget_simple_extent_dims(space, dims.data(), nullptr);
      for (auto d : dims) shape.push_back(static_cast<int64_t>(d));
    } else if (sc != H5S_SCALAR) {
      fail("checkpoint {}: {} has no data space", path, where());
    }
    CS_CHECK(shape == e.info.shape,
             "checkpoint {}: {} has shape {} but the structure description says {}", path, where(),
             shape_str(shape), shape_str(e.info.shape));
    // Type: the stored type must hold the dtype's values.
    Hid type(H5Dget_type(ds), H5Tclose);
    if (!type.ok()) fail("checkpoint {}: {}: {}", path, where(), h5_error());
    H5T_class_t tc = H5Tget_class(type);
    size_t ts = H5Tget_size(type);
    DType dt = e.info.dtype;
    bool fits =
        ts == itemsize(dt) && ((dt == DType::f32 || dt == DType::f16) ? tc == H5T_FLOAT
                               : dt == DType::boolean ? (tc == H5T_INTEGER || tc == H5T_ENUM)
                                                      : tc == H5T_INTEGER);
    if (!fits) {
      // Named as NumPy would name it (h5py writes NumPy's float64 by default).
      const std::string kind = tc == H5T_FLOAT     ? fmt::format("float{}", ts * 8)
                               : tc == H5T_INTEGER ? fmt::format("an integer of {} bits", ts * 8)
                                                   : fmt::format("HDF5 type class {} of {} bytes",
                                                                 static_cast<int>(tc), ts);
      fail(
          "checkpoint {}: {} is stored as {}, which does not hold {} (convert the array to the "
          "dtype its structure description names before writing it)",
          path, where(), kind, dtype_name(dt));
    }
    htri_t has_dtype = H5Aexists(ds, "dtype");
    if (has_dtype > 0) {
      std::string a = read_string_attr(ds, "dtype", path, where() + " attribute dtype");
      CS_CHECK(a == dtype_name(dt),
               "checkpoint {}: {} is marked dtype \"{}\" but the structure description says {}",
               path, where(), a, dtype_name(dt));
    } else if (has_dtype < 0) {
      fail("checkpoint {}: {}: {}", path, where(), h5_error());
    }
    size_t nbytes = static_cast<size_t>(e.info.nbytes);
    Hid dcpl(H5Dget_create_plist(ds), H5Pclose);
    if (!dcpl.ok()) fail("checkpoint {}: {}: {}", path, where(), h5_error());
    H5D_layout_t layout = H5Pget_layout(dcpl);
    int nfilters = H5Pget_nfilters(dcpl);
    bool fletcher = false;  // the filter pipeline verifies a Fletcher-32 checksum
    for (int i = 0; i < nfilters; ++i) {
      unsigned flags = 0;
      size_t nelem = 0;
      if (H5Pget_filter2(dcpl, static_cast<unsigned>(i), &flags, &nelem, nullptr, 0, nullptr,
                         nullptr) == H5Z_FILTER_FLETCHER32)
        fletcher = true;
    }
    Hid mem_type;
    hid_t mt = storage_type(dt);
    if (tc == H5T_ENUM) {  // h5py writes numpy bools as an enum; read its raw bytes
      mem_type = Hid(H5Tcopy(type), H5Tclose);
      mt = mem_type;
    }
    bool same_type = H5Tequal(type, mt) > 0;
    // The ways to read, fastest first:
    // - contiguous, unfiltered (files written before checksums, h5py's default): one positional
    //   read; nothing to verify;
    // - chunked with Fletcher-32 alone, chunks as cstorch makes them: each chunk read straight
    //   into the tensor and its checksum verified here;
    // - anything else (compact, compressed, other chunk shapes): H5Dread, which verifies a
    //   Fletcher-32 checksum in the pipeline (and a compact dataset's object header checksum).
    haddr_t offset = HADDR_UNDEF;
    if (layout == H5D_CONTIGUOUS && nfilters == 0) {
      // (Its stored size against the shape: check_storage below.)
      offset = H5Dget_offset(ds);
      H5Eclear2(H5E_DEFAULT);  // H5Dget_offset of unallocated storage pushes an error
    }
    bool raw = offset != HADDR_UNDEF && same_type;
    std::optional<ChunkGrid> grid;
    if (layout == H5D_CHUNKED && nfilters == 1 && fletcher && same_type && !shape.empty()) {
      std::vector<hsize_t> chunk(shape.size());
      if (H5Pget_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()) ==
          static_cast<int>(chunk.size()))
        grid = grid_of(std::vector<hsize_t>(shape.begin(), shape.end()), chunk, itemsize(dt));
      H5Eclear2(H5E_DEFAULT);
    }
    // What the file stores must hold the shape before the tensor is allocated for it: a
    // 465 KB file whose chunks were never written claimed a [3000000, 784] tensor, allocated
    // (9.4 GB) before anything else was checked.
    data::h5::check_storage(ds, dcpl, path, fmt::format("checkpoint {}: {}", path, where()),
                            std::vector<hsize_t>(shape.begin(), shape.end()), H5Tget_size(type));
    verified = fletcher;
    if (layout == H5D_COMPACT) {
      // The value is in the object header, checksummed in the 1.10 format (version 2 headers).
      H5O_info_t oi{};
      verified = H5Oget_info2(ds, &oi, H5O_INFO_HDR) >= 0 && oi.hdr.version >= 2;
      H5Eclear2(H5E_DEFAULT);
    }
    return make_host_tensor(shape, dt, [&](void* dst) {
      if (raw) {
        // The bytes are exactly ours: one positional read, bounds-checked against the file.
        raw_.read(offset, dst, nbytes, "tensor data");
      } else if (!(grid && read_chunks(ds, *grid, static_cast<char*>(dst), where))) {
        if (H5Dread(ds, mt, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0) {
          std::string why = h5_error();
          if (why.find("Fletcher32") != std::string::npos ||
              why.find("checksum") != std::string::npos)
            fail("checkpoint {}: {} is damaged: its data fails the checksum check ({})", path,
                 where(), why);
          fail("checkpoint {}: cannot read {}: {}", path, where(), why);
        }
      }
      if (dt == DType::boolean) {
        auto* b = static_cast<uint8_t*>(dst);
        for (size_t i = 0; i < nbytes; ++i) b[i] = b[i] != 0;
      }
    });
  }

  // Reads every chunk of `ds` (the grid's form, Fletcher-32 only) straight into `dst`, verifying
  // each checksum; a damaged chunk is an error. False (nothing verified yet) when some chunk is
  // not stored as expected (unallocated, filter skipped, other size): H5Dread then reads it.
  template <class Where>
  bool read_chunks(hid_t ds, const ChunkGrid& g, char* dst, const Where& where) {
    struct Loc {
      haddr_t addr;
      uint64_t begin, valid;
    };
    std::vector<Loc> locs;
    std::vector<hsize_t> coord;
    const uint64_t cb = g.chunk_bytes();
    for (uint64_t i = 0; i < g.count(); ++i) {
      Loc l{};
      g.locate(i, coord, l.begin, l.valid);
      unsigned mask = 0;
      hsize_t size = 0;
      if (H5Dget_chunk_info_by_coord(ds, coord.data(), &mask, &l.addr, &size) < 0 ||
          l.addr == HADDR_UNDEF || mask != 0 || size != cb + 4) {
        H5Eclear2(H5E_DEFAULT);
        return false;
      }
      locs.push_back(l);
    }
    std::vector<char> tail;
    for (const Loc& l : locs) {
      raw_.read(l.addr, dst + l.begin, static_cast<size_t>(l.valid), "tensor data");
      // The padding of a last chunk and the checksum after the chunk.
      tail.resize(static_cast<size_t>(cb - l.valid) + 4);
      raw_.read(l.addr + l.valid, tail.data(), tail.size(), "tensor data");
      Fletcher32 f;
      f.update(dst + l.begin, static_cast<size_t>(l.valid));
      f.update(tail.data(), tail.size() - 4);
      uint32_t stored = 0;
      std::memcpy(&stored, tail.data() + tail.size() - 4, 4);
      uint32_t sum = f.value();
      if (!fletcher_matches(stored, sum))
        fail(
            "checkpoint {}: {} is damaged: its data fails the Fletcher-32 checksum (the chunk "
            "holding bytes {} to {} of the tensor, at byte {} of the file; stored {:08x}, "
            "computed {:08x})",
            path, where(), l.begin, l.begin + l.valid, static_cast<uint64_t>(l.addr), stored, sum);
    }
    return true;
  }

 private:
  FileReader raw_;
  Hid file_;
  bool loaded_ = false;
  std::vector<std::string> datasets_;  // storage id -> dataset name
};

}  // namespace

std::unique_ptr<FormatReader> open_hdf5(const std::string& path, bool lazy) {
  return std::make_unique<Hdf5Reader>(path, lazy);
}

}  // namespace ckpt

void save_hdf5(const State& state, const std::string& path_arg) {
  using namespace ckpt;
  const std::string path = save_path(path_arg, "save_hdf5");
  h5_init();
  AtomicFile out(path);
  const std::string& tmp = out.temp_path();
  {
    Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    // The 1.10 format: checksummed metadata (damage is detected) and large attributes.
    H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
    // Metadata (object headers, link index, attributes) in 256 KiB blocks rather than small
    // pieces between the tensors: opening the file and finding one tensor touches few pages.
    // Test hook: CSTORCH_TEST_HDF5_META_BLOCK_BYTES sets another size (the fuzz seed corpus
    // uses a small one: a 256 KiB file of mostly zeros is a poor starting point for mutation).
    const char* mb = std::getenv("CSTORCH_TEST_HDF5_META_BLOCK_BYTES");
    H5Pset_meta_block_size(
        fapl, mb && std::atoll(mb) > 0 ? static_cast<hsize_t>(std::atoll(mb)) : hsize_t{256} << 10);
    WriteFile file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl), path);
    if (!file.ok()) fail("save {}: cannot create {}: {}", path, tmp, h5_error());
    write_int_attr(file, "cstorch_format_version", kCheckpointFormatVersion, path);

    int64_t total = count_tensors(state);
    int64_t pause_at = std::max<int64_t>(1, total / 2), written = 0;
    std::map<const void*, std::string> stored;  // tensor identity -> dataset name
    std::set<std::string> names;
    std::vector<char> scratch;  // one chunk and its checksum, reused
    auto unique_name = [&](const std::string& key) {
      std::string base = escape_name(key), name = base;
      for (int i = 1; names.count(name); ++i) name = base + "%" + std::to_string(i);
      names.insert(name);
      return name;
    };
    Json root = encode_structure(state, path, [&](const std::string& key, const Tensor& t) {
      CS_CHECK(t.defined(), "save {}: the tensor at key '{}' is undefined", path, show_key(key));
      Json shape = Json::array();
      for (auto d : t.shape()) shape.push_back(d);
      Json j{{"kind", "tensor"}, {"dtype", dtype_name(t.dtype())}, {"shape", shape}};
      std::string name = unique_name(key);
      auto it = stored.find(tensor_identity(t));
      if (it != stored.end()) {
        // Tied: one dataset; a hard link gives h5py users the second key as well.
        if (H5Lcreate_hard(file, it->second.c_str(), file, name.c_str(), H5P_DEFAULT, H5P_DEFAULT) <
            0)
          fail("save {}: cannot link '{}' to '{}': {}", path, show_key(key), it->second,
               h5_error());
        j["dataset"] = it->second;
        return j;
      }
      write_dataset(file, name, t, path, key, scratch);
      stored.emplace(tensor_identity(t), name);
      j["dataset"] = name;
      if (++written == pause_at && std::getenv("CSTORCH_TEST_PAUSE_SAVE")) {
        H5Fflush(file, H5F_SCOPE_GLOBAL);
        maybe_pause_save(tmp);
      }
      if (written == pause_at) file.test_hook_disk_full();
      return j;
    });
    write_string_attr(file, "cstorch_structure", root.dump(), path, "");
    // Everything else reaches the file before the marker is added.
    file.reserve("flush");
    if (file.flush() < 0) fail("save {}: flush failed: {}", path, h5_error());
    write_int_attr(file, "__SUCCESS__", 1, path);
    file.reserve("close");
    if (file.close() < 0) fail("save {}: closing the file failed: {}", path, h5_error());
  }
  out.commit();
}

}  // namespace cstorch
