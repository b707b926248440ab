// PyTorch's torch.save format, written and read without Python: a zip archive (libzip; entries
// stored uncompressed) holding `<prefix>/data.pkl` (a pickle, protocol 2, of the object with each
// tensor reduced to torch._utils._rebuild_tensor_v2 over a persistent storage reference),
// `<prefix>/data/<key>` (each storage's raw little-endian bytes) and `<prefix>/version`.
//
// Reading accepts what torch.save writes (PyTorch 1.6 and newer; pickle protocols 2 to 5):
// dicts, OrderedDicts, lists, tuples, ints, floats, bools, strings, None and tensors (views
// with offsets and strides included). Any other pickled object is an error naming it; no code
// from the file is ever run. Every record read (data.pkl, each storage) is checked against the
// CRC-32 of the zip central directory (zlib's crc32), so damaged bytes are an error naming the
// record and the tensor rather than wrong values.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include <fcntl.h>
#include <unistd.h>
#include <zip.h>

#include "checkpoint/common.h"

namespace cstorch {
namespace ckpt {
namespace {

// ---------------------------------------------------------------------------------------------
// Little-endian byte helpers.

template <class T>
void put(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  s.append(b, sizeof(T));
}

template <class T>
T get(const std::string& s, size_t at) {
  T v;
  std::memcpy(&v, s.data() + at, sizeof(T));
  return v;
}

// ---------------------------------------------------------------------------------------------
// The zip container, through libzip. libzip lays out and parses the archive (local headers,
// central directory, zip64 records when sizes or offsets pass 4 GB); the bytes go through
// sources defined here over our own file handles, so that a save writes into the crash-safe
// temporary file (AtomicFile) and every read is a bounds-checked pread whose errors name the
// file. C callbacks must not throw: they record the message and report failure to libzip,
// which returns it to the C++ caller that throws it.

// A libzip error as text (libzip's zip_error_t owns a string buffer).
std::string zip_error_text(zip_error_t* e) {
  return zip_error_strerror(e);
}

// Output source: sequential writes buffered, plus the positioned rewrites libzip makes of the
// local headers once an entry's CRC is known.
class ZipFileSink {
 public:
  ZipFileSink(const std::string& file, const std::string& shown) : file_(file), shown_(shown) {
    zip_error_init(&error_);
  }
  ~ZipFileSink() {
    if (fd_ >= 0) ::close(fd_);
    zip_error_fini(&error_);
  }
  static zip_int64_t callback(void* self, void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
    return static_cast<ZipFileSink*>(self)->handle(data, len, cmd);
  }
  std::string failure;  // the first error, with the file named

 private:
  zip_int64_t handle(void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
    try {
      switch (cmd) {
        case ZIP_SOURCE_SUPPORTS:
          return ZIP_SOURCE_SUPPORTS_WRITABLE |
                 zip_source_make_command_bitmap(ZIP_SOURCE_ACCEPT_EMPTY, -1);
        case ZIP_SOURCE_STAT: {  // a new, empty archive (opened with ZIP_TRUNCATE)
          auto* st = ZIP_SOURCE_GET_ARGS(zip_stat_t, data, len, &error_);
          if (!st) return -1;
          zip_stat_init(st);
          st->size = 0;
          st->valid |= ZIP_STAT_SIZE;
          return sizeof(*st);
        }
        case ZIP_SOURCE_ERROR:
          return zip_error_to_data(&error_, data, len);
        case ZIP_SOURCE_OPEN:
        case ZIP_SOURCE_CLOSE:
        case ZIP_SOURCE_FREE:
        case ZIP_SOURCE_ACCEPT_EMPTY:
          return 0;
        case ZIP_SOURCE_READ:
        case ZIP_SOURCE_SEEK:
          return 0;  // nothing to read back from a truncated archive
        case ZIP_SOURCE_TELL:
          return 0;
        case ZIP_SOURCE_BEGIN_WRITE:
          fd_ = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
          if (fd_ < 0)
            return fail(fmt::format("cannot create {}: {}", file_, std::strerror(errno)));
          buf_.clear();
          buf_.reserve(kBuffer);
          pos_ = end_ = flushed_ = 0;
          return 0;
        case ZIP_SOURCE_WRITE:
          return write(static_cast<const char*>(data), len);
        case ZIP_SOURCE_SEEK_WRITE: {
          zip_int64_t at = zip_source_seek_compute_offset(pos_, end_, data, len, &error_);
          if (at < 0) return -1;
          pos_ = static_cast<uint64_t>(at);
          return 0;
        }
        case ZIP_SOURCE_TELL_WRITE:
          return static_cast<zip_int64_t>(pos_);
        case ZIP_SOURCE_COMMIT_WRITE: {
          if (!flush()) return -1;
          int rc = ::close(fd_);
          fd_ = -1;
          if (rc != 0)
            return fail(fmt::format("closing {} failed: {}", file_, std::strerror(errno)));
          return 0;
        }
        case ZIP_SOURCE_ROLLBACK_WRITE:
        case ZIP_SOURCE_REMOVE:
          if (fd_ >= 0) ::close(fd_);
          fd_ = -1;
          return 0;  // AtomicFile removes the temporary file
        default:
          zip_error_set(&error_, ZIP_ER_OPNOTSUPP, 0);
          return -1;
      }
    } catch (const std::exception& e) {
      return fail(e.what());
    }
  }

  zip_int64_t fail(std::string msg) {
    if (failure.empty()) failure = "save " + shown_ + ": " + std::move(msg);
    zip_error_set(&error_, ZIP_ER_WRITE, 0);
    return -1;
  }

  zip_int64_t write(const char* p, uint64_t n) {
    if (pos_ == end_ && pos_ == flushed_ + buf_.size()) {  // appending
      if (buf_.size() + n > kBuffer && !flush()) return -1;
      if (n >= kBuffer) {
        if (!pwrite_all(p, n, pos_)) return -1;
        flushed_ = pos_ + n;
      } else {
        buf_.insert(buf_.end(), p, p + n);
      }
    } else {  // a rewrite of bytes already written (a local header)
      if (!flush() || !pwrite_all(p, n, pos_)) return -1;
    }
    pos_ += n;
    end_ = std::max(end_, pos_);
    return static_cast<zip_int64_t>(n);
  }

  bool flush() {
    if (buf_.empty()) return true;
    if (!pwrite_all(buf_.data(), buf_.size(), flushed_)) return false;
    flushed_ += buf_.size();
    buf_.clear();
    return true;
  }

  bool pwrite_all(const char* p, uint64_t n, uint64_t at) {
    while (n > 0) {
      ssize_t k = ::pwrite(fd_, p, static_cast<size_t>(std::min<uint64_t>(n, 1u << 30)),
                           static_cast<off_t>(at));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        fail(fmt::format("writing {} failed: {}", file_, std::strerror(errno)));
        return false;
      }
      p += k;
      n -= static_cast<uint64_t>(k);
      at += static_cast<uint64_t>(k);
    }
    return true;
  }

  static constexpr size_t kBuffer = size_t{4} << 20;
  std::string file_, shown_;
  zip_error_t error_;
  int fd_ = -1;
  std::vector<char> buf_;  // bytes [flushed_, flushed_ + buf_.size())
  uint64_t pos_ = 0, end_ = 0, flushed_ = 0;
};

// Zip writer: stored (uncompressed) entries, each record's data starting on a 64-byte
// boundary (as torch.save writes them, so that readers may map tensors in place), a fixed
// timestamp so that equal states give equal files.
class ZipWriter {
 public:
  ZipWriter(const std::string& file, const std::string& shown) : sink_(file, shown), shown_(shown) {
    zip_error_t err;
    zip_error_init(&err);
    src_ = zip_source_function_create(&ZipFileSink::callback, &sink_, &err);
    CS_CHECK(src_, "save {}: libzip: {}", shown_, zip_error_text(&err));
    za_ = zip_open_from_source(src_, ZIP_CREATE | ZIP_TRUNCATE, &err);
    if (!za_) {
      std::string msg = zip_error_text(&err);
      zip_error_fini(&err);
      zip_source_free(src_);
      fail("save {}: libzip cannot start the archive: {}", shown_, msg);
    }
    zip_error_fini(&err);
  }
  ~ZipWriter() {
    if (za_) zip_discard(za_);  // not finished: nothing is committed
  }
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  // `data` must stay valid until finish() (libzip reads it then).
  void add(const std::string& name, const void* data, uint64_t n) {
    zip_source_t* s = zip_source_buffer(za_, n ? data : nullptr, n, 0);
    CS_CHECK(s, "save {}: libzip: {}", shown_, zip_strerror(za_));
    zip_int64_t idx = zip_file_add(za_, name.c_str(), s, ZIP_FL_ENC_UTF_8);
    if (idx < 0) {
      zip_source_free(s);
      fail("save {}: libzip cannot add {}: {}", shown_, name, zip_strerror(za_));
    }
    auto i = static_cast<zip_uint64_t>(idx);
    CS_CHECK(zip_set_file_compression(za_, i, ZIP_CM_STORE, 0) == 0 &&
                 zip_file_set_mtime(za_, i, kTime, 0) == 0,
             "save {}: libzip: {}", shown_, zip_strerror(za_));
    // The local header is 30 bytes, the name, libzip's zip64 field when the size needs one
    // (20 bytes) and this padding field ("FB" and its length, as torch.save's).
    uint64_t header = 30 + name.size() + (n > k32 ? 20 : 0) + 4;
    uint16_t pad = static_cast<uint16_t>((64 - (offset_ + header) % 64) % 64);
    std::string z(pad, 'Z');
    CS_CHECK(zip_file_extra_field_set(za_, i, 0x4246, ZIP_EXTRA_FIELD_NEW,
                                      reinterpret_cast<const zip_uint8_t*>(z.data()), pad,
                                      ZIP_FL_LOCAL) == 0,
             "save {}: libzip: {}", shown_, zip_strerror(za_));
    offset_ += header + pad + n;
  }

  void finish() {
    int rc = zip_close(za_);
    if (rc != 0) {
      std::string msg = sink_.failure.empty()
                            ? fmt::format("save {}: libzip: {}", shown_, zip_strerror(za_))
                            : sink_.failure;
      zip_discard(za_);
      za_ = nullptr;
      fail("{}", msg);
    }
    za_ = nullptr;  // zip_close freed it
  }

 private:
  static constexpr uint64_t k32 = 0xFFFFFFFFu;
  static constexpr time_t kTime = 315532800;  // 1980-01-01, the earliest zip date
  ZipFileSink sink_;
  std::string shown_;
  zip_source_t* src_ = nullptr;
  zip_t* za_ = nullptr;
  uint64_t offset_ = 0;  // where the next local header starts
};

// Input source over a FileReader (bounds-checked preads).
class ZipFileSource {
 public:
  explicit ZipFileSource(FileReader& f) : f_(f) { zip_error_init(&error_); }
  ~ZipFileSource() { zip_error_fini(&error_); }
  static zip_int64_t callback(void* self, void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
    return static_cast<ZipFileSource*>(self)->handle(data, len, cmd);
  }
  std::string failure;  // the last read error, naming the file

 private:
  zip_int64_t handle(void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
    switch (cmd) {
      case ZIP_SOURCE_SUPPORTS:
        return ZIP_SOURCE_SUPPORTS_SEEKABLE;
      case ZIP_SOURCE_OPEN:
        pos_ = 0;
        return 0;
      case ZIP_SOURCE_READ: {
        uint64_t n = pos_ >= f_.size() ? 0 : std::min<uint64_t>(len, f_.size() - pos_);
        try {
          if (n) f_.read(pos_, data, static_cast<size_t>(n), "the zip archive");
        } catch (const std::exception& e) {
          failure = e.what();
          zip_error_set(&error_, ZIP_ER_READ, EIO);
          return -1;
        }
        pos_ += n;
        return static_cast<zip_int64_t>(n);
      }
      case ZIP_SOURCE_SEEK: {
        zip_int64_t at = zip_source_seek_compute_offset(pos_, f_.size(), data, len, &error_);
        if (at < 0) return -1;
        pos_ = static_cast<uint64_t>(at);
        return 0;
      }
      case ZIP_SOURCE_TELL:
        return static_cast<zip_int64_t>(pos_);
      case ZIP_SOURCE_STAT: {
        auto* st = ZIP_SOURCE_GET_ARGS(zip_stat_t, data, len, &error_);
        if (!st) return -1;
        zip_stat_init(st);
        st->size = f_.size();
        st->valid |= ZIP_STAT_SIZE;
        return sizeof(*st);
      }
      case ZIP_SOURCE_ERROR:
        return zip_error_to_data(&error_, data, len);
      case ZIP_SOURCE_CLOSE:
      case ZIP_SOURCE_FREE:
        return 0;
      default:
        zip_error_set(&error_, ZIP_ER_OPNOTSUPP, 0);
        return -1;
    }
  }

  FileReader& f_;
  zip_error_t error_;
  uint64_t pos_ = 0;
};

struct ZipEntry {
  zip_uint64_t index = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t csize = 0, usize = 0;
};

// Zip reader: the archive's directory through libzip (with its consistency checks of every
// local header against the central directory); only stored (uncompressed) entries, which is
// what torch.save writes. Record bytes are read at offsets within the record, and CRC-32s are
// checked here (libzip checks only whole records read from their start).
class ZipReader {
 public:
  explicit ZipReader(FileReader& f) : f_(f), source_(f) {
    const std::string& p = f.path();
    CS_CHECK(f.size() >= 22, "checkpoint {}: truncated zip file ({} bytes)", p, f.size());
    zip_error_t err;
    zip_error_init(&err);
    src_ = zip_source_function_create(&ZipFileSource::callback, &source_, &err);
    CS_CHECK(src_, "checkpoint {}: libzip: {}", p, zip_error_text(&err));
    za_ = zip_open_from_source(src_, ZIP_RDONLY | ZIP_CHECKCONS, &err);
    if (!za_) {
      int code = zip_error_code_zip(&err);
      std::string msg = zip_error_text(&err);
      zip_error_fini(&err);
      zip_source_free(src_);
      if (!source_.failure.empty()) fail("{}", source_.failure);
      if (code == ZIP_ER_NOZIP)
        fail("checkpoint {}: no zip end record: the file is truncated or not a zip archive", p);
      fail("checkpoint {}: damaged zip archive ({})", p, msg);
    }
    zip_error_fini(&err);
    zip_int64_t count = zip_get_num_entries(za_, 0);
    for (zip_int64_t i = 0; i < count; ++i) {
      zip_stat_t st;
      CS_CHECK(zip_stat_index(za_, static_cast<zip_uint64_t>(i), 0, &st) == 0 &&
                   (st.valid & ZIP_STAT_NAME) && (st.valid & ZIP_STAT_SIZE) &&
                   (st.valid & ZIP_STAT_COMP_SIZE) && (st.valid & ZIP_STAT_CRC) &&
                   (st.valid & ZIP_STAT_COMP_METHOD),
               "checkpoint {}: damaged zip central directory entry {}", p, i);
      ZipEntry e;
      e.index = static_cast<zip_uint64_t>(i);
      e.method = st.comp_method;
      e.crc = st.crc;
      e.csize = st.comp_size;
      e.usize = st.size;
      std::string name = st.name;
      if (entries_.emplace(name, e).second) names_.push_back(name);
    }
  }
  ~ZipReader() {
    if (za_) zip_discard(za_);
  }
  ZipReader(const ZipReader&) = delete;
  ZipReader& operator=(const ZipReader&) = delete;

  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }

  // The entry, validated (stored, sizes consistent, within the file).
  const ZipEntry& entry(const std::string& name) {
    auto it = entries_.find(name);
    CS_CHECK(it != entries_.end(), "checkpoint {}: the zip archive has no record {}", f_.path(),
             name);
    const ZipEntry& e = it->second;
    CS_CHECK(e.method == ZIP_CM_STORE && e.csize == e.usize,
             "checkpoint {}: record {} is compressed (method {}); only the uncompressed "
             "records torch.save writes are supported",
             f_.path(), name, e.method);
    CS_CHECK(e.usize <= f_.size(),
             "checkpoint {}: record {} ({} bytes) lies past the end of the file: truncated",
             f_.path(), name, e.usize);
    return e;
  }

  // Reads n bytes at offset `at` of the record into dst.
  void read(const std::string& name, uint64_t at, void* dst, uint64_t n) {
    const ZipEntry& e = entry(name);
    CS_CHECK(at <= e.usize && n <= e.usize - at,
             "checkpoint {}: read of bytes {}..{} of record {} ({} bytes)", f_.path(), at, at + n,
             name, e.usize);
    if (n == 0) return;
    source_.failure.clear();
    zip_file_t* zf = zip_fopen_index(za_, e.index, ZIP_FL_COMPRESSED);  // stored: the bytes
    if (!zf) record_error(name, zip_strerror(za_));
    struct Closer {
      zip_file_t* f;
      ~Closer() { zip_fclose(f); }
    } closer{zf};
    if (at > 0 && zip_fseek(zf, static_cast<zip_int64_t>(at), SEEK_SET) != 0)
      record_error(name, zip_file_strerror(zf));
    auto* out = static_cast<char*>(dst);
    while (n > 0) {
      zip_int64_t k = zip_fread(zf, out, std::min<uint64_t>(n, uint64_t{1} << 30));
      if (k < 0) record_error(name, zip_file_strerror(zf));
      if (k == 0)
        fail("checkpoint {}: record {} ({} bytes) lies past the end of the file: truncated",
             f_.path(), name, e.usize);
      out += k;
      n -= static_cast<uint64_t>(k);
    }
  }
  std::string read_string(const std::string& name, uint64_t at, uint64_t n) {
    std::string s(static_cast<size_t>(n), '\0');
    read(name, at, s.data(), n);
    return s;
  }

  std::string read_all(const std::string& name, uint64_t limit) {
    const ZipEntry& e = entry(name);
    CS_CHECK(e.usize <= limit, "checkpoint {}: record {} is implausibly large ({} bytes)",
             f_.path(), name, e.usize);
    std::string s = read_string(name, 0, e.usize);
    check_crc(name, crc32(s.data(), s.size()), "");
    return s;
  }

  // A mismatch with the record's CRC-32 (central directory) is an error naming the record and,
  // when the record is a tensor's storage, the tensor (`what`: " (the storage of ...)").
  void check_crc(const std::string& name, uint32_t crc, const std::string& what) {
    const ZipEntry& e = entry(name);
    CS_CHECK(crc == e.crc,
             "checkpoint {}: record {}{} is damaged: its bytes fail the CRC-32 check (stored "
             "{:08x}, computed {:08x})",
             f_.path(), name, what, e.crc, crc);
  }

 private:
  [[noreturn]] void record_error(const std::string& name, const char* msg) {
    if (!source_.failure.empty())
      fail("checkpoint {}: reading record {}: {}", f_.path(), name, source_.failure);
    fail("checkpoint {}: reading record {}: {} (the file is damaged or truncated)", f_.path(), name,
         msg);
  }

  FileReader& f_;
  ZipFileSource source_;
  zip_source_t* src_ = nullptr;
  zip_t* za_ = nullptr;
  std::map<std::string, ZipEntry> entries_;
  std::vector<std::string> names_;
};

// ---------------------------------------------------------------------------------------------
// Pickle writer (protocol 2).

const char* storage_name(DType t) {
  switch (t) {
    case DType::f32:
      return "FloatStorage";
    case DType::bf16:
      return "BFloat16Storage";
    case DType::f16:
      return "HalfStorage";
    case DType::i32:
      return "IntStorage";
    case DType::i64:
      return "LongStorage";
    case DType::boolean:
      return "BoolStorage";
  }
  return "?";
}

class PickleWriter {
 public:
  std::string out;
  struct Storage {
    std::string key;
    Tensor t;
  };
  std::vector<Storage> storages;

  explicit PickleWriter(const std::string& path) : path_(path) {
    out += "\x80\x02";  // PROTO 2
  }
  void finish() { out += '.'; }

  // How a map is written: as it is, or as part of an optimizer state dict (see
  // optimizer_dict), whose "state" keys are Python ints and whose param groups' pairs are
  // tuples, as torch.optim's state_dict() holds them.
  enum class Role { Plain, OptimizerState, ParamGroup };

  void value(const State& s, const std::string& key, int depth, Role role = Role::Plain) {
    CS_CHECK(depth < kMaxDepth, "save {}: state nested deeper than {} levels at '{}'", path_,
             kMaxDepth, show_key(key));
    if (role == Role::ParamGroup && s.is_list()) {  // a pair (betas, etas, step_sizes)
      value(s[0], join_key(key, "0"), depth + 1);
      value(s[1], join_key(key, "1"), depth + 1);
      out += '\x86';  // TUPLE2
      return;
    }
    switch (s.kind()) {
      case State::Kind::None:
        out += 'N';
        break;
      case State::Kind::Bool:
        out += s.as_bool() ? '\x88' : '\x89';
        break;
      case State::Kind::Int:
        integer(s.as_int());
        break;
      case State::Kind::Float: {
        out += 'G';
        double v = s.as_double();
        uint64_t u;
        std::memcpy(&u, &v, 8);
        for (int i = 7; i >= 0; --i) out += static_cast<char>((u >> (8 * i)) & 0xFF);
        break;
      }
      case State::Kind::String:
        CS_CHECK(valid_utf8(s.as_string()), "save {}: the string at key '{}' is not valid UTF-8",
                 path_, show_key(key));
        string(s.as_string());
        break;
      case State::Kind::Tensor:
        tensor(s.as_tensor(), key);
        break;
      case State::Kind::List:
        out += ']';
        if (s.size() > 0) {
          out += '(';
          for (size_t i = 0; i < s.size(); ++i)
            value(s[i], join_key(key, std::to_string(i)), depth + 1);
          out += 'e';  // APPENDS
        }
        break;
      case State::Kind::Map: {
        const bool optimizer = optimizer_dict(s);
        out += '}';
        if (s.size() > 0) {
          out += '(';
          for (size_t i = 0; i < s.size(); ++i) {
            const std::string& k = s.keys()[i];
            CS_CHECK(valid_utf8(k), "save {}: a key under '{}' is not valid UTF-8", path_,
                     show_key(key));
            Role child = Role::Plain;
            if (role == Role::OptimizerState)
              integer(std::stoll(k));  // checked by optimizer_dict
            else
              string(k);
            if (optimizer && k == "state") child = Role::OptimizerState;
            if (role == Role::ParamGroup && is_pair(k, s.items()[i])) child = Role::ParamGroup;
            if (optimizer && k == "param_groups") {
              // A list of param groups: each group's pairs become tuples.
              const State& gl = s.items()[i];
              const std::string gkey = join_key(key, k);
              out += ']';
              if (gl.size() > 0) {
                out += '(';
                for (size_t g = 0; g < gl.size(); ++g)
                  value(gl[g], join_key(gkey, std::to_string(g)), depth + 2, Role::ParamGroup);
                out += 'e';
              }
              continue;
            }
            value(s.items()[i], join_key(key, k), depth + 1, child);
          }
          out += 'u';  // SETITEMS
        }
        break;
      }
    }
  }

 private:
  // An optimizer's state dict as Optimizer::state_dict() makes it: exactly the keys "state"
  // (a map keyed by parameter ids, decimal integers) and "param_groups" (a list of maps).
  static bool optimizer_dict(const State& s) {
    if (s.size() != 2 || !s.contains("state") || !s.contains("param_groups")) return false;
    const State& st = s.at("state");
    const State& gl = s.at("param_groups");
    if (!st.is_map() || !gl.is_list()) return false;
    for (const auto& k : st.keys()) {
      if (k.empty() || k.size() > 18 || (k.size() > 1 && k[0] == '0')) return false;
      for (char c : k)
        if (c < '0' || c > '9') return false;
    }
    for (const auto& g : gl.items())
      if (!g.is_map()) return false;
    return true;
  }
  // A hyper-parameter pair of a param group (torch keeps these as tuples).
  static bool is_pair(const std::string& k, const State& v) {
    return (k == "betas" || k == "etas" || k == "step_sizes") && v.is_list() && v.size() == 2 &&
           v[0].is_number() && v[1].is_number();
  }

  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      out += 'K';
      out += static_cast<char>(v);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      out += 'J';
      put<int32_t>(out, static_cast<int32_t>(v));
    } else {
      out += '\x8a';  // LONG1: 8-byte two's complement
      out += '\x08';
      put<int64_t>(out, v);
    }
  }
  void string(const std::string& s) {
    out += 'X';
    put<uint32_t>(out, static_cast<uint32_t>(s.size()));
    out += s;
  }
  void global(const char* module, const char* name) {
    out += 'c';
    out += module;
    out += '\n';
    out += name;
    out += '\n';
  }
  void memo_put() {
    out += 'r';
    put<uint32_t>(out, next_memo_++);
  }
  void tensor(const Tensor& t, const std::string& key) {
    CS_CHECK(t.defined(), "save {}: the tensor at key '{}' is undefined", path_, show_key(key));
    auto it = memo_.find(tensor_identity(t));
    if (it != memo_.end()) {  // the same tensor again: the same Python object
      out += 'j';
      put<uint32_t>(out, it->second);
      return;
    }
    std::string skey = std::to_string(storages.size());
    storages.push_back({skey, t});
    global("torch._utils", "_rebuild_tensor_v2");
    out += '(';
    // Persistent id ('storage', torch.<T>Storage, key, 'cpu', numel).
    out += '(';
    string("storage");
    global("torch", storage_name(t.dtype()));
    string(skey);
    string("cpu");
    integer(t.numel());
    out += 't';
    out += 'Q';  // BINPERSID
    integer(0);  // storage offset
    out += '(';
    for (auto d : t.shape()) integer(d);
    out += 't';
    out += '(';
    int64_t stride = 1;
    std::vector<int64_t> strides(t.shape().size());
    for (size_t i = strides.size(); i-- > 0;) {
      strides[i] = stride;
      stride *= t.shape()[i];
    }
    for (auto s : strides) integer(s);
    out += 't';
    out += '\x89';  // requires_grad False
    global("collections", "OrderedDict");
    out += ")R";  // OrderedDict() backward hooks
    out += 't';
    out += 'R';
    memo_.emplace(tensor_identity(t), next_memo_);
    memo_put();
  }

  std::string path_;
  std::map<const void*, uint32_t> memo_;
  uint32_t next_memo_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Pickle reader: a stack machine over a closed set of object kinds.

struct PyObj;
using Obj = std::shared_ptr<PyObj>;

struct PyObj {
  enum class T { None, Bool, Int, Float, Str, Bytes, List, Tuple, Dict, Global, Storage, Tensor };
  T t = T::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s, s2;  // Str / Bytes; Global: module, name; Storage: key, dtype name
  std::vector<Obj> items;
  std::vector<std::pair<Obj, Obj>> dict;
  // Storage
  std::optional<DType> dtype;
  int64_t numel = 0;
  // Tensor
  Obj storage;
  int64_t offset = 0;
  Shape shape, stride;
};

std::optional<DType> dtype_of_storage(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (name == storage_name(static_cast<DType>(i))) return static_cast<DType>(i);
  return std::nullopt;
}

// The objects it makes live until the Unpickler is destroyed, which first cuts every link
// between them and then frees them one by one: freeing a deep chain (a hostile file nests
// lists 200000 deep) link by link would recurse once per level, and a cycle made through the
// memo would never be freed. Objects kept past that (the storages tensors refer to) have no
// links.
class Unpickler {
 public:
  Unpickler(const std::string& data, const std::string& path) : d_(data), path_(path) {}
  Unpickler(const Unpickler&) = delete;
  Unpickler& operator=(const Unpickler&) = delete;
  ~Unpickler() {
    for (auto& o : all_) {  // every object is still held by all_: nothing is freed here
      o->items.clear();
      o->dict.clear();
      o->storage.reset();
    }
  }

  Obj run() {
    for (;;) {
      uint8_t op = byte();
      switch (op) {
        case 0x80:  // PROTO
          byte();
          break;
        case 0x95:  // FRAME
          bytes(8);
          break;
        case '}':
          push(mk(PyObj::T::Dict));
          break;
        case ']':
          push(mk(PyObj::T::List));
          break;
        case ')':
          push(mk(PyObj::T::Tuple));
          break;
        case '(':
          marks_.push_back(stack_.size());
          break;
        case 'q':
          memo(byte());
          break;
        case 'r':
          memo(u32());
          break;
        case 0x94:  // MEMOIZE
          memo(static_cast<uint32_t>(memo_.size()));
          break;
        case 'h':
          push(memo_get(byte()));
          break;
        case 'j':
          push(memo_get(u32()));
          break;
        case 'X':
          push_str(bytes(u32()), PyObj::T::Str);
          break;
        case 0x8c:
          push_str(bytes(byte()), PyObj::T::Str);
          break;
        case 0x8d:
          push_str(bytes(u64()), PyObj::T::Str);
          break;
        case 'T':  // BINSTRING (Python 2 str)
          push_str(bytes(u32()), PyObj::T::Str);
          break;
        case 'U':
          push_str(bytes(byte()), PyObj::T::Str);
          break;
        case 'B':
          push_str(bytes(u32()), PyObj::T::Bytes);
          break;
        case 'C':
          push_str(bytes(byte()), PyObj::T::Bytes);
          break;
        case 0x8e:
          push_str(bytes(u64()), PyObj::T::Bytes);
          break;
        case 'J': {
          int32_t v;
          std::string b = bytes(4);
          std::memcpy(&v, b.data(), 4);
          push_int(v);
          break;
        }
        case 'K':
          push_int(byte());
          break;
        case 'M': {
          std::string b = bytes(2);
          push_int(static_cast<uint8_t>(b[0]) | (static_cast<uint8_t>(b[1]) << 8));
          break;
        }
        case 0x8a:
          push_long(bytes(byte()));
          break;
        case 0x8b:
          push_long(bytes(u32()));
          break;
        case 'G': {
          std::string b = bytes(8);
          uint64_t u = 0;
          for (int i = 0; i < 8; ++i)
            u = (u << 8) | static_cast<uint8_t>(b[static_cast<size_t>(i)]);
          auto o = mk(PyObj::T::Float);
          std::memcpy(&o->f, &u, 8);
          push(o);
          break;
        }
        case 0x88:
        case 0x89: {
          auto o = mk(PyObj::T::Bool);
          o->b = op == 0x88;
          push(o);
          break;
        }
        case 'N':
          push(mk(PyObj::T::None));
          break;
        case 't': {
          auto o = mk(PyObj::T::Tuple);
          o->items = pop_mark();
          push(o);
          break;
        }
        case 0x85:
        case 0x86:
        case 0x87: {
          size_t n = op - 0x84u;
          auto o = mk(PyObj::T::Tuple);
          need(n);
          o->items.assign(stack_.end() - static_cast<std::ptrdiff_t>(n), stack_.end());
          stack_.resize(stack_.size() - n);
          push(o);
          break;
        }
        case 'c': {
          auto o = mk(PyObj::T::Global);
          o->s = line();
          o->s2 = line();
          push(o);
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          Obj name = pop(), module = pop();
          CS_CHECK(name->t == PyObj::T::Str && module->t == PyObj::T::Str,
                   "checkpoint {}: damaged pickle (STACK_GLOBAL without names)", path_);
          auto o = mk(PyObj::T::Global);
          o->s = module->s;
          o->s2 = name->s;
          push(o);
          break;
        }
        case 'R': {
          Obj args = pop(), fn = pop();
          push(reduce(fn, args));
          break;
        }
        case 0x81: {  // NEWOBJ
          Obj args = pop(), cls = pop();
          push(reduce(cls, args));
          break;
        }
        case 'b': {  // BUILD: object state; OrderedDict's _metadata and tensor attributes
          Obj state = pop();
          need(1);
          auto t = stack_.back()->t;
          CS_CHECK(t == PyObj::T::Dict || t == PyObj::T::Tensor,
                   "checkpoint {}: unsupported pickled object state", path_);
          (void)state;
          break;
        }
        case 's': {
          Obj v = pop(), k = pop();
          dict_of_top()->dict.emplace_back(k, v);
          break;
        }
        case 'u': {
          auto kv = pop_mark();
          CS_CHECK(kv.size() % 2 == 0, "checkpoint {}: damaged pickle (odd SETITEMS)", path_);
          auto d = dict_of_top();
          for (size_t i = 0; i < kv.size(); i += 2) d->dict.emplace_back(kv[i], kv[i + 1]);
          break;
        }
        case 'a': {
          Obj v = pop();
          list_of_top()->items.push_back(v);
          break;
        }
        case 'e': {
          auto vs = pop_mark();
          auto l = list_of_top();
          l->items.insert(l->items.end(), vs.begin(), vs.end());
          break;
        }
        case 'Q': {
          Obj pid = pop();
          push(persistent(pid));
          break;
        }
        case '.': {
          CS_CHECK(stack_.size() == 1, "checkpoint {}: damaged pickle (stack of {} at STOP)", path_,
                   stack_.size());
          return stack_.back();
        }
        default:
          fail(
              "checkpoint {}: unsupported pickle opcode 0x{:02x} at byte {} (torch.save files "
              "use protocols 2 to 5; text protocols and sets are not supported)",
              path_, op, pos_ - 1);
      }
    }
  }

 private:
  void need(size_t n) {
    size_t floor = marks_.empty() ? 0 : marks_.back();
    CS_CHECK(stack_.size() >= floor + n, "checkpoint {}: damaged pickle (stack underflow at {})",
             path_, pos_);
  }
  void push(Obj o) {
    CS_CHECK(stack_.size() < (size_t{1} << 24), "checkpoint {}: damaged pickle (stack overflow)",
             path_);
    stack_.push_back(std::move(o));
  }
  Obj pop() {
    need(1);
    Obj o = std::move(stack_.back());
    stack_.pop_back();
    return o;
  }
  std::vector<Obj> pop_mark() {
    CS_CHECK(!marks_.empty(), "checkpoint {}: damaged pickle (no MARK at {})", path_, pos_);
    size_t m = marks_.back();
    marks_.pop_back();
    CS_CHECK(m <= stack_.size(), "checkpoint {}: damaged pickle", path_);
    std::vector<Obj> v(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return v;
  }
  Obj dict_of_top() {
    need(1);
    CS_CHECK(stack_.back()->t == PyObj::T::Dict,
             "checkpoint {}: damaged pickle (SETITEM on a non-dict)", path_);
    return stack_.back();
  }
  Obj list_of_top() {
    need(1);
    CS_CHECK(stack_.back()->t == PyObj::T::List,
             "checkpoint {}: damaged pickle (APPEND on a non-list)", path_);
    return stack_.back();
  }
  uint8_t byte() {
    CS_CHECK(pos_ < d_.size(), "checkpoint {}: the pickle ends early (no STOP): damaged", path_);
    return static_cast<uint8_t>(d_[pos_++]);
  }
  std::string bytes(uint64_t n) {
    CS_CHECK(n <= d_.size() - pos_, "checkpoint {}: the pickle ends early: damaged", path_);
    std::string s = d_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  uint32_t u32() {
    std::string b = bytes(4);
    return get<uint32_t>(b, 0);
  }
  uint64_t u64() {
    std::string b = bytes(8);
    return get<uint64_t>(b, 0);
  }
  std::string line() {
    size_t e = d_.find('\n', pos_);
    CS_CHECK(e != std::string::npos && e - pos_ < 256, "checkpoint {}: damaged pickle GLOBAL",
             path_);
    std::string s = d_.substr(pos_, e - pos_);
    pos_ = e + 1;
    return s;
  }
  void memo(uint32_t i) {
    need(1);
    CS_CHECK(i < (1u << 24), "checkpoint {}: damaged pickle (memo index {})", path_, i);
    memo_[i] = stack_.back();
  }
  Obj memo_get(uint32_t i) {
    auto it = memo_.find(i);
    CS_CHECK(it != memo_.end(), "checkpoint {}: damaged pickle (memo {} unset)", path_, i);
    return it->second;
  }
  void push_str(std::string s, PyObj::T t) {
    auto o = mk(t);
    o->s = std::move(s);
    push(o);
  }
  void push_int(int64_t v) {
    auto o = mk(PyObj::T::Int);
    o->i = v;
    push(o);
  }
  void push_long(const std::string& b) {
    CS_CHECK(b.size() <= 8, "checkpoint {}: an integer in the pickle needs more than 64 bits",
             path_);
    uint64_t u = 0;
    for (size_t i = b.size(); i-- > 0;) u = (u << 8) | static_cast<uint8_t>(b[i]);
    if (!b.empty() && b.size() < 8 && (static_cast<uint8_t>(b.back()) & 0x80))
      u |= ~uint64_t{0} << (8 * b.size());  // sign-extend
    push_int(static_cast<int64_t>(u));
  }
  static int64_t as_int(const Obj& o, const std::string& path, const char* what) {
    CS_CHECK(o->t == PyObj::T::Int, "checkpoint {}: damaged tensor record ({} is not an integer)",
             path, what);
    return o->i;
  }
  Shape int_tuple(const Obj& o, const char* what) {
    CS_CHECK(o->t == PyObj::T::Tuple && o->items.size() <= 64,
             "checkpoint {}: damaged tensor record ({} is not a tuple)", path_, what);
    Shape s;
    for (auto& x : o->items) s.push_back(as_int(x, path_, what));
    return s;
  }
  Obj reduce(const Obj& fn, const Obj& args) {
    CS_CHECK(fn->t == PyObj::T::Global, "checkpoint {}: damaged pickle (call of a non-global)",
             path_);
    CS_CHECK(args->t == PyObj::T::Tuple, "checkpoint {}: damaged pickle (arguments of {}.{})",
             path_, fn->s, fn->s2);
    const auto& a = args->items;
    std::string name = fn->s + "." + fn->s2;
    if (name == "collections.OrderedDict" && a.empty()) return mk(PyObj::T::Dict);
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
      CS_CHECK(a.size() >= 4 && a[0]->t == PyObj::T::Storage,
               "checkpoint {}: damaged tensor record", path_);
      auto t = mk(PyObj::T::Tensor);
      t->storage = a[0];
      t->offset = as_int(a[1], path_, "storage offset");
      t->shape = int_tuple(a[2], "size");
      t->stride = int_tuple(a[3], "stride");
      CS_CHECK(t->shape.size() == t->stride.size(),
               "checkpoint {}: damaged tensor record (size and stride differ in length)", path_);
      return t;
    }
    if (name == "torch._utils._rebuild_parameter" ||
        name == "torch._utils._rebuild_parameter_with_state") {
      CS_CHECK(!a.empty() && a[0]->t == PyObj::T::Tensor, "checkpoint {}: damaged parameter record",
               path_);
      return a[0];
    }
    fail(
        "checkpoint {}: unsupported pickled object {}: only tensors, dicts, OrderedDicts, lists, "
        "tuples, numbers, strings and None can be loaded (save a state_dict, not a module)",
        path_, name);
  }
  Obj persistent(const Obj& pid) {
    CS_CHECK(pid->t == PyObj::T::Tuple && pid->items.size() >= 5 &&
                 pid->items[0]->t == PyObj::T::Str && pid->items[0]->s == "storage" &&
                 pid->items[1]->t == PyObj::T::Global && pid->items[2]->t == PyObj::T::Str,
             "checkpoint {}: unsupported persistent reference in the pickle", path_);
    const std::string& key = pid->items[2]->s;
    auto it = storages_.find(key);
    if (it != storages_.end()) return it->second;
    auto s = mk(PyObj::T::Storage);
    s->s = key;
    s->s2 = pid->items[1]->s2;
    s->dtype = dtype_of_storage(s->s2);
    s->numel = as_int(pid->items[4], path_, "storage size");
    CS_CHECK(s->numel >= 0, "checkpoint {}: damaged storage record {}", path_, key);
    storages_.emplace(key, s);
    return s;
  }

  Obj mk(PyObj::T t) {
    auto o = std::make_shared<PyObj>();
    o->t = t;
    all_.push_back(o);
    return o;
  }

  const std::string& d_;
  std::string path_;
  size_t pos_ = 0;
  std::vector<Obj> all_;  // every object made (see the class comment)
  std::vector<Obj> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, Obj> memo_;
  std::map<std::string, Obj> storages_;
};

// ---------------------------------------------------------------------------------------------

class PtReader : public FormatReader {
 public:
  explicit PtReader(const std::string& p) : f_(p), zip_(f_) {
    path = p;
    format = CheckpointFormat::PyTorch;
    std::string pkl;
    for (auto& n : zip_.names()) {
      if (n.size() >= 8 && n.compare(n.size() - 8, 8, "data.pkl") == 0 &&
          std::count(n.begin(), n.end(), '/') == 1) {
        prefix_ = n.substr(0, n.size() - 8);
        pkl = n;
        break;
      }
    }
    CS_CHECK(!pkl.empty(), "checkpoint {}: a zip file without data.pkl is not a torch.save file",
             p);
    if (zip_.has(prefix_ + "byteorder")) {
      std::string bo = zip_.read_all(prefix_ + "byteorder", 64);
      CS_CHECK(bo == "little", "checkpoint {}: byte order '{}' is not supported", p, bo);
    }
    if (zip_.has(prefix_ + "version")) {
      std::string v = zip_.read_all(prefix_ + "version", 64);
      version = std::atoll(v.c_str());
    }
    std::string data = zip_.read_all(pkl, uint64_t{1} << 31);
    Unpickler unpickler(data, p);
    root = convert(unpickler.run(), "", 0);
    link_shared(entries);
  }

  Tensor read(const Entry& e) override {
    const View& v = views_[static_cast<size_t>(e.storage)];
    DType dt = e.info.dtype;
    // A float64 storage is read as its 8-byte values into `wide`, then rounded into the tensor.
    const bool f64 = !e.info.file_dtype.empty();
    size_t item = f64 ? 8 : itemsize(dt);
    const std::string record = prefix_ + "data/" + v.storage->s;
    const ZipEntry& z = zip_.entry(record);
    CS_CHECK(z.usize == static_cast<uint64_t>(v.storage->numel) * item,
             "checkpoint {}: storage {} of tensor '{}' holds {} bytes, expected {}", path,
             v.storage->s, show_key(e.info.key), z.usize, v.storage->numel * item);
    int64_t n = e.info.nbytes / static_cast<int64_t>(itemsize(dt));
    std::vector<char> wide(f64 ? static_cast<size_t>(n) * 8 : 0);
    // Contiguous (row-major, ignoring size-1 dims): one read of exactly the tensor's bytes.
    bool contiguous = true;
    int64_t expect = 1;
    for (size_t i = v.shape.size(); i-- > 0;) {
      if (v.shape[i] != 1 && v.stride[i] != expect) contiguous = false;
      expect *= v.shape[i];
    }
    const uint64_t begin = static_cast<uint64_t>(v.offset) * item;  // within the record
    // The record's CRC-32 is checked on the first read of each storage (a storage under several
    // views is checked once): the bytes outside the view are read for it too.
    const bool check = !checked_.count(v.storage->s);
    bool checked = false;
    const std::string what = fmt::format(" (the storage of tensor '{}')", show_key(e.info.key));
    verified = true;
    Tensor t = make_host_tensor(v.shape, dt, [&](void* tensor_dst) {
      void* dst = f64 ? wide.data() : tensor_dst;
      if (contiguous) {
        const uint64_t len = static_cast<uint64_t>(n) * item;
        zip_.read(record, begin, dst, len);
        if (check) {
          uint32_t crc = crc_span(record, 0, begin, 0);
          crc = crc32(dst, static_cast<size_t>(len), crc);
          crc = crc_span(record, begin + len, z.usize - begin - len, crc);
          zip_.check_crc(record, crc, what);
          checked = true;
        }
      } else {
        // A strided view: read the storage span it touches (the whole record when it is
        // checked), then gather.
        int64_t hi = v.offset;
        for (size_t i = 0; i < v.shape.size(); ++i) hi += (v.shape[i] - 1) * v.stride[i];
        uint64_t from = check ? 0 : begin;
        uint64_t len = check ? z.usize : static_cast<uint64_t>(hi - v.offset + 1) * item;
        std::string span = zip_.read_string(record, from, len);
        if (check) {
          zip_.check_crc(record, crc32(span.data(), span.size()), what);
          checked = true;
        }
        const char* base = span.data() + (begin - from);
        std::vector<int64_t> idx(v.shape.size(), 0);
        char* out = static_cast<char*>(dst);
        for (int64_t k = 0; k < n; ++k) {
          int64_t src = 0;
          for (size_t i = 0; i < idx.size(); ++i) src += idx[i] * v.stride[i];
          std::memcpy(out + k * static_cast<int64_t>(item), base + src * static_cast<int64_t>(item),
                      item);
          for (size_t i = idx.size(); i-- > 0;) {
            if (++idx[i] < v.shape[i]) break;
            idx[i] = 0;
          }
        }
      }
      if (dt == DType::boolean) {
        auto* b = static_cast<uint8_t*>(dst);
        for (int64_t i = 0; i < n; ++i) b[i] = b[i] != 0;
      }
      if (f64) narrow_f64(wide.data(), static_cast<float*>(tensor_dst), n, path, e.info.key);
    });
    if (checked) checked_.insert(v.storage->s);
    return t;
  }

 private:
  struct View {
    Obj storage;
    int64_t offset;
    Shape shape, stride;
  };

  SNode convert(const Obj& o, const std::string& key, int depth) {
    CS_CHECK(depth < kMaxDepth,
             "checkpoint {}: object nested deeper than {} levels (or cyclic) at '{}'", path,
             kMaxDepth, show_key(key));
    // Shared sub-objects are expanded; bound the total so a hostile file cannot blow up. (The
    // memo lets each level refer to the one below twice: 30 levels in under 500 bytes describe
    // 2^30 values. The bound was 2^24, which took seconds and gigabytes to reach.)
    CS_CHECK(++converted_ <= kMaxPickleValues,
             "checkpoint {}: the pickled object has more than {} values (the limit; objects the "
             "pickle shares are counted each time they appear)",
             path, kMaxPickleValues);
    SNode n;
    switch (o->t) {
      case PyObj::T::None:
        n.kind = State::Kind::None;
        break;
      case PyObj::T::Bool:
        n.kind = State::Kind::Bool;
        n.scalar = State(o->b);
        break;
      case PyObj::T::Int:
        n.kind = State::Kind::Int;
        n.scalar = State(o->i);
        break;
      case PyObj::T::Float:
        n.kind = State::Kind::Float;
        n.scalar = State(o->f);
        break;
      case PyObj::T::Str:
        n.kind = State::Kind::String;
        n.scalar = State(o->s);
        break;
      case PyObj::T::List:
      case PyObj::T::Tuple:
        n.kind = State::Kind::List;
        for (size_t i = 0; i < o->items.size(); ++i)
          n.items.push_back(convert(o->items[i], join_key(key, std::to_string(i)), depth + 1));
        break;
      case PyObj::T::Dict: {
        n.kind = State::Kind::Map;
        std::unordered_set<std::string> seen;
        for (auto& [k, v] : o->dict) {
          std::string ks;
          if (k->t == PyObj::T::Str)
            ks = k->s;
          else if (k->t == PyObj::T::Int)  // optimizer state is keyed by parameter index
            ks = std::to_string(k->i);
          else
            fail("checkpoint {}: a dict under '{}' has a key that is not a string or integer", path,
                 show_key(key));
          // A set, not a search of the keys so far: state dicts hold thousands of entries.
          CS_CHECK(seen.insert(ks).second, "checkpoint {}: key '{}' appears twice under '{}'", path,
                   ks, show_key(key));
          n.items.push_back(convert(v, join_key(key, ks), depth + 1));
          n.keys.push_back(std::move(ks));
        }
        break;
      }
      case PyObj::T::Tensor:
        n.kind = State::Kind::Tensor;
        n.tensor = tensor_entry(o, key);
        break;
      case PyObj::T::Bytes:
        fail("checkpoint {}: '{}' holds a bytes object, which cstorch state cannot hold", path,
             show_key(key));
      default:
        fail("checkpoint {}: '{}' holds an unsupported object ({})", path, show_key(key),
             o->t == PyObj::T::Global ? o->s + "." + o->s2 : std::string("a bare storage"));
    }
    return n;
  }

  int64_t tensor_entry(const Obj& o, const std::string& key) {
    const Obj& st = o->storage;
    // float64 is read as f32 (CheckpointTensorInfo::file_dtype); other types are refused.
    const bool f64 = st->s2 == "DoubleStorage";
    CS_CHECK(st->dtype.has_value() || f64,
             "checkpoint {}: tensor '{}' has dtype {}, which cstorch does not read (f32, bf16, "
             "f16, i32, i64, bool, and float64 as f32, are); convert it in PyTorch before saving",
             path, show_key(key), st->s2);
    DType dt = f64 ? DType::f32 : *st->dtype;
    int64_t n = checked_numel(o->shape, path, key);
    if (n > 0) {
      CS_CHECK(o->offset >= 0, "checkpoint {}: tensor '{}' has a negative storage offset", path,
               show_key(key));
      int64_t hi = o->offset;
      for (size_t i = 0; i < o->shape.size(); ++i) {
        CS_CHECK(o->stride[i] >= 0 && o->stride[i] <= (int64_t{1} << 56),
                 "checkpoint {}: tensor '{}' has an unsupported stride", path, show_key(key));
        hi += (o->shape[i] - 1) * o->stride[i];
      }
      CS_CHECK(hi < st->numel,
               "checkpoint {}: tensor '{}' reaches element {} of a storage of {} elements", path,
               show_key(key), hi, st->numel);
    }
    // The same view (or the same Python object) is the same tensor.
    auto [it, fresh] = view_ids_.emplace(std::make_tuple(st.get(), o->offset, o->shape, o->stride),
                                         static_cast<int64_t>(views_.size()));
    if (fresh) views_.push_back({st, o->offset, o->shape, o->stride});
    int64_t id = it->second;
    Entry e;
    e.info.key = key;
    e.info.dtype = dt;
    e.info.shape = o->shape;
    e.info.nbytes = n * static_cast<int64_t>(itemsize(dt));
    if (f64) e.info.file_dtype = "float64";
    e.storage = id;
    entries.push_back(std::move(e));
    return static_cast<int64_t>(entries.size() - 1);
  }

  // Continues `crc` over `n` bytes of `record` from offset `at` (read in blocks).
  uint32_t crc_span(const std::string& record, uint64_t at, uint64_t n, uint32_t crc) {
    std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(n, 4 << 20)));
    while (n > 0) {
      size_t k = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
      zip_.read(record, at, buf.data(), k);
      crc = crc32(buf.data(), k, crc);
      at += k;
      n -= k;
    }
    return crc;
  }

  FileReader f_;
  ZipReader zip_;
  std::set<std::string> checked_;  // storages whose record passed its CRC check
  std::string prefix_;
  std::vector<View> views_;
  std::map<std::tuple<const PyObj*, int64_t, Shape, Shape>, int64_t> view_ids_;
  // Values (containers, scalars, tensors) the state may hold: far above any real checkpoint
  // (a model of 10^4 tensors with its Adam state has about 5 * 10^4), and low enough that
  // refusing a file that shares sub-objects into a larger expansion takes a fraction of a
  // second, even in a sanitizer build.
  static constexpr int64_t kMaxPickleValues = int64_t{1} << 18;
  int64_t converted_ = 0;
};

}  // namespace

std::unique_ptr<FormatReader> open_pt(const std::string& path) {
  return std::make_unique<PtReader>(path);
}

}  // namespace ckpt

void save_pt(const State& state, const std::string& path_arg) {
  using namespace ckpt;
  const std::string path = save_path(path_arg, "save_pt");
  PickleWriter pw(path);
  pw.value(state, "", 0);
  pw.finish();
  AtomicFile out(path);
  {
    ZipWriter zip(out.temp_path(), path);
    zip.add("archive/data.pkl", pw.out.data(), pw.out.size());
    for (auto& s : pw.storages)
      zip.add("archive/data/" + s.key, tensor_bytes(s.t, path, s.key).data(),
              static_cast<uint64_t>(s.t.numel()) * itemsize(s.t.dtype()));
    const char version[] = "3\n";
    zip.add("archive/version", version, 2);
    zip.finish();
  }
  out.commit();
}

}  // namespace cstorch
