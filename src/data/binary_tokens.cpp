// BinaryTokenDataset and write_binary_tokens: flat token files (see cstorch/data/tokens.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "cstorch/data/tokens.h"
#include "data/host_tensor.h"

namespace cstorch::data {

namespace {
size_t token_size(TokenType t) {
  switch (t) {
    case TokenType::u16:
      return 2;
    case TokenType::i32:
    case TokenType::u32:
      return 4;
    case TokenType::i64:
      return 8;
  }
  return 0;
}
const char* token_name(TokenType t) {
  switch (t) {
    case TokenType::u16:
      return "uint16";
    case TokenType::i32:
      return "int32";
    case TokenType::u32:
      return "uint32";
    case TokenType::i64:
      return "int64";
  }
  return "?";
}
int64_t decode(const uint8_t* p, TokenType t) {
  // Files are little-endian, as is every machine this builds for (x86-64, aarch64).
  switch (t) {
    case TokenType::u16: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return v;
    }
    case TokenType::i32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case TokenType::u32: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case TokenType::i64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
  return 0;
}
}  // namespace

BinaryTokenDataset::BinaryTokenDataset(std::string path, int64_t msl, TokenType type, int64_t vocab)
    : path_(std::move(path)), msl_(msl), vocab_(vocab), type_(type), tsize_(token_size(type)) {
  CS_CHECK(msl_ >= 1, "BinaryTokenDataset: '{}': msl must be >= 1, got {}", path_, msl_);
  fd_ =
      ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO is refused, not waited on
  if (fd_ < 0) fail("BinaryTokenDataset: cannot open '{}': {}", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail("BinaryTokenDataset: '{}' is not a regular file", path_);
  }
  auto bytes = static_cast<int64_t>(st.st_size);
  if (bytes % static_cast<int64_t>(tsize_) != 0) {
    ::close(fd_);
    fd_ = -1;
    fail(
        "BinaryTokenDataset: '{}': size {} bytes is not a whole number of {}-byte {} tokens "
        "(truncated file, or another token type?)",
        path_, bytes, tsize_, token_name(type_));
  }
  // A sparse file (a size set by truncate, a copy that never got its data) reads as zeros:
  // it claims samples it does not hold, and a loader would allocate for all of them first.
  // Small files are left alone (file systems may keep them inline, without blocks).
  const auto stored = static_cast<int64_t>(st.st_blocks) * 512;
  if (bytes >= (int64_t{1} << 20) && stored < bytes / 8) {
    off_t hole = ::lseek(fd_, 0, SEEK_HOLE);  // only a real hole counts (not compression)
    if (hole >= 0 && hole < static_cast<off_t>(bytes)) {
      ::close(fd_);
      fd_ = -1;
      fail(
          "BinaryTokenDataset: '{}' is {} bytes long but only {} bytes of it are stored on disk "
          "(a sparse file whose missing data reads as zeros): a damaged or incompletely copied "
          "file?",
          path_, bytes, stored);
    }
  }
  int64_t tokens = bytes / static_cast<int64_t>(tsize_);
  if (tokens < msl_ + 1) {
    ::close(fd_);
    fd_ = -1;
    fail("BinaryTokenDataset: '{}' holds {} tokens; one sample of msl {} needs {}", path_, tokens,
         msl_, msl_ + 1);
  }
  n_ = (tokens - 1) / msl_;
}

BinaryTokenDataset::~BinaryTokenDataset() {
  if (fd_ >= 0) ::close(fd_);
}

void BinaryTokenDataset::read_sample(int64_t i, int64_t* ids, int64_t* labels) const {
  CS_CHECK(i >= 0 && i < n_, "BinaryTokenDataset: '{}': sample {} is outside 0..{}", path_, i,
           n_ - 1);
  const size_t want = static_cast<size_t>(msl_ + 1) * tsize_;
  std::vector<uint8_t> buf(want);
  size_t got = 0;
  off_t off = static_cast<off_t>(static_cast<size_t>(i * msl_) * tsize_);
  while (got < want) {
    ssize_t r = ::pread(fd_, buf.data() + got, want - got, off + static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      fail("BinaryTokenDataset: '{}': reading sample {} failed: {}", path_, i,
           std::strerror(errno));
    if (r == 0)
      fail("BinaryTokenDataset: '{}': sample {} is cut short ({} of {} bytes; the file shrank?)",
           path_, i, got, want);
    got += static_cast<size_t>(r);
  }
  for (int64_t k = 0; k <= msl_; ++k) {
    int64_t t = decode(buf.data() + static_cast<size_t>(k) * tsize_, type_);
    if (vocab_ > 0 && (t < 0 || t >= vocab_))
      fail(
          "BinaryTokenDataset: '{}': sample {}: token {} at position {} is outside the "
          "vocabulary 0..{}",
          path_, i, t, k, vocab_ - 1);
    if (k < msl_) ids[k] = t;
    if (k > 0) labels[k - 1] = t;
  }
}

Sample BinaryTokenDataset::get(int64_t i) const {
  int64_t *a, *m, *l;
  Sample s{{"input_ids", detail::host_tensor({msl_}, DType::i64, &a)},
           {"attention_mask", detail::host_tensor({msl_}, DType::i64, &m)},
           {"labels", detail::host_tensor({msl_}, DType::i64, &l)}};
  read_sample(i, a, l);
  std::fill(m, m + msl_, int64_t{1});
  return s;
}

Batch BinaryTokenDataset::get_batch(const std::vector<int64_t>& idx) const {
  int64_t n = static_cast<int64_t>(idx.size());
  int64_t *a, *m, *l;
  Batch out{{"input_ids", detail::host_tensor({n, msl_}, DType::i64, &a)},
            {"attention_mask", detail::host_tensor({n, msl_}, DType::i64, &m)},
            {"labels", detail::host_tensor({n, msl_}, DType::i64, &l)}};
  for (int64_t j = 0; j < n; ++j)
    read_sample(idx[static_cast<size_t>(j)], a + j * msl_, l + j * msl_);
  std::fill(m, m + n * msl_, int64_t{1});
  return out;
}

void write_binary_tokens(const std::string& path, const std::vector<int64_t>& tokens,
                         TokenType type) {
  const size_t ts = token_size(type);
  std::vector<uint8_t> buf(tokens.size() * ts);
  for (size_t i = 0; i < tokens.size(); ++i) {
    int64_t t = tokens[i];
    bool fits = type == TokenType::u16   ? (t >= 0 && t <= 0xffff)
                : type == TokenType::i32 ? (t >= std::numeric_limits<int32_t>::min() &&
                                            t <= std::numeric_limits<int32_t>::max())
                : type == TokenType::u32 ? (t >= 0 && t <= 0xffffffffll)
                                         : true;
    CS_CHECK(fits, "write_binary_tokens: '{}': token {} at index {} does not fit {}", path, t, i,
             token_name(type));
    uint8_t* p = buf.data() + i * ts;
    if (ts == 2) {
      auto v = static_cast<uint16_t>(t);
      std::memcpy(p, &v, 2);
    } else if (ts == 4) {
      auto v = static_cast<uint32_t>(t);
      std::memcpy(p, &v, 4);
    } else {
      std::memcpy(p, &t, 8);
    }
  }
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("write_binary_tokens: cannot create '{}': {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < buf.size()) {
    ssize_t w = ::write(fd, buf.data() + done, buf.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      ::close(fd);
      fail("write_binary_tokens: writing '{}' failed: {}", tmp, std::strerror(e));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0)
    fail("write_binary_tokens: flushing '{}' failed: {}", tmp, std::strerror(errno));
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail("write_binary_tokens: renaming '{}' to '{}' failed: {}", tmp, path, std::strerror(errno));
}

}  // namespace cstorch::data
