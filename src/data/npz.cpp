// .npz archives (ZIP files of .npy members, stored or deflated) through libzip: the member is
// located and its uncompressed size taken from the archive directory, and the shared .npy parser
// (arrays.cpp) checks the header against that size before the data are allocated.
#include <zip.h>

#include <filesystem>

#include <fmt/ranges.h>

#include "cstorch/data/arrays.h"
#include "data/npy.h"

namespace cstorch::data {

namespace {

struct Archive {
  zip_t* z = nullptr;
  explicit Archive(const std::string& path) {
    int err = 0;
    z = zip_open(path.c_str(), ZIP_RDONLY, &err);
    if (!z) {
      zip_error_t e;
      zip_error_init_with_code(&e, err);
      std::string msg = zip_error_strerror(&e);
      zip_error_fini(&e);
      fail("'{}' is not a readable .npz (ZIP) archive: {}", path, msg);
    }
  }
  ~Archive() { zip_discard(z); }
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    zip_int64_t n = zip_get_num_entries(z, 0);
    for (zip_int64_t i = 0; i < n; ++i) {
      const char* name = zip_get_name(z, static_cast<zip_uint64_t>(i), 0);
      std::string s = name ? name : "";
      if (s.size() > 4 && s.compare(s.size() - 4, 4, ".npy") == 0)
        out.push_back(s.substr(0, s.size() - 4));
    }
    return out;
  }
};

class MemberSource : public NpySource {
 public:
  MemberSource(zip_t* z, zip_uint64_t index, uint64_t size, std::string w) : size_(size) {
    where = std::move(w);
    f_ = zip_fopen_index(z, index, 0);
    CS_CHECK(f_ != nullptr, "{}: cannot open the archive member: {}", where, zip_strerror(z));
  }
  ~MemberSource() override { zip_fclose(f_); }
  uint64_t size() const override { return size_; }
  // libzip checks a member's CRC-32 when a read reaches the member's end, which the parser, which
  // reads exactly the member's size, never asks for: this read does (a flipped byte in a stored
  // member was read as data).
  void finish() {
    uint8_t extra = 0;
    zip_int64_t got = zip_fread(f_, &extra, 1);
    CS_CHECK(got >= 0, "{}: the archive member is damaged: {}", where, zip_file_strerror(f_));
    CS_CHECK(got == 0, "{}: the archive member is longer than the {} bytes its directory gives",
             where, size_);
  }
  void read(void* dst, uint64_t n) override {
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
      zip_int64_t got = zip_fread(f_, p, n);
      CS_CHECK(got > 0, "{}: reading the archive member failed ({})", where,
               got < 0 ? zip_file_strerror(f_) : "it ends early");
      p += got;
      n -= static_cast<uint64_t>(got);
    }
  }

 private:
  zip_file_t* f_ = nullptr;
  uint64_t size_;
};

}  // namespace

std::vector<std::string> npz_names(const std::string& path) {
  return Archive(path).names();
}

HostArray read_npz(const std::string& path, const std::string& name) {
  Archive a(path);
  zip_int64_t index = zip_name_locate(a.z, (name + ".npy").c_str(), 0);
  if (index < 0)
    fail("'{}' has no array '{}' (arrays: {})", path, name, fmt::join(a.names(), ", "));
  zip_stat_t st;
  zip_stat_init(&st);
  CS_CHECK(zip_stat_index(a.z, static_cast<zip_uint64_t>(index), 0, &st) == 0 &&
               (st.valid & ZIP_STAT_SIZE),
           "{}:{}: cannot read the member's size: {}", path, name, zip_strerror(a.z));
  // The directory's sizes are checked against each other and the archive before the parser
  // trusts the member's size for an allocation: a stored member is as long as its stored bytes,
  // and deflate expands at most about 1032 times.
  const uint64_t archive = std::filesystem::file_size(path);
  CS_CHECK((st.valid & ZIP_STAT_COMP_SIZE) && (st.valid & ZIP_STAT_COMP_METHOD) &&
               st.comp_size <= archive,
           "{}:{}: the archive's directory gives the member {} stored bytes, but the archive "
           "is {} bytes (corrupt archive)",
           path, name, st.comp_size, archive);
  const bool stored = st.comp_method == ZIP_CM_STORE;
  CS_CHECK(stored ? st.size == st.comp_size : st.size / 1100 <= st.comp_size,
           "{}:{}: the archive's directory says {} bytes from {} stored bytes, which {} (corrupt "
           "archive)",
           path, name, st.size, st.comp_size,
           stored ? "differ for an uncompressed member" : "deflate cannot expand to");
  MemberSource src(a.z, static_cast<zip_uint64_t>(index), st.size,
                   fmt::format("{}:{}", path, name));
  HostArray r = read_npy_from(src);
  src.finish();
  return r;
}

}  // namespace cstorch::data
