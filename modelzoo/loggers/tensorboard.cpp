// TensorBoard event files: TFRecord framing with masked CRC-32C and a hand-rolled protobuf
// encoder for the few tensorflow.Event / Summary fields scalars need.
#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>

#include <cstorch/core/error.h>

#include "modelzoo/loggers.h"

namespace modelzoo {

namespace {

// Table for the reflected Castagnoli polynomial 0x82F63B78.
const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> t = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return t;
}

// Protobuf wire encoding (proto3): tag = field << 3 | wire type.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire) {
  put_varint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire));
}
static_assert(std::endian::native == std::endian::little,
              "TFRecord and protobuf fixed-width fields are little endian; add byte swaps");

template <class T>
void put_fixed(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_double(std::string& out, int field, double v) {
  put_tag(out, field, 1);
  put_fixed(out, v);
}
void put_float(std::string& out, int field, float v) {
  put_tag(out, field, 5);
  put_fixed(out, v);
}
void put_int64(std::string& out, int field, int64_t v) {
  put_tag(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));  // negative int64: ten-byte two's complement
}
void put_bytes(std::string& out, int field, const std::string& v) {
  put_tag(out, field, 2);
  put_varint(out, v.size());
  out += v;
}

std::string event_header(double wall_time, int64_t step) {
  std::string e;
  put_double(e, 1, wall_time);
  put_int64(e, 2, step);
  return e;
}

// The cause of a failed stream operation: errno as the failing write left it (callers
// clear it first).
std::string stream_error() {
  return errno != 0 ? std::strerror(errno) : "the stream reported an error (no system error)";
}

std::string hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == 0) return "localhost";
  return buf;
}

std::atomic<int> g_file_counter{0};

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const auto& t = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardLogger::TensorBoardLogger(const std::filesystem::path& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  CS_CHECK(!ec, "TensorBoardLogger: cannot create the log directory '{}': {}", log_dir.string(),
           ec.message());
  double now = unix_time();
  path_ = log_dir / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", static_cast<int64_t>(now),
                                hostname(), static_cast<long>(::getpid()), g_file_counter++);
  out_.open(path_, std::ios::binary | std::ios::trunc);
  CS_CHECK(out_.good(), "TensorBoardLogger: cannot create the event file '{}'", path_.string());
  std::string e = event_header(now, 0);
  put_bytes(e, 3, "brain.Event:2");
  write_record(e);
  flush();
}

TensorBoardLogger::~TensorBoardLogger() {
  try {
    close();
  } catch (...) {  // a destructor must not throw; close() explicitly to see write errors
  }
}

void TensorBoardLogger::write_record(const std::string& payload) {
  uint64_t len = payload.size();
  char header[12];
  std::memcpy(header, &len, 8);
  uint32_t len_crc = masked_crc32c(header, 8);
  std::memcpy(header + 8, &len_crc, 4);
  uint32_t data_crc = masked_crc32c(payload.data(), payload.size());
  errno = 0;
  out_.write(header, 12);
  out_.write(payload.data(), static_cast<std::streamsize>(payload.size()));
  out_.write(reinterpret_cast<const char*>(&data_crc), 4);
  CS_CHECK(out_.good(), "TensorBoardLogger: writing '{}' failed: {}", path_.string(),
           stream_error());
}

void TensorBoardLogger::log_metrics(int64_t step, const Scalars& metrics) {
  CS_CHECK(!closed_, "TensorBoardLogger: log_metrics after close() ('{}')", path_.string());
  std::string summary;
  for (const auto& [tag, value] : metrics) {
    std::string v;
    put_bytes(v, 1, tag);
    put_float(v, 2, static_cast<float>(value));
    put_bytes(summary, 1, v);
  }
  std::string e = event_header(unix_time(), step);
  put_bytes(e, 5, summary);
  write_record(e);
}

void TensorBoardLogger::flush() {
  if (closed_) return;
  if (out_.good()) errno = 0;  // else keep the cause of the write that failed
  out_.flush();
  CS_CHECK(out_.good(), "TensorBoardLogger: flushing '{}' failed: {}", path_.string(),
           stream_error());
}

void TensorBoardLogger::close() {
  if (closed_) return;
  flush();
  out_.close();
  closed_ = true;
}

}  // namespace modelzoo
