// Checkpoint internals shared by the formats (see common.h) and the public entry points that
// are not tied to one format: save/load dispatch, CheckpointReader, info and diff.
#include "checkpoint/common.h"

#include "cstorch/config.h"
#include "ir/device.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <system_error>
#include <thread>

#include <zlib.h>

#include "core/internal.h"
#include "runtime/checkpoint_steps.h"
#include "runtime/run_mode.h"
#include "runtime/trace_context.h"

namespace cstorch {
namespace ckpt {

std::string save_path(const std::string& path, const char* what) {
  runtime::require_checkpoint_step(what);
  std::string resolved = runtime::resolve_model_path(path);
  if (resolved != path) {  // under configure()'s model_dir, which the first save creates
    std::error_code ec;
    std::filesystem::create_directories(runtime::configured_model_dir(), ec);
  }
  return resolved;
}

std::string load_path(const std::string& path) {
  const std::string in_model_dir = runtime::resolve_model_path(path);
  if (in_model_dir == path) return path;
  std::error_code ec;
  if (std::filesystem::exists(in_model_dir, ec)) return in_model_dir;
  CS_CHECK(std::filesystem::exists(path, ec),
           "load {}: no such file in model_dir '{}' (set by cstorch::configure) nor in the "
           "working directory",
           path, runtime::configured_model_dir());
  return path;
}

std::string join_key(const std::string& prefix, const std::string& k) {
  return prefix.empty() ? k : prefix + "." + k;
}

std::string show_key(const std::string& key) {
  return key.empty() ? "<root>" : key;
}

void narrow_f64(const void* src, float* dst, int64_t n, const std::string& path,
                const std::string& key) {
  const auto* b = static_cast<const unsigned char*>(src);
  for (int64_t i = 0; i < n; ++i) {
    double v;
    std::memcpy(&v, b + i * 8, 8);
    // Checked before the conversion, whose result is undefined beyond the float range.
    CS_CHECK(!(std::fabs(v) > std::numeric_limits<float>::max()) || std::isinf(v),
             "checkpoint {}: tensor '{}' is float64 in the file and its element {} ({:g}) is "
             "beyond float32's range (+-3.4e38); cstorch reads float64 tensors as f32",
             path, show_key(key), i, v);
    dst[i] = static_cast<float>(v);
  }
}

Tensor make_host_tensor(const Shape& shape, DType dtype, const std::function<void(void*)>& fill) {
  size_t bytes = static_cast<size_t>(numel(shape)) * itemsize(dtype);
  auto buf = ir::Buffer::alloc(bytes);
  if (bytes) fill(buf->data);
  auto n = detail::make_constant_node(std::move(buf), shape, dtype);
  if (detail::in_trace()) runtime::TraceContext::current()->record(n);
  return make_tensor(n);
}

cstorch::detail::HostBytes tensor_bytes(const Tensor& t, const std::string& path,
                                        const std::string& key) {
  CS_CHECK(t.defined(), "save {}: the tensor at key '{}' is undefined", path, show_key(key));
  return cstorch::detail::host_bytes(t, "save");
}

const void* tensor_identity(const Tensor& t) {
  // Two handles on one node are one tensor (the same parameter registered twice, or a detached
  // view of it): in-place updates of one are seen by the other, so they are stored once.
  return t.impl() ? static_cast<const void*>(t.impl()->node.get()) : nullptr;
}

size_t checksum_parts(size_t n) {
  // Parts of at least 32 MiB, up to 8 threads: a thread's start is then negligible. Test hook:
  // CSTORCH_TEST_CHECKSUM_PART_BYTES sets another part size (small buffers in parts).
  const char* h = std::getenv("CSTORCH_TEST_CHECKSUM_PART_BYTES");
  const size_t part =
      h && std::atoll(h) > 0 ? static_cast<size_t>(std::atoll(h)) : size_t{32} << 20;
  if (n < 2 * part) return 1;
  static const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  return std::min({h ? size_t{8} : threads, size_t{8}, n / part});
}

void run_parts(size_t parts, const std::function<void(size_t)>& f) {
  std::vector<std::thread> others;
  others.reserve(parts > 0 ? parts - 1 : 0);
  try {
    for (size_t i = 1; i < parts; ++i) others.emplace_back(f, i);
  } catch (const std::system_error&) {
    // No more threads: the caller's thread does the parts left.
    for (size_t i = others.size() + 1; i < parts; ++i) f(i);
  }
  if (parts > 0) f(0);
  for (auto& t : others) t.join();
}

uint32_t crc32(const void* data, size_t n, uint32_t crc) {
  auto* p = static_cast<const Bytef*>(data);
  const size_t parts = checksum_parts(n);
  if (parts <= 1) return static_cast<uint32_t>(::crc32_z(crc, p, n));
  // Each part's CRC on its own thread, then combined in order.
  const size_t len = (n / parts + 63) & ~size_t{63};
  std::vector<uLong> part(parts);
  run_parts(parts, [&](size_t i) {
    size_t b = std::min(n, i * len), e = std::min(n, b + len);
    part[i] = ::crc32_z(0, p + b, e - b);
  });
  uLong r = crc;
  for (size_t i = 0; i < parts; ++i) {
    size_t b = std::min(n, i * len), e = std::min(n, b + len);
    r = ::crc32_combine64(r, part[i], static_cast<z_off64_t>(e - b));
  }
  return static_cast<uint32_t>(r);
}

bool valid_utf8(const std::string& s) {
  size_t i = 0, n = s.size();
  auto* p = reinterpret_cast<const unsigned char*>(s.data());
  while (i < n) {
    unsigned c = p[i];
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
      return false;
    i += len;
  }
  return true;
}

std::optional<DType> dtype_from_name(const std::string& name) {
  for (int i = 0; i < kNumDTypes; ++i) {
    auto t = static_cast<DType>(i);
    if (name == dtype_name(t)) return t;
  }
  return std::nullopt;
}

int64_t checked_numel(const Shape& s, const std::string& path, const std::string& key) {
  // Sizes from a file are untrusted: refuse negative dims and element counts whose byte size
  // could overflow (2^56 elements is far beyond any real tensor).
  int64_t n = 1;
  for (auto d : s) {
    CS_CHECK(d >= 0, "checkpoint {}: tensor '{}' has a negative dimension in shape {}", path,
             show_key(key), shape_str(s));
    if (d == 0) return 0;
    CS_CHECK(n <= (int64_t{1} << 56) / d, "checkpoint {}: tensor '{}' has an impossible shape {}",
             path, show_key(key), shape_str(s));
    n *= d;
  }
  return n;
}

void link_shared(std::vector<Entry>& entries) {
  std::map<int64_t, std::string> first;
  for (auto& e : entries) {
    auto [it, fresh] = first.emplace(e.storage, e.info.key);
    if (!fresh) e.info.shared_with = it->second;
  }
}

// ---------------------------------------------------------------------------------------------
// JSON structure description.

namespace {
Json encode_rec(const State& s, const std::string& key, const std::string& path, int depth,
                const std::function<Json(const std::string&, const Tensor&)>& on_tensor) {
  CS_CHECK(depth < kMaxDepth, "save {}: state nested deeper than {} levels at '{}'", path,
           kMaxDepth, show_key(key));
  switch (s.kind()) {
    case State::Kind::None:
      return Json{{"kind", "none"}};
    case State::Kind::Bool:
      return Json{{"kind", "bool"}, {"value", s.as_bool()}};
    case State::Kind::Int:
      return Json{{"kind", "int"}, {"value", s.as_int()}};
    case State::Kind::Float: {
      double v = s.as_double();
      Json j{{"kind", "float"}};
      if (std::isnan(v))
        j["value"] = "nan";
      else if (std::isinf(v))
        j["value"] = v > 0 ? "inf" : "-inf";
      else
        j["value"] = v;
      return j;
    }
    case State::Kind::String:
      CS_CHECK(valid_utf8(s.as_string()), "save {}: the string at key '{}' is not valid UTF-8",
               path, show_key(key));
      return Json{{"kind", "string"}, {"value", s.as_string()}};
    case State::Kind::Tensor:
      return on_tensor(key, s.as_tensor());
    case State::Kind::List: {
      Json items = Json::array();
      for (size_t i = 0; i < s.size(); ++i)
        items.push_back(
            encode_rec(s[i], join_key(key, std::to_string(i)), path, depth + 1, on_tensor));
      return Json{{"kind", "list"}, {"items", std::move(items)}};
    }
    case State::Kind::Map: {
      Json keys = Json::array(), values = Json::array();
      const auto& ks = s.keys();
      const auto& vs = s.items();
      for (size_t i = 0; i < ks.size(); ++i) {
        CS_CHECK(valid_utf8(ks[i]), "save {}: a key under '{}' is not valid UTF-8", path,
                 show_key(key));
        keys.push_back(ks[i]);
        values.push_back(encode_rec(vs[i], join_key(key, ks[i]), path, depth + 1, on_tensor));
      }
      return Json{{"kind", "map"}, {"keys", std::move(keys)}, {"values", std::move(values)}};
    }
  }
  fail("save {}: unknown state kind at '{}'", path, show_key(key));
}

[[noreturn]] void bad_structure(const std::string& path, const std::string& key,
                                const std::string& what) {
  fail("checkpoint {}: damaged structure description at '{}': {}", path, show_key(key), what);
}

const Json& field(const Json& j, const char* name, const std::string& path,
                  const std::string& key) {
  auto it = j.find(name);
  if (it == j.end()) bad_structure(path, key, fmt::format("missing field \"{}\"", name));
  return *it;
}

SNode decode_rec(const Json& j, const std::string& key, const std::string& path, int depth,
                 const std::function<int64_t(const std::string&, const Json&)>& on_tensor) {
  if (depth >= kMaxDepth) bad_structure(path, key, "nested too deeply");
  if (!j.is_object()) bad_structure(path, key, "expected an object");
  const Json& kj = field(j, "kind", path, key);
  if (!kj.is_string()) bad_structure(path, key, "\"kind\" is not a string");
  const std::string& kind = kj.get_ref<const std::string&>();
  SNode n;
  if (kind == "none") {
    n.kind = State::Kind::None;
  } else if (kind == "bool") {
    const Json& v = field(j, "value", path, key);
    if (!v.is_boolean()) bad_structure(path, key, "bool value is not a boolean");
    n.kind = State::Kind::Bool;
    n.scalar = State(v.get<bool>());
  } else if (kind == "int") {
    const Json& v = field(j, "value", path, key);
    if (!v.is_number_integer()) bad_structure(path, key, "int value is not an integer");
    if (v.is_number_unsigned() &&
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad_structure(path, key, "int value does not fit 64 bits");
    n.kind = State::Kind::Int;
    n.scalar = State(v.get<int64_t>());
  } else if (kind == "float") {
    const Json& v = field(j, "value", path, key);
    double x;
    if (v.is_number()) {
      x = v.get<double>();
    } else if (v == "nan") {
      x = std::numeric_limits<double>::quiet_NaN();
    } else if (v == "inf") {
      x = std::numeric_limits<double>::infinity();
    } else if (v == "-inf") {
      x = -std::numeric_limits<double>::infinity();
    } else {
      bad_structure(path, key, "float value is not a number, \"nan\", \"inf\" or \"-inf\"");
    }
    n.kind = State::Kind::Float;
    n.scalar = State(x);
  } else if (kind == "string") {
    const Json& v = field(j, "value", path, key);
    if (!v.is_string()) bad_structure(path, key, "string value is not a string");
    n.kind = State::Kind::String;
    n.scalar = State(v.get<std::string>());
  } else if (kind == "tensor") {
    n.kind = State::Kind::Tensor;
    n.tensor = on_tensor(key, j);
  } else if (kind == "list") {
    const Json& items = field(j, "items", path, key);
    if (!items.is_array()) bad_structure(path, key, "list items are not an array");
    n.kind = State::Kind::List;
    for (size_t i = 0; i < items.size(); ++i)
      n.items.push_back(
          decode_rec(items[i], join_key(key, std::to_string(i)), path, depth + 1, on_tensor));
  } else if (kind == "map") {
    const Json& keys = field(j, "keys", path, key);
    const Json& values = field(j, "values", path, key);
    if (!keys.is_array() || !values.is_array() || keys.size() != values.size())
      bad_structure(path, key, "map keys and values are not arrays of equal length");
    n.kind = State::Kind::Map;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!keys[i].is_string()) bad_structure(path, key, "a map key is not a string");
      std::string k = keys[i].get<std::string>();
      if (std::find(n.keys.begin(), n.keys.end(), k) != n.keys.end())
        bad_structure(path, key, fmt::format("map key '{}' appears twice", k));
      n.items.push_back(decode_rec(values[i], join_key(key, k), path, depth + 1, on_tensor));
      n.keys.push_back(std::move(k));
    }
  } else {
    bad_structure(path, key, fmt::format("unknown kind \"{}\"", kind));
  }
  return n;
}
}  // namespace

Json encode_structure(const State& s, const std::string& path,
                      const std::function<Json(const std::string&, const Tensor&)>& on_tensor) {
  return encode_rec(s, "", path, 0, on_tensor);
}

SNode decode_structure(const Json& j, const std::string& path,
                       const std::function<int64_t(const std::string&, const Json&)>& on_tensor) {
  return decode_rec(j, "", path, 0, on_tensor);
}

Json parse_json(const std::string& text, const std::string& path, const char* what) {
  try {
    // The parser recurses per nesting level: refuse deep nesting before it can exhaust the stack.
    return Json::parse(text, [](int depth, Json::parse_event_t, Json&) {
      if (depth > 2 * kMaxDepth) throw std::length_error("nested too deeply");
      return true;
    });
  } catch (const std::exception& e) {
    fail("checkpoint {}: the {} is not valid JSON ({})", path, what, e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// Files.

namespace {
std::string errno_text() {
  return std::strerror(errno);
}
std::atomic<uint64_t> g_temp_counter{0};
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  namespace fs = std::filesystem;
  fs::path p(path_);
  CS_CHECK(!p.filename().empty(), "save {}: not a file path", path_);
  fs::path dir = p.parent_path();
  std::error_code ec;
  if (!dir.empty()) {
    CS_CHECK(fs::is_directory(dir, ec), "save {}: the folder {} does not exist", path_,
             dir.string());
  }
  CS_CHECK(!fs::is_directory(p, ec), "save {}: the path is a folder", path_);
  // Same folder as the target, so the final rename is atomic (one file system).
  tmp_ = (dir / ("." + p.filename().string() + ".tmp-" + std::to_string(::getpid()) + "-" +
                 std::to_string(g_temp_counter++)))
             .string();
}

AtomicFile::~AtomicFile() {
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::commit() {
  int fd = ::open(tmp_.c_str(), O_RDONLY | O_CLOEXEC);
  CS_CHECK(fd >= 0, "save {}: cannot reopen the temporary file {}: {}", path_, tmp_, errno_text());
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  CS_CHECK(rc == 0, "save {}: fsync failed: {}", path_, std::strerror(err));
  // A file saved over keeps its permission bits (a checkpoint made private stays so), as an
  // in-place write (torch.save) would; the temporary file has the default ones.
  struct stat old_st {};
  if (::stat(path_.c_str(), &old_st) == 0 && S_ISREG(old_st.st_mode))
    ::chmod(tmp_.c_str(), old_st.st_mode & 07777);
  CS_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "save {}: cannot rename {} to it: {}", path_,
           tmp_, errno_text());
  committed_ = true;
  // The rename itself is durable only once the folder is synced.
  std::string dir = std::filesystem::path(path_).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

FileWriter::FileWriter(const std::string& path, const std::string& shown_path)
    : shown_(shown_path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CS_CHECK(fd_ >= 0, "save {}: cannot create {}: {}", shown_, path, errno_text());
  buf_.reserve(1 << 20);
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void FileWriter::flush() {
  const char* p = buf_.data();
  size_t n = buf_.size();
  while (n > 0) {
    ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    CS_CHECK(w > 0, "save {}: write failed: {}", shown_, errno_text());
    p += w;
    n -= static_cast<size_t>(w);
  }
  buf_.clear();
}

void FileWriter::write(const void* data, size_t n) {
  offset_ += n;
  if (buf_.size() + n <= buf_.capacity()) {
    buf_.insert(buf_.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
    return;
  }
  flush();
  if (n < buf_.capacity()) {
    buf_.insert(buf_.end(), static_cast<const char*>(data), static_cast<const char*>(data) + n);
    return;
  }
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    CS_CHECK(w > 0, "save {}: write failed: {}", shown_, errno_text());
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void FileWriter::write_at(uint64_t offset, const void* data, size_t n) {
  CS_CHECK(offset <= offset_ && n <= offset_ - offset, "save {}: rewrite past the end", shown_);
  flush();
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::pwrite(fd_, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    CS_CHECK(w > 0, "save {}: write failed: {}", shown_, errno_text());
    p += w;
    offset += static_cast<uint64_t>(w);
    n -= static_cast<size_t>(w);
  }
}

void FileWriter::close() {
  flush();
  int rc = ::close(fd_);
  fd_ = -1;
  CS_CHECK(rc == 0, "save {}: close failed: {}", shown_, errno_text());
}

FileReader::FileReader(const std::string& path) : path_(path) {
  fd_ =
      ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO is refused, not waited on
  CS_CHECK(fd_ >= 0, "cannot open checkpoint {}: {}", path, errno_text());
  struct stat st;
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail("cannot open checkpoint {}: not a regular file", path);
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

FileReader::~FileReader() {
  if (fd_ >= 0) ::close(fd_);
}

void FileReader::read(uint64_t offset, void* dst, size_t n, const char* what) const {
  CS_CHECK(offset <= size_ && n <= size_ - offset,
           "checkpoint {}: {} (bytes {}..{}) lies past the end of the file ({} bytes): the file "
           "is truncated or damaged",
           path_, what, offset, offset + n, size_);
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    ssize_t r = ::pread(fd_, p, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    CS_CHECK(r > 0, "checkpoint {}: reading {} failed: {}", path_, what,
             r == 0 ? "unexpected end of file" : errno_text());
    p += r;
    offset += static_cast<uint64_t>(r);
    n -= static_cast<size_t>(r);
  }
}

std::string FileReader::read_string(uint64_t offset, size_t n, const char* what) const {
  CS_CHECK(offset <= size_ && n <= size_ - offset,
           "checkpoint {}: {} (bytes {}..{}) lies past the end of the file ({} bytes): the file "
           "is truncated or damaged",
           path_, what, offset, offset + n, size_);
  std::string s(n, '\0');
  read(offset, s.data(), n, what);
  return s;
}

void maybe_pause_save(const std::string& temp_path) {
  const char* signal = std::getenv("CSTORCH_TEST_PAUSE_SAVE");
  if (!signal || !*signal) return;
  std::string tmp = std::string(signal) + ".tmp";
  if (FILE* f = std::fopen(tmp.c_str(), "w")) {
    std::fputs(temp_path.c_str(), f);
    std::fclose(f);
    std::rename(tmp.c_str(), signal);
  }
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // until killed
}

// ---------------------------------------------------------------------------------------------
// Loading.

// Tensors are read into host memory and then moved to `map_location` (CSX weights live in host
// memory on this implementation, as CPU tensors). A device this build or process lacks is an
// error before anything is read.
void check_map_location(const std::optional<Device>& d, const std::string& path) {
  if (!d) return;
  try {
    ir::device_backend(*d);
  } catch (const Error& e) {
    fail("load {}: map_location {}: {}", path, device_str(*d), e.what());
  }
}

namespace {
Tensor place(const Tensor& t, const std::optional<Device>& d) {
  return d ? t.to(*d) : t;
}
}  // namespace

namespace {
State materialize_rec(FormatReader& r, const SNode& n, std::map<int64_t, Tensor>& cache,
                      const std::optional<Device>& d) {
  switch (n.kind) {
    case State::Kind::Tensor: {
      const Entry& e = r.entries[static_cast<size_t>(n.tensor)];
      auto it = cache.find(e.storage);
      if (it != cache.end()) return State(it->second);
      Tensor t = place(r.read(e), d);
      cache.emplace(e.storage, t);
      return State(t);
    }
    case State::Kind::List: {
      State s = State::list();
      for (auto& c : n.items) s.push_back(materialize_rec(r, c, cache, d));
      return s;
    }
    case State::Kind::Map: {
      State s = State::map();
      for (size_t i = 0; i < n.keys.size(); ++i)
        s.set(n.keys[i], materialize_rec(r, n.items[i], cache, d));
      return s;
    }
    default:
      return n.scalar;
  }
}
}  // namespace

State materialize(FormatReader& r, std::optional<Device> map_location) {
  check_map_location(map_location, r.path);
  std::map<int64_t, Tensor> cache;
  return materialize_rec(r, r.root, cache, map_location);
}

std::unique_ptr<FormatReader> open_any(const std::string& path, bool lazy) {
  switch (detect_checkpoint_format(path)) {
    case CheckpointFormat::HDF5:
      return open_hdf5(path, lazy);
    case CheckpointFormat::PyTorch:
      return open_pt(path);
    case CheckpointFormat::SafeTensors:
      return open_safetensors(path);
  }
  fail("load {}: unknown format", path);
}

}  // namespace ckpt

// Beside AtomicFile (ckpt), whose temporary names it recognises.
int remove_stale_checkpoint_temp_files(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<fs::path> stale;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    // AtomicFile's temporary names: "." NAME ".tmp-" PID "-" N.
    const std::string name = it->path().filename().string();
    const size_t t = name.rfind(".tmp-");
    if (name.empty() || name[0] != '.' || t == std::string::npos || t < 2) continue;
    const std::string rest = name.substr(t + 5);
    const size_t dash = rest.find('-');
    auto digits = [](const std::string& d) {
      return !d.empty() && d.size() <= 18 &&
             std::all_of(d.begin(), d.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (dash == std::string::npos || !digits(rest.substr(0, dash)) ||
        !digits(rest.substr(dash + 1)))
      continue;
    const long long pid = std::stoll(rest.substr(0, dash));
    if (pid <= 0 || pid > std::numeric_limits<pid_t>::max()) continue;
    // The writer still runs (or runs as another user): its file is in use.
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code fec;
    if (it->is_regular_file(fec)) stale.push_back(it->path());
  }
  int removed = 0;
  for (const auto& p : stale) {
    std::error_code rec;
    if (fs::remove(p, rec)) ++removed;
  }
  return removed;
}

// ---------------------------------------------------------------------------------------------
// Public entry points.

const char* checkpoint_format_name(CheckpointFormat f) {
  switch (f) {
    case CheckpointFormat::HDF5:
      return "hdf5";
    case CheckpointFormat::PyTorch:
      return "pytorch";
    case CheckpointFormat::SafeTensors:
      return "safetensors";
  }
  return "?";
}

namespace {
std::string extension_of(const std::string& path) {
  return ascii_lower(std::filesystem::path(path).extension().string());
}
// The format `path`'s extension names, if it names one.
std::optional<CheckpointFormat> format_named_by(const std::string& path) {
  const std::string ext = extension_of(path);
  if (ext == ".pt" || ext == ".pth") return CheckpointFormat::PyTorch;
  if (ext == ".safetensors") return CheckpointFormat::SafeTensors;
  if (ext == ".mdl" || ext == ".h5" || ext == ".hdf5") return CheckpointFormat::HDF5;
  return std::nullopt;
}
}  // namespace

CheckpointFormat checkpoint_format_for_path(const std::string& path) {
  return format_named_by(path).value_or(CheckpointFormat::HDF5);
}

CheckpointFormat detect_checkpoint_format(const std::string& path) {
  ckpt::FileReader f(path);
  unsigned char head[9] = {};
  size_t n = static_cast<size_t>(std::min<uint64_t>(f.size(), 9));
  f.read(0, head, n, "the file header");
  static const unsigned char kHdf5[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
  if (n >= 8 && std::memcmp(head, kHdf5, 8) == 0) return CheckpointFormat::HDF5;
  if (n >= 4 && head[0] == 'P' && head[1] == 'K' && head[2] == 3 && head[3] == 4)
    return CheckpointFormat::PyTorch;
  if (n >= 9 && head[8] == '{') return CheckpointFormat::SafeTensors;
  if (n >= 2 && head[0] == 0x80 && head[1] <= 5)
    fail(
        "load {}: this is a legacy (pre-1.6, non-zip) torch.save file, which is not supported: "
        "re-save it with torch.save(obj, path) from PyTorch 1.6 or newer",
        path);
  if (n == 0) fail("load {}: the file is empty (partially written or damaged)", path);
  fail("load {}: not a checkpoint (neither HDF5, a PyTorch zip file nor safetensors)", path);
}

void save(const State& state, const std::string& path_arg) {
  // Inside a step's body, the save would run once, when the step is traced (the replays run the
  // compiled program only), and write the weights as they were before the first step.
  CS_CHECK(!detail::in_trace(),
           "save {}: called inside a traced step, where it would run once, when the step is "
           "traced; save from a step closure or a checkpoint closure, or between steps",
           path_arg);
  const std::string path = ckpt::save_path(path_arg, "cstorch::save");
  switch (checkpoint_format_for_path(path)) {
    case CheckpointFormat::HDF5:
      return save_hdf5(state, path);
    case CheckpointFormat::PyTorch:
      return save_pt(state, path);
    case CheckpointFormat::SafeTensors:
      return save_safetensors(state, path);
  }
}

State load(const std::string& path_arg, std::optional<Device> map_location) {
  const std::string path = ckpt::load_path(path_arg);
  ckpt::check_map_location(map_location, path);
  auto r = ckpt::open_any(path);
  return ckpt::materialize(*r, map_location);
}

State load_hdf5(const std::string& path_arg, std::optional<Device> map_location) {
  const std::string path = ckpt::load_path(path_arg);
  ckpt::check_map_location(map_location, path);
  auto r = ckpt::open_hdf5(path);
  return ckpt::materialize(*r, map_location);
}

State load_pt(const std::string& path_arg, std::optional<Device> map_location) {
  const std::string path = ckpt::load_path(path_arg);
  ckpt::check_map_location(map_location, path);
  auto r = ckpt::open_pt(path);
  return ckpt::materialize(*r, map_location);
}

State load_safetensors(const std::string& path_arg, std::optional<Device> map_location) {
  const std::string path = ckpt::load_path(path_arg);
  ckpt::check_map_location(map_location, path);
  auto r = ckpt::open_safetensors(path);
  return ckpt::materialize(*r, map_location);
}

void convert_checkpoint(const std::string& in, const std::string& out) {
  namespace fs = std::filesystem;
  CS_CHECK(!in.empty(), "convert: the input path is empty");
  CS_CHECK(!out.empty(), "convert: the output path is empty");
  // save() writes HDF5 for any other name; asked for a conversion, a name whose extension names
  // no format (pytorch_model.bin, x.ckpt) is more likely a mistake than a wish for HDF5.
  CS_CHECK(format_named_by(out).has_value(),
           "checkpoint convert: cannot tell the output format from '{}' (extension '{}'): name it "
           ".mdl or .h5 (HDF5), .pt or .pth (PyTorch's torch.save format, which Hugging Face names "
           ".bin), or .safetensors",
           out, extension_of(out));
  // The same file however it is written (./a.pt and a.pt, a link to it).
  std::error_code e1, e2, e3;
  const fs::path a = fs::weakly_canonical(in, e1), b = fs::weakly_canonical(out, e2);
  const bool same = fs::equivalent(in, out, e3) || (!e1 && !e2 && a == b);
  CS_CHECK(!same, "convert: input and output are the same file ({})", in);
  save(load(in), out);
}

// ---------------------------------------------------------------------------------------------
// CheckpointReader.

struct CheckpointReader::Impl {
  std::unique_ptr<ckpt::FormatReader> r;
  std::map<std::string, size_t> index;
  std::vector<CheckpointTensorInfo> infos;
  bool indexed = false;
  // The structure is read on first need: reading one tensor of an HDF5 file does not need it.
  Impl& ensure() {
    if (indexed) return *this;
    r->load_structure();
    for (size_t i = 0; i < r->entries.size(); ++i) index.emplace(r->entries[i].info.key, i);
    for (auto& e : r->entries) infos.push_back(e.info);
    indexed = true;
    return *this;
  }
};

CheckpointReader::CheckpointReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->r = ckpt::open_any(path, /*lazy=*/true);
}
CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

const std::string& CheckpointReader::path() const {
  return impl_->r->path;
}
CheckpointFormat CheckpointReader::format() const {
  return impl_->r->format;
}
int64_t CheckpointReader::format_version() const {
  return impl_->r->version;
}

const std::vector<CheckpointTensorInfo>& CheckpointReader::tensors() const {
  return impl_->ensure().infos;
}

bool CheckpointReader::contains(const std::string& key) const {
  return impl_->ensure().index.count(key) > 0;
}

const CheckpointTensorInfo& CheckpointReader::info(const std::string& key) const {
  impl_->ensure();
  auto it = impl_->index.find(key);
  if (it == impl_->index.end()) {
    // Name a few keys that share the longest prefix, so a typo is easy to see.
    std::vector<std::string> near;
    std::string prefix = key.substr(0, key.rfind('.') == std::string::npos ? 0 : key.rfind('.'));
    for (auto& [k, i] : impl_->index)
      if (near.size() < 8 && (prefix.empty() || k.rfind(prefix, 0) == 0)) near.push_back(k);
    fail("checkpoint {}: no tensor '{}' ({} tensors{}{})", impl_->r->path, key, impl_->index.size(),
         near.empty() ? "" : "; e.g. ", fmt::join(near, ", "));
  }
  return impl_->r->entries[it->second].info;
}

Tensor CheckpointReader::read(const std::string& key, std::optional<Device> map_location) const {
  ckpt::check_map_location(map_location, impl_->r->path);
  if (!impl_->indexed)
    if (auto t = impl_->r->read_direct(key)) return ckpt::place(*t, map_location);
  info(key);  // error for an unknown key
  return ckpt::place(impl_->r->read(impl_->r->entries[impl_->index.at(key)]), map_location);
}

State CheckpointReader::read_all(std::optional<Device> map_location) const {
  impl_->ensure();
  return ckpt::materialize(*impl_->r, map_location);
}

// ---------------------------------------------------------------------------------------------
// info and diff.

namespace {
std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} {}", b, units[u]) : fmt::format("{:.2f} {}", b, units[u]);
}

// Flattened leaves of a skeleton: key -> node.
void leaves(const ckpt::SNode& n, const std::string& key,
            std::vector<std::pair<std::string, const ckpt::SNode*>>& out) {
  if (n.kind == State::Kind::List) {
    for (size_t i = 0; i < n.items.size(); ++i)
      leaves(n.items[i], ckpt::join_key(key, std::to_string(i)), out);
  } else if (n.kind == State::Kind::Map) {
    for (size_t i = 0; i < n.items.size(); ++i)
      leaves(n.items[i], ckpt::join_key(key, n.keys[i]), out);
  } else {
    out.emplace_back(key, &n);
  }
}

std::vector<double> as_doubles(const Tensor& t) {
  const auto bytes = cstorch::detail::host_bytes(t, "checkpoint diff");
  const void* p = bytes.data();
  size_t n = static_cast<size_t>(t.numel());
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (t.dtype()) {
      case DType::f32:
        v[i] = static_cast<const float*>(p)[i];
        break;
      case DType::bf16:
        v[i] = static_cast<float>(static_cast<const bf16_t*>(p)[i]);
        break;
      case DType::f16:
        v[i] = static_cast<float>(static_cast<const f16_t*>(p)[i]);
        break;
      case DType::i32:
        v[i] = static_cast<const int32_t*>(p)[i];
        break;
      case DType::i64:
        v[i] = static_cast<double>(static_cast<const int64_t*>(p)[i]);
        break;
      case DType::boolean:
        v[i] = static_cast<const uint8_t*>(p)[i];
        break;
    }
  }
  return v;
}
}  // namespace

std::string checkpoint_info(const std::string& path) {
  auto r = ckpt::open_any(path);
  std::string out =
      fmt::format("checkpoint: {}\nformat: {}", path, checkpoint_format_name(r->format));
  if (r->format != CheckpointFormat::SafeTensors) out += fmt::format(" (version {})", r->version);
  out += "\n";
  std::vector<std::pair<std::string, const ckpt::SNode*>> ls;
  leaves(r->root, "", ls);
  int64_t unique_total = 0, shared = 0;
  size_t width = 4;
  for (auto& [k, n] : ls) width = std::max(width, ckpt::show_key(k).size());
  width = std::min<size_t>(width, 80);
  std::string lines;
  for (auto& [k, n] : ls) {
    if (n->kind == State::Kind::Tensor) {
      const auto& e = r->entries[static_cast<size_t>(n->tensor)];
      if (e.info.shared_with.empty())
        unique_total += e.info.nbytes;
      else
        ++shared;
      lines += fmt::format(
          "  {:<{}}  {:<4}  {:<18}  {:>10}{}{}\n", ckpt::show_key(k), width,
          dtype_name(e.info.dtype), shape_str(e.info.shape),
          human_bytes(static_cast<double>(e.info.nbytes)),
          e.info.shared_with.empty() ? "" : fmt::format("  (shared with {})", e.info.shared_with),
          e.info.file_dtype.empty() ? ""
                                    : fmt::format("  ({} in the file, read as {})",
                                                  e.info.file_dtype, dtype_name(e.info.dtype)));
    } else {
      lines += fmt::format("  {:<{}}  {:<4}  {}\n", ckpt::show_key(k), width, kind_name(n->kind),
                           n->scalar.repr());
    }
  }
  out += fmt::format("tensors: {} ({} shared), {} stored ({} bytes)\n", r->entries.size(), shared,
                     human_bytes(static_cast<double>(unique_total)), unique_total);
  out += fmt::format("values: {}\n", ls.size() - r->entries.size());
  out += lines;
  return out;
}

CheckpointVerification verify_checkpoint(const std::string& path) {
  auto r = ckpt::open_any(path);
  CheckpointVerification v;
  // Each storage is read once; its keys share the outcome.
  struct Outcome {
    std::string error;
    bool verified = false;
  };
  std::map<int64_t, Outcome> done;
  const std::string prefix = fmt::format("checkpoint {}: ", path);
  for (const auto& e : r->entries) {
    auto it = done.find(e.storage);
    if (it == done.end()) {
      Outcome o;
      try {
        r->verified = false;
        (void)r->read(e);
        o.verified = r->verified;
      } catch (const Error& err) {
        o.error = err.what();
        if (o.error.rfind(prefix, 0) == 0) o.error = o.error.substr(prefix.size());
      }
      it = done.emplace(e.storage, std::move(o)).first;
    }
    ++v.tensors;
    if (!it->second.error.empty())
      v.damaged.push_back({e.info.key, it->second.error});
    else if (!it->second.verified)
      ++v.unchecked;
  }
  return v;
}

std::string format_checkpoint_verification(const CheckpointVerification& v) {
  std::string out;
  for (const auto& d : v.damaged)
    out += fmt::format("damaged: {}: {}\n", ckpt::show_key(d.key), d.reason);
  const char* noun = v.tensors == 1 ? "tensor" : "tensors";
  if (v.intact())
    out += fmt::format("{} {} verified, all intact", v.tensors, noun);
  else
    out += fmt::format("{} {} verified, {} damaged", v.tensors, noun, v.damaged.size());
  if (v.unchecked > 0)
    out += fmt::format(
        " ({} without a stored checksum: read, but their values could not be "
        "checked)",
        v.unchecked);
  return out + "\n";
}

bool CheckpointDiff::identical() const {
  if (!only_in_a.empty() || !only_in_b.empty()) return false;
  for (auto& e : common)
    if (!e.note.empty() || e.max_abs_diff != 0) return false;
  return true;
}

CheckpointDiff checkpoint_diff(const std::string& a, const std::string& b) {
  auto ra = ckpt::open_any(a);
  auto rb = ckpt::open_any(b);
  std::vector<std::pair<std::string, const ckpt::SNode*>> la, lb;
  leaves(ra->root, "", la);
  leaves(rb->root, "", lb);
  std::map<std::string, const ckpt::SNode*> mb(lb.begin(), lb.end());
  std::map<std::string, const ckpt::SNode*> ma(la.begin(), la.end());
  CheckpointDiff d;
  for (auto& [k, na] : la) {
    auto it = mb.find(k);
    if (it == mb.end()) {
      d.only_in_a.push_back(k);
      continue;
    }
    const ckpt::SNode* nb = it->second;
    CheckpointDiff::Entry e{k, "", 0};
    if (na->kind != nb->kind) {
      e.note = fmt::format("kind {} vs {}", kind_name(na->kind), kind_name(nb->kind));
    } else if (na->kind == State::Kind::Tensor) {
      const auto& ea = ra->entries[static_cast<size_t>(na->tensor)];
      const auto& eb = rb->entries[static_cast<size_t>(nb->tensor)];
      if (ea.info.dtype != eb.info.dtype) {
        e.note =
            fmt::format("dtype {} vs {}", dtype_name(ea.info.dtype), dtype_name(eb.info.dtype));
      } else if (ea.info.shape != eb.info.shape) {
        e.note = fmt::format("shape {} vs {}", shape_str(ea.info.shape), shape_str(eb.info.shape));
      } else {
        auto va = as_doubles(ra->read(ea));
        auto vb = as_doubles(rb->read(eb));
        for (size_t i = 0; i < va.size(); ++i) {
          double x = std::abs(va[i] - vb[i]);
          if (std::isnan(va[i]) != std::isnan(vb[i]) || (std::isinf(va[i]) && va[i] != vb[i]))
            x = std::numeric_limits<double>::infinity();
          else if (std::isnan(x))
            x = 0;  // both NaN, or equal infinities
          e.max_abs_diff = std::max(e.max_abs_diff, x);
        }
      }
    } else if (!(na->scalar == nb->scalar)) {
      e.note = fmt::format("value {} vs {}", na->scalar.repr(), nb->scalar.repr());
    }
    d.common.push_back(std::move(e));
  }
  for (auto& [k, n] : lb)
    if (!ma.count(k)) d.only_in_b.push_back(k);
  return d;
}

std::string format_checkpoint_diff(const CheckpointDiff& d) {
  std::string out;
  for (auto& k : d.only_in_a) out += fmt::format("only in A: {}\n", ckpt::show_key(k));
  for (auto& k : d.only_in_b) out += fmt::format("only in B: {}\n", ckpt::show_key(k));
  size_t differing = 0;
  double worst = 0;
  for (auto& e : d.common) {
    if (!e.note.empty()) {
      out += fmt::format("differs:   {}: {}\n", ckpt::show_key(e.key), e.note);
      ++differing;
    } else if (e.max_abs_diff != 0) {
      out += fmt::format("differs:   {}: max abs diff {:.6g}\n", ckpt::show_key(e.key),
                         e.max_abs_diff);
      ++differing;
    }
    worst = std::max(worst, e.max_abs_diff);
  }
  out += fmt::format(
      "{} common entries, {} differ (max abs diff {:.6g}), {} only in A, {} only in B: {}\n",
      d.common.size(), differing, worst, d.only_in_a.size(), d.only_in_b.size(),
      d.identical() ? "identical" : "different");
  return out;
}

}  // namespace cstorch
