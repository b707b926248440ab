// MNIST IDX reading/writing, split loading, and the deterministic synthetic-digits generator (pen
// strokes per digit, random affine per sample, anti-aliased distance-field rendering).
#include "cstorch/data/mnist.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/splitmix.h"
#include "cstorch/core/error.h"

// The generator promises identical bytes on every machine. Fused multiply-adds (which GCC emits
// by default under -march=native on FMA hardware, and not elsewhere) round differently from a
// separate multiply and add, so contraction is disabled for everything below. The includes stay
// above so library code keeps its own flags.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace cstorch::data {

// ----------------------------------------------------------------------------------------------
// IDX files

namespace {

constexpr uint8_t kTypeU8 = 0x08;
constexpr int kMaxRank = 4;
constexpr int64_t kMaxDim = int64_t{1} << 31;    // a dimension this large is a corrupt header
constexpr int64_t kMaxBytes = int64_t{1} << 40;  // 1 TiB: no real IDX file is larger

const char* idx_type_name(uint8_t t) {
  switch (t) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return "not an IDX type";
  }
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
  return s;
}

// Closes a file descriptor on scope exit (error paths throw).
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// An IDX file's bytes, read in order: the file itself, or what it decompresses to when it is
// gzip-compressed (the MNIST site ships *.gz files). zlib reads both; `size` is the file's size
// for a plain file, -1 for a compressed one (its data size is known only by reading it).
class IdxSource {
 public:
  explicit IdxSource(const std::string& path) : path_(path) {
    Fd f;
    f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO: refused below
    if (f.fd < 0) fail("read_idx: cannot open '{}': {}", path, std::strerror(errno));
    struct stat st {};
    if (::fstat(f.fd, &st) != 0)
      fail("read_idx: '{}': stat failed: {}", path, std::strerror(errno));
    if (!S_ISREG(st.st_mode)) fail("read_idx: '{}' is not a regular file", path);
    gz_ = gzdopen(f.fd, "rb");
    if (!gz_) fail("read_idx: '{}': cannot read it: out of memory", path);
    f.fd = -1;  // gz_ owns it now
    gzbuffer(gz_, 1 << 16);
    // zlib knows whether the file is compressed only after its first read.
    const int c = gzgetc(gz_);
    if (c >= 0) gzungetc(c, gz_);
    size_ = gzdirect(gz_) ? static_cast<int64_t>(st.st_size) : -1;
  }
  ~IdxSource() { gzclose(gz_); }
  IdxSource(const IdxSource&) = delete;
  IdxSource& operator=(const IdxSource&) = delete;

  int64_t size() const { return size_; }
  bool compressed() const { return size_ < 0; }
  // zlib's message without the "<fd:N>: " it puts before it (the file is named already).
  std::string zlib_error() const {
    int err = 0;
    const char* msg = gzerror(gz_, &err);
    if (err == Z_ERRNO) return std::strerror(errno);
    std::string m = msg ? msg : "unknown error";
    if (m.rfind("<fd:", 0) == 0) {
      const size_t colon = m.find(": ");
      if (colon != std::string::npos) m = m.substr(colon + 2);
    }
    return m;
  }
  // Reads up to n bytes; fewer only at the end of the data. Damaged compressed data (a bad
  // checksum, a cut stream) is an error.
  size_t read(uint8_t* buf, size_t n) {
    size_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
      const int r = gzread(gz_, buf + got, chunk);
      if (r < 0)
        fail("read_idx: '{}': {}: {}", path_, compressed() ? "decompressing failed" : "read failed",
             zlib_error());
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    if (got < n && compressed()) {
      // A gzip stream cut short reads as a short, error-free read before zlib reports it.
      int err = 0;
      (void)gzerror(gz_, &err);
      if (err != Z_OK && err != Z_STREAM_END)
        fail("read_idx: '{}': decompressing failed: {}", path_, zlib_error());
    }
    return got;
  }

 private:
  std::string path_;
  gzFile gz_ = nullptr;
  int64_t size_ = -1;
};

}  // namespace

IdxArray read_idx(const std::string& path) {
  IdxSource src(path);
  const int64_t size = src.size();
  // How much there is, for messages: the file's size, or "the decompressed data".
  auto have = [&](int64_t n) {
    return src.compressed() ? fmt::format("{} bytes decompressed", n) : fmt::format("{} bytes", n);
  };

  uint8_t magic[4];
  const size_t m = src.read(magic, 4);
  if (m < 4)
    fail("read_idx: '{}': file shorter than the header: {}, an IDX header needs at least 4", path,
         have(static_cast<int64_t>(m)));
  if (magic[0] != 0 || magic[1] != 0)
    fail(
        "read_idx: '{}': bad magic {:02x} {:02x} {:02x} {:02x}: expected 00 00 <type> <rank> "
        "(00 00 08 03 for MNIST images, 00 00 08 01 for labels)",
        path, magic[0], magic[1], magic[2], magic[3]);
  const uint8_t type = magic[2];
  const int rank = magic[3];
  if (type != kTypeU8)
    fail(
        "read_idx: '{}': unsupported IDX data type 0x{:02x} ({}); only 0x08 (unsigned byte) is "
        "supported",
        path, type, idx_type_name(type));
  if (rank < 1 || rank > kMaxRank)
    fail("read_idx: '{}': rank {} is not supported: must be 1..{}", path, rank, kMaxRank);

  const int64_t header = 4 + 4 * int64_t{rank};
  uint8_t raw[4 * kMaxRank];
  const size_t hr = src.read(raw, 4 * static_cast<size_t>(rank));
  if (hr < 4 * static_cast<size_t>(rank))
    fail(
        "read_idx: '{}': file shorter than the header: {}, the header of a rank-{} IDX "
        "file is {} bytes",
        path, have(size >= 0 ? size : 4 + static_cast<int64_t>(hr)), rank, header);

  IdxArray a;
  int64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    const uint8_t* b = raw + 4 * i;
    const int64_t d = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
    if (d == 0) fail("read_idx: '{}': dimension {} of {} is 0", path, i, rank);
    if (d >= kMaxDim)
      fail("read_idx: '{}': dimension {} of {} is {}, which is absurd (corrupt header?)", path, i,
           rank, d);
    a.dims.push_back(d);
    // Compare before multiplying so the product can never overflow int64.
    if (count > kMaxBytes / d)
      fail("read_idx: '{}': dimensions {}... describe more than 1 TiB of data (corrupt header?)",
           path, dims_str(a.dims));
    count *= d;
  }

  // Names the first sample (index along the first dimension) that is cut short.
  auto truncated = [&](int64_t found, const char* how) {
    const int64_t per_sample = count / a.dims[0];
    fail(
        "read_idx: '{}': truncated data: expected {} bytes of data after the header, found {}{} "
        "(dims {}): sample {} of {} is the first one cut short",
        path, count, found, how, dims_str(a.dims), found / per_sample, a.dims[0]);
  };
  if (size >= 0) {
    // A plain file: its size says whether the data is all there before anything is allocated.
    const int64_t found = size - header;
    if (found < count) truncated(found, "");
    if (found > count)
      fail("read_idx: '{}': {} extra bytes after the data (dims {} need exactly {} bytes)", path,
           found - count, dims_str(a.dims), count);
    a.data.resize(static_cast<size_t>(count));
    const size_t got = src.read(a.data.data(), a.data.size());
    // The size came from fstat; a shorter read means the file shrank while we read it.
    if (got != a.data.size())
      fail(
          "read_idx: '{}': truncated data: expected {} bytes of data after the header, found {} "
          "(the file shrank while being read)",
          path, count, got);
    return a;
  }
  // Compressed: the buffer grows with what actually decompresses (a header claiming more than
  // the data holds allocates no more than the data), in blocks of at most 64 MiB.
  constexpr int64_t kBlock = int64_t{64} << 20;
  int64_t found = 0;
  while (found < count) {
    const int64_t want = std::min(kBlock, count - found);
    a.data.resize(static_cast<size_t>(found + want));
    const size_t got = src.read(a.data.data() + found, static_cast<size_t>(want));
    found += static_cast<int64_t>(got);
    if (got < static_cast<size_t>(want)) truncated(found, " decompressed");
  }
  uint8_t extra[4096];
  if (const size_t more = src.read(extra, sizeof extra); more > 0)
    fail(
        "read_idx: '{}': extra bytes after the data once decompressed ({}{}; dims {} need exactly "
        "{} bytes)",
        path, more, more == sizeof extra ? " or more" : "", dims_str(a.dims), count);
  return a;
}

void write_idx(const std::string& path, const IdxArray& a) {
  const int rank = static_cast<int>(a.dims.size());
  if (rank < 1 || rank > kMaxRank)
    fail("write_idx: '{}': rank {} is not supported: must be 1..{}", path, rank, kMaxRank);
  int64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    const int64_t d = a.dims[static_cast<size_t>(i)];
    if (d < 1 || d > int64_t{0xFFFFFFFF})
      fail("write_idx: '{}': dimension {} is {}: must be in 1..2^32-1", path, i, d);
    if (count > kMaxBytes / d)
      fail("write_idx: '{}': dims {} exceed 1 TiB", path, dims_str(a.dims));
    count *= d;
  }
  if (static_cast<int64_t>(a.data.size()) != count)
    fail("write_idx: '{}': dims {} need {} bytes but data has {}", path, dims_str(a.dims), count,
         a.data.size());

  std::vector<uint8_t> header = {0, 0, kTypeU8, static_cast<uint8_t>(rank)};
  for (int64_t d : a.dims)
    for (int shift = 24; shift >= 0; shift -= 8) header.push_back(static_cast<uint8_t>(d >> shift));

  const std::string tmp = path + ".tmp";
  Fd f;
  f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f.fd < 0) fail("write_idx: cannot create '{}': {}", tmp, std::strerror(errno));
  auto write_all = [&](const uint8_t* p, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(f.fd, p, n);
      if (w < 0) {
        if (errno == EINTR) continue;
        const int e = errno;
        ::unlink(tmp.c_str());
        fail("write_idx: writing '{}' failed: {}", tmp, std::strerror(e));
      }
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  write_all(header.data(), header.size());
  write_all(a.data.data(), a.data.size());
  // fsync before rename: otherwise a crash can leave `path` renamed but with unwritten contents.
  if (::fsync(f.fd) != 0 || ::close(f.fd) != 0) {
    const int e = errno;
    f.fd = -1;
    ::unlink(tmp.c_str());
    fail("write_idx: flushing '{}' failed: {}", tmp, std::strerror(e));
  }
  f.fd = -1;
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    fail("write_idx: renaming '{}' to '{}' failed: {}", tmp, path, std::strerror(e));
  }
  // Persist the rename itself; best effort, since some file systems refuse fsync on directories.
  std::string dir = std::filesystem::path(path).parent_path().string();
  Fd d;
  d.fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d.fd >= 0) (void)::fsync(d.fd);
}

// ----------------------------------------------------------------------------------------------
// MNIST splits

namespace {

std::string split_prefix(const std::string& split) {
  if (split == "train") return "train";
  if (split == "test") return "t10k";
  fail("load_mnist_split: unknown split '{}': expected \"train\" or \"test\"", split);
}

// The two files of a split: "{prefix}{kind}".
constexpr const char* kImages = "-images-idx3-ubyte";
constexpr const char* kLabels = "-labels-idx1-ubyte";

// A split's file: NAME, or NAME.gz as the MNIST site ships it (read_idx decompresses it) when
// only that is there; "" when neither is.
std::string find_file(const std::string& dir, const std::string& name) {
  std::error_code ec;
  const auto plain = std::filesystem::path(dir) / name;
  if (std::filesystem::is_regular_file(plain, ec)) return plain.string();
  const auto gz = std::filesystem::path(dir) / (name + ".gz");
  if (std::filesystem::is_regular_file(gz, ec)) return gz.string();
  return "";
}
// Where a split's file is read from: the file find_file finds, else the plain name (for the
// error saying it cannot be opened). Writers use the plain name: a .gz beside it is not theirs.
std::string read_path(const std::string& dir, const std::string& prefix, const char* kind) {
  const std::string f = find_file(dir, prefix + kind);
  return f.empty() ? (std::filesystem::path(dir) / (prefix + kind)).string() : f;
}

}  // namespace

MnistSplit load_mnist_split(const std::string& dir, const std::string& split) {
  const std::string prefix = split_prefix(split);
  const std::string ip = read_path(dir, prefix, kImages), lp = read_path(dir, prefix, kLabels);
  MnistSplit s{read_idx(ip), read_idx(lp)};
  const auto& id = s.images.dims;
  if (id.size() != 3 || id[1] != kMnistRows || id[2] != kMnistCols)
    fail("load_mnist_split: '{}': expected images of shape N x 28 x 28, got {}", ip, dims_str(id));
  if (s.labels.dims.size() != 1)
    fail("load_mnist_split: '{}': expected labels of shape N (rank 1), got {}", lp,
         dims_str(s.labels.dims));
  if (id[0] != s.labels.dims[0])
    fail("load_mnist_split: count mismatch: '{}' holds {} images but '{}' holds {} labels", ip,
         id[0], lp, s.labels.dims[0]);
  for (size_t i = 0; i < s.labels.data.size(); ++i)
    if (s.labels.data[i] > 9)
      fail("load_mnist_split: '{}': label {} at index {} is out of range 0..9", lp,
           s.labels.data[i], i);
  return s;
}

std::vector<std::string> mnist_files_missing(const std::string& dir) {
  std::vector<std::string> missing;
  for (const char* prefix : {"train", "t10k"})
    for (const char* kind : {kImages, kLabels}) {
      const std::string name = std::string(prefix) + kind;
      if (find_file(dir, name).empty()) missing.push_back(name);
    }
  return missing;
}

bool mnist_files_exist(const std::string& dir) {
  return mnist_files_missing(dir).empty();
}

// ----------------------------------------------------------------------------------------------
// Synthetic digits

namespace {

// All randomness is a counter run through splitmix64's mix, so any sample can be generated
// independently of the others (and of the thread that draws it).
uint64_t hash2(uint64_t a, uint64_t b) {
  return mix64(a ^ mix64(b + kGoldenGamma));
}

struct Rng {
  uint64_t state;
  uint64_t next() { return splitmix64_next(state); }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Irwin-Hall with 4 terms (the four 16-bit quarters of one draw): mean 0, variance 1, bounded
  // to +-3.46, and one hash per value with no log/exp.
  double normal() {
    const uint64_t v = next();
    const double sum =
        static_cast<double>((v & 0xFFFF) + ((v >> 16) & 0xFFFF) + ((v >> 32) & 0xFFFF) + (v >> 48));
    return (sum * (1.0 / 65536.0) - 2.0) * 1.7320508075688772;
  }
  bool chance(double p) { return uniform() < p; }
};

constexpr double kPi = 3.14159265358979323846;

// sin and cos of `deg` degrees from a fixed Taylor series: libm's versions may differ in the last
// bit between library builds and CPU-specific code paths, which would break byte-identical output.
void sincos_deg(double deg, double* s, double* c) {
  double x = deg * (kPi / 180.0);
  x -= 2.0 * kPi * std::floor(x / (2.0 * kPi) + 0.5);  // now in [-pi, pi]
  const double x2 = x * x;
  double ts = x, tc = 1.0, ss = x, cc = 1.0;
  for (int n = 1; n <= 15; ++n) {  // error < 1e-16 on [-pi, pi]
    ts *= -x2 / ((2.0 * n) * (2.0 * n + 1.0));
    tc *= -x2 / ((2.0 * n - 1.0) * (2.0 * n));
    ss += ts;
    cc += tc;
  }
  *s = ss;
  *c = cc;
}

struct Pt {
  double x, y;
};

// Draws one digit's strokes in the unit box (x right, y down, both 0..1) as polylines, jittering
// every stroke parameter. Angles are in degrees with y down: 0 = right, 90 = down, -90 = up;
// increasing angles run clockwise on screen.
class Pen {
 public:
  Pen(Rng& rng, double jitter) : r_(rng), j_(jitter) {}

  // Starts a new stroke at (x, y).
  void move(double x, double y) { paths_.push_back({jit(x, y)}); }
  // Straight stroke from the current point.
  void line(double x, double y) { paths_.back().push_back(jit(x, y)); }
  // Cubic Bezier from the current point through control points (x1,y1), (x2,y2) to (x3,y3).
  void curve(double x1, double y1, double x2, double y2, double x3, double y3) {
    const Pt p0 = paths_.back().back(), p1 = jit(x1, y1), p2 = jit(x2, y2), p3 = jit(x3, y3);
    constexpr int kSteps = 10;
    for (int i = 1; i <= kSteps; ++i) {
      const double t = i / double{kSteps}, u = 1.0 - t;
      const double a = u * u * u, b = 3 * u * u * t, c = 3 * u * t * t, d = t * t * t;
      paths_.back().push_back(
          {a * p0.x + b * p1.x + c * p2.x + d * p3.x, a * p0.y + b * p1.y + c * p2.y + d * p3.y});
    }
  }
  // Elliptic arc centred (cx, cy) with radii (rx, ry) from angle a0 to a1. With `connect`, it
  // continues the current stroke: the arc is bent so it starts exactly at the current point (the
  // offset fades out along the arc), so jitter never tears a junction apart.
  void arc(double cx, double cy, double rx, double ry, double a0, double a1, bool connect = false) {
    const Pt c = jit(cx, cy);
    rx *= 1.0 + 0.06 * r_.normal();
    ry *= 1.0 + 0.06 * r_.normal();
    a0 += 6.0 * r_.normal();
    a1 += 6.0 * r_.normal();
    // About one point per 0.1 units (2 px at full size) of arc length: the chord then strays at
    // most ~0.1 px from the true arc, and fewer, longer segments render faster.
    const double len = std::fabs(a1 - a0) * (kPi / 180.0) * std::max(rx, ry);
    const int steps = std::max(6, static_cast<int>(len / 0.1) + 1);
    std::vector<Pt> pts;
    for (int i = 0; i <= steps; ++i) {
      double s, co;
      sincos_deg(a0 + (a1 - a0) * i / steps, &s, &co);
      pts.push_back({c.x + rx * co, c.y + ry * s});
    }
    if (connect && !paths_.empty()) {
      const Pt start = paths_.back().back();
      const double ox = start.x - pts[0].x, oy = start.y - pts[0].y;
      for (int i = 0; i <= steps; ++i) {
        const double w = 1.0 - double(i) / steps;
        pts[static_cast<size_t>(i)].x += ox * w;
        pts[static_cast<size_t>(i)].y += oy * w;
      }
      paths_.back().insert(paths_.back().end(), pts.begin() + 1, pts.end());
    } else {
      paths_.push_back(std::move(pts));
    }
  }
  // A closed loop starting near angle a0 (+- `spread` degrees), drawn either way round, with a
  // random small gap or overlap where it closes.
  void loop(double cx, double cy, double rx, double ry, double a0, double spread) {
    const double start = a0 + spread * r_.normal();
    const bool clockwise = r_.chance(0.5);
    const double sweep = 360.0 + std::clamp(10.0 * r_.normal() + 5.0, -20.0, 30.0);
    arc(cx, cy, rx, ry, start, clockwise ? start + sweep : start - sweep);
  }

  Rng& rng() { return r_; }
  std::vector<std::vector<Pt>>& paths() { return paths_; }

 private:
  Pt jit(double x, double y) { return {x + j_ * r_.normal(), y + j_ * r_.normal()}; }
  Rng& r_;
  double j_;
  std::vector<std::vector<Pt>> paths_;
};

// Stroke skeletons of the ten digits, with a few common handwriting variants. Every random draw
// is its own full expression: two draws in one argument list would run in an unspecified order,
// and GCC and Clang do pick different orders.
void draw_digit(int digit, Pen& p) {
  Rng& r = p.rng();
  switch (digit) {
    case 0:
      p.loop(0.5, 0.5, 0.27, 0.44, -95.0, 15.0);
      break;
    case 1: {
      const double u = r.uniform();
      if (u < 0.45) {
        p.move(0.5, 0.05);
      } else {
        p.move(0.34, 0.22);  // flag
        p.line(0.5, 0.05);
      }
      p.line(0.5, 0.95);
      if (u > 0.85) {  // base
        p.move(0.33, 0.95);
        p.line(0.67, 0.95);
      }
      break;
    }
    case 2:
      p.arc(0.5, 0.3, 0.27, 0.24, 195.0, 385.0);
      p.curve(0.62, 0.6, 0.38, 0.78, 0.18, 0.94);
      p.line(0.84, 0.93);
      break;
    case 3:
      p.arc(0.48, 0.28, 0.26, 0.22, 205.0, 445.0);
      p.arc(0.5, 0.71, 0.29, 0.24, -95.0, 155.0, true);
      break;
    case 4:
      if (r.chance(0.6)) {  // closed top
        p.move(0.6, 0.06);
        p.line(0.14, 0.64);
        p.line(0.86, 0.64);
        p.move(0.63, 0.06);
        p.line(0.63, 0.95);
      } else {  // open top
        p.move(0.24, 0.06);
        p.line(0.2, 0.6);
        p.line(0.84, 0.6);
        p.move(0.67, 0.12);
        p.line(0.65, 0.95);
      }
      break;
    case 5:
      p.move(0.78, 0.06);
      p.line(0.32, 0.06);
      p.line(0.29, 0.46);
      p.arc(0.5, 0.67, 0.27, 0.26, 235.0, 510.0, true);
      break;
    case 6:
      p.move(0.72, 0.05);
      p.curve(0.45, 0.12, 0.22, 0.4, 0.24, 0.7);
      p.arc(0.5, 0.7, 0.26, 0.23, 180.0, -170.0, true);
      break;
    case 7:
      p.move(0.18, 0.08);
      p.line(0.82, 0.08);
      if (r.chance(0.5)) {
        p.line(0.42, 0.95);
      } else {
        p.curve(0.7, 0.35, 0.5, 0.6, 0.44, 0.95);
      }
      if (r.chance(0.15)) {  // continental crossbar
        p.move(0.45, 0.5);
        p.line(0.8, 0.5);
      }
      break;
    case 8:
      p.loop(0.5, 0.27, 0.21, 0.21, 90.0, 20.0);
      p.loop(0.5, 0.72, 0.27, 0.24, -90.0, 20.0);
      break;
    case 9:
      p.loop(0.47, 0.3, 0.24, 0.22, 0.0, 15.0);
      p.move(0.71, 0.3);
      if (r.chance(0.5)) {
        p.line(0.64, 0.95);
      } else {
        p.curve(0.72, 0.55, 0.68, 0.8, 0.6, 0.95);
      }
      break;
    default:
      break;
  }
}

// Renders without validating `digit`; safe to call inside an OpenMP region (never throws).
void render_impl(int digit, uint64_t seed, uint8_t* out) {
  Rng r{mix64(seed)};
  // Per-sample style, drawn in a fixed order so the stream is reproducible.
  const double scale = r.uniform(0.75, 1.05);
  const double aspect = r.uniform(0.8, 1.2);  // width multiplier
  const double shear = r.uniform(-0.3, 0.2);  // negative leans the top to the right
  const double rot = r.uniform(-12.0, 12.0);
  const double dx = std::clamp(1.5 * r.normal(), -3.0, 3.0);
  const double dy = std::clamp(1.5 * r.normal(), -3.0, 3.0);
  const double width = r.uniform(1.2, 2.6);  // stroke width in pixels
  const double soft = r.uniform(0.8, 1.4);   // anti-aliased edge width in pixels
  const double peak = r.uniform(0.85, 1.0);
  const double noise = r.uniform(0.0, 6.0);  // noise standard deviation, intensity units
  const double jitter = r.uniform(0.02, 0.05);

  Pen pen(r, jitter);
  draw_digit(digit, pen);

  // Unit box -> 20x20 pixels centred in the 28x28 image, then scale, shear, rotate, shift.
  double sr, cr;
  sincos_deg(rot, &sr, &cr);
  const double half = 0.5 * width;
  double lo_x = 1e9, lo_y = 1e9, hi_x = -1e9, hi_y = -1e9;
  for (auto& path : pen.paths())
    for (Pt& q : path) {
      double x = (q.x - 0.5) * 20.0 * scale * aspect, y = (q.y - 0.5) * 20.0 * scale;
      x += shear * y;
      q = {14.0 + dx + cr * x - sr * y, 14.0 + dy + sr * x + cr * y};
      lo_x = std::min(lo_x, q.x), hi_x = std::max(hi_x, q.x);
      lo_y = std::min(lo_y, q.y), hi_y = std::max(hi_y, q.y);
    }
  // Keep the ink inside the frame: pull back a digit the shift pushed over an edge (and centre
  // one too big to fit at all).
  const double margin = half + 0.5;
  auto pull = [&](double lo, double hi) {
    if (hi - lo > 28.0 - 2.0 * margin) return 14.0 - 0.5 * (lo + hi);
    if (lo < margin) return margin - lo;
    if (hi > 28.0 - margin) return 28.0 - margin - hi;
    return 0.0;
  };
  const double fx = pull(lo_x, hi_x), fy = pull(lo_y, hi_y);

  // Squared distance from each pixel centre to the nearest stroke segment. Each segment only
  // visits pixels in its bounding box grown by the stroke's reach, which keeps this cheap.
  double d2[kMnistPixels];
  std::fill(d2, d2 + kMnistPixels, 1e30);
  const double reach = half + soft;
  for (const auto& path : pen.paths())
    for (size_t k = 0; k == 0 || k + 1 < path.size(); ++k) {  // a 1-point path is a dot
      const Pt a{path[k].x + fx, path[k].y + fy};
      const Pt b = k + 1 < path.size() ? Pt{path[k + 1].x + fx, path[k + 1].y + fy} : a;
      const int c0 = std::max(0, static_cast<int>(std::floor(std::min(a.x, b.x) - reach)));
      const int c1 =
          std::min(kMnistCols - 1, static_cast<int>(std::floor(std::max(a.x, b.x) + reach)));
      const int r0 = std::max(0, static_cast<int>(std::floor(std::min(a.y, b.y) - reach)));
      const int r1 =
          std::min(kMnistRows - 1, static_cast<int>(std::floor(std::max(a.y, b.y) + reach)));
      const double ex = b.x - a.x, ey = b.y - a.y, len2 = ex * ex + ey * ey;
      const double inv_len2 = len2 > 0 ? 1.0 / len2 : 0.0;
      for (int row = r0; row <= r1; ++row)
        for (int col = c0; col <= c1; ++col) {
          const double px = col + 0.5 - a.x, py = row + 0.5 - a.y;
          const double t = std::clamp((px * ex + py * ey) * inv_len2, 0.0, 1.0);
          const double qx = px - t * ex, qy = py - t * ey;
          double& d = d2[row * kMnistCols + col];
          d = std::min(d, qx * qx + qy * qy);
        }
    }

  // Intensity: full inside the stroke core, smoothstep falloff over `soft` pixels at the edge.
  const double core = half - 0.5 * soft, inv_soft = 1.0 / soft;
  const double edge2 = (half + 0.5 * soft) * (half + 0.5 * soft);  // beyond this: background
  for (int i = 0; i < kMnistPixels; ++i) {
    double v = 0.0;
    if (d2[i] < edge2) {
      const double t = (std::sqrt(d2[i]) - core) * inv_soft;
      if (t <= 0.0) {
        v = 1.0;
      } else {
        const double u = 1.0 - t;
        v = u * u * (3.0 - 2.0 * u);
      }
    }
    v = 255.0 * peak * v + noise * r.normal();
    out[i] = static_cast<uint8_t>(std::clamp(v, 0.0, 255.0) + 0.5);  // round to nearest
  }
}

}  // namespace

void render_digit(int digit, uint64_t seed, uint8_t out[kMnistPixels]) {
  if (digit < 0 || digit > 9) fail("render_digit: digit {} is out of range 0..9", digit);
  render_impl(digit, seed, out);
}

void write_synthetic_mnist(const std::string& dir, int64_t n_train, int64_t n_test, uint64_t seed) {
  for (int64_t n : {n_train, n_test})
    if (n < 1 || n > int64_t{0x7FFFFFFF})
      fail("write_synthetic_mnist: sample count {} is out of range 1..2^31-1", n);
  // Some of the files but not all: an incomplete download, not to be written over.
  const auto missing = mnist_files_missing(dir);
  if (!missing.empty() && missing.size() < 4)
    fail(
        "write_synthetic_mnist: '{}' holds some MNIST files but not {} (an incomplete "
        "download?); synthetic digits are written only into a folder with none of the four: add "
        "the missing files, or use another folder",
        dir, fmt::join(missing, ", "));
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) fail("write_synthetic_mnist: cannot create directory '{}': {}", dir, ec.message());

  const struct {
    const char* prefix;
    int64_t n;
    uint64_t stream;
  } splits[] = {{"train", n_train, 1}, {"t10k", n_test, 2}};
  for (const auto& sp : splits) {
    const uint64_t split_seed = hash2(seed, sp.stream);
    // Balanced labels: i % 10, then a Fisher-Yates shuffle from the split's own stream.
    IdxArray labels{{sp.n}, std::vector<uint8_t>(static_cast<size_t>(sp.n))};
    for (int64_t i = 0; i < sp.n; ++i)
      labels.data[static_cast<size_t>(i)] = static_cast<uint8_t>(i % 10);
    Rng shuf{hash2(split_seed, ~uint64_t{0})};
    for (int64_t i = sp.n - 1; i > 0; --i)
      std::swap(labels.data[static_cast<size_t>(i)],
                labels.data[shuf.next() % static_cast<uint64_t>(i + 1)]);

    IdxArray images{{sp.n, kMnistRows, kMnistCols},
                    std::vector<uint8_t>(static_cast<size_t>(sp.n) * kMnistPixels)};
    // Each sample's seed depends only on (seed, split, index): thread count cannot matter.
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < sp.n; ++i)
      render_impl(labels.data[static_cast<size_t>(i)], hash2(split_seed, static_cast<uint64_t>(i)),
                  images.data.data() + i * kMnistPixels);

    // The plain names, also where .gz files are: writing IDX bytes under a .gz name made a
    // "compressed" file that is not.
    write_idx((std::filesystem::path(dir) / (std::string(sp.prefix) + kImages)).string(), images);
    write_idx((std::filesystem::path(dir) / (std::string(sp.prefix) + kLabels)).string(), labels);
  }
}

std::string ascii_art(const uint8_t* img) {
  static constexpr char kRamp[] = " .:-=+*#%@";  // 10 levels, dark to bright
  std::string s;
  s.reserve(kMnistRows * (2 * kMnistCols + 1));
  for (int row = 0; row < kMnistRows; ++row) {
    for (int col = 0; col < kMnistCols; ++col) {
      const char c = kRamp[img[row * kMnistCols + col] * 10 / 256];
      s += c;
      s += c;
    }
    s += '\n';
  }
  return s;
}

}  // namespace cstorch::data
