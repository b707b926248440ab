// safetensors: an 8-byte little-endian header length, a JSON header
//   {"__metadata__": {str: str}, name: {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}}
// and the tensors' bytes (offsets relative to the end of the header). A cstorch state that is
// not a flat map of distinct tensors keeps its structure (docs/checkpoint-format.md) in
// __metadata__["cstorch_structure"], so it round-trips; files without it load as a flat map in
// header order. Each tensor cstorch writes has its CRC-32 (zlib's) in
// __metadata__["cstorch.tensor_crc32.<name>"] (8 lowercase hex digits), checked when it is read,
// and the header itself has its CRC-32 in __metadata__["cstorch.header_crc32"] (over the header
// text with that value as "00000000"), required by those keys. Files of older versions
// ("cstorch.crc32.<name>", no header checksum) load with their tensors checked; files without
// these keys (other writers) load unchecked.
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <tuple>

#include "checkpoint/common.h"

namespace cstorch {
namespace ckpt {
namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::boolean:
      return "BOOL";
  }
  return "?";
}

std::optional<DType> st_dtype_from(const std::string& s) {
  for (int i = 0; i < kNumDTypes; ++i)
    if (s == st_dtype(static_cast<DType>(i))) return static_cast<DType>(i);
  return std::nullopt;
}

// Header size limit (the reference implementation uses 100 MB).
constexpr uint64_t kMaxHeader = 100u << 20;

// The metadata key holding the CRC-32 of tensor `name`'s bytes, as written with a header
// checksum (kHeaderCrcKey), which these keys make required: a bit flipped in the header
// checksum's own key name otherwise left a file that read as one without it. Files written
// before the header checksum existed use kOldCrcPrefix and are read without it.
const std::string kCrcPrefix = "cstorch.tensor_crc32.";
const std::string kOldCrcPrefix = "cstorch.crc32.";

// The metadata key holding the CRC-32 of the header itself (its JSON text with this value as
// "00000000"): the names, dtypes, shapes, offsets and cstorch_structure, which the tensors'
// checksums do not cover (a flipped bit there changed a step count or a key unnoticed).
const std::string kHeaderCrcKey = "cstorch.header_crc32";

// The header text with its own checksum's value zeroed, as it was checksummed; nullopt when the
// header holds no such key (a file of another writer, or of an older cstorch).
std::optional<std::pair<std::string, std::string>> header_for_crc(const std::string& h) {
  const std::string key = "\"" + kHeaderCrcKey + "\":\"";
  const size_t at = h.find(key);
  if (at == std::string::npos || at + key.size() + 8 > h.size()) return std::nullopt;
  std::string zeroed = h;
  zeroed.replace(at + key.size(), 8, "00000000");
  return std::make_pair(zeroed, h.substr(at + key.size(), 8));
}

std::optional<uint32_t> parse_crc(const std::string& s) {
  if (s.size() != 8) return std::nullopt;
  uint32_t v = 0;
  for (char c : s) {
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return std::nullopt;
    v = v << 4 | static_cast<uint32_t>(d);
  }
  return v;
}

class SafetensorsReader : public FormatReader {
 public:
  explicit SafetensorsReader(const std::string& p) : f_(p) {
    path = p;
    format = CheckpointFormat::SafeTensors;
    uint64_t n = 0;
    f_.read(0, &n, 8, "the header length");
    CS_CHECK(n >= 2 && n <= kMaxHeader && n <= f_.size() - 8,
             "checkpoint {}: safetensors header length {} is impossible for a {}-byte file", p, n,
             f_.size());
    data_start_ = 8 + n;
    uint64_t data_size = f_.size() - data_start_;
    const std::string text = f_.read_string(8, n, "the safetensors header");
    if (auto c = header_for_crc(text)) {
      auto want = parse_crc(c->second);
      CS_CHECK(want.has_value(), "checkpoint {}: safetensors metadata {} is not a CRC-32 ('{}')", p,
               kHeaderCrcKey, c->second);
      const uint32_t got = crc32(c->first.data(), c->first.size());
      CS_CHECK(got == *want,
               "checkpoint {}: the header is damaged (the safetensors header: tensor names, "
               "dtypes, shapes, offsets and structure): its CRC-32 is {:08x}, the file says "
               "{:08x}",
               p, got, *want);
    }
    Json h = parse_json(text, p, "safetensors header");
    CS_CHECK(h.is_object(), "checkpoint {}: the safetensors header is not a JSON object", p);
    std::map<std::string, int64_t> by_name;
    for (auto& item : h.items()) {
      // (Plain references, not a structured binding: C++20 lets the lambda below capture a
      // binding, but clang 14 does not implement that yet.)
      const std::string& name = item.key();
      auto& t = item.value();
      if (name == "__metadata__") continue;
      auto bad = [&](const std::string& what) {
        fail("checkpoint {}: safetensors entry '{}': {}", p, name, what);
      };
      if (!t.is_object()) bad("not an object");
      auto dt = t.find("dtype");
      auto sh = t.find("shape");
      auto off = t.find("data_offsets");
      if (dt == t.end() || !dt->is_string()) bad("no dtype");
      // F64 is read as f32 (CheckpointTensorInfo::file_dtype); other types are refused.
      const bool f64 = dt->get<std::string>() == "F64";
      auto dtype = f64 ? std::optional<DType>(DType::f32) : st_dtype_from(dt->get<std::string>());
      if (!dtype)
        bad(
            fmt::format("dtype {} is not supported (F32, BF16, F16, I32, I64, BOOL, and F64 as "
                        "f32, are)",
                        dt->get<std::string>()));
      if (sh == t.end() || !sh->is_array() || sh->size() > 64) bad("no shape");
      Shape shape;
      for (auto& d : *sh) {
        if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 62))
          bad("shape holds something other than a size");
        shape.push_back(d.get<int64_t>());
      }
      int64_t numel = checked_numel(shape, p, name);
      if (off == t.end() || !off->is_array() || off->size() != 2 ||
          !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
        bad("no data_offsets [begin, end]");
      uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
      uint64_t nbytes = static_cast<uint64_t>(numel) * (f64 ? 8 : itemsize(*dtype));
      if (b > e || e > data_size || e - b != nbytes)
        bad(fmt::format("data_offsets [{}, {}] do not fit {} bytes of data in a {}-byte buffer", b,
                        e, nbytes, data_size));
      by_name.emplace(name, static_cast<int64_t>(tensors_.size()));
      tensors_.push_back({name, *dtype, shape, b, e, std::nullopt, f64});
    }
    check_data_layout(p, data_size);
    // The nested structure, when cstorch wrote one.
    std::optional<Json> structure;
    if (auto m = h.find("__metadata__"); m != h.end()) {
      CS_CHECK(m->is_object(), "checkpoint {}: safetensors __metadata__ is not an object", p);
      if (auto s = m->find("cstorch_structure"); s != m->end()) {
        CS_CHECK(s->is_string(), "checkpoint {}: cstorch_structure metadata is not a string", p);
        structure = parse_json(s->get<std::string>(), p, "cstorch_structure metadata");
      }
      read_checksums(*m, by_name, p);
    }
    if (structure) {
      root = decode_structure(*structure, p, [&](const std::string& key, const Json& t) {
        auto ds = t.find("dataset");
        CS_CHECK(ds != t.end() && ds->is_string(),
                 "checkpoint {}: structure of tensor '{}' names no tensor", p, show_key(key));
        auto it = by_name.find(ds->get<std::string>());
        CS_CHECK(it != by_name.end(),
                 "checkpoint {}: tensor '{}' refers to '{}', which is not in the file", p,
                 show_key(key), ds->get<std::string>());
        return add_entry(key, it->second);
      });
    } else {
      root.kind = State::Kind::Map;
      for (size_t i = 0; i < tensors_.size(); ++i) {
        root.keys.push_back(tensors_[i].name);
        SNode leaf;
        leaf.kind = State::Kind::Tensor;
        leaf.tensor = add_entry(tensors_[i].name, static_cast<int64_t>(i));
        root.items.push_back(std::move(leaf));
      }
    }
    link_shared(entries);
  }

  Tensor read(const Entry& e) override {
    const auto& t = tensors_[static_cast<size_t>(e.storage)];
    verified = t.crc.has_value();
    // An F64 tensor's 8-byte values are read into `wide`, then rounded into the tensor.
    std::vector<char> wide(t.f64 ? static_cast<size_t>(t.end - t.begin) : 0);
    return make_host_tensor(t.shape, t.dtype, [&](void* tensor_dst) {
      void* dst = t.f64 ? wide.data() : tensor_dst;
      const size_t len = static_cast<size_t>(t.end - t.begin);
      f_.read(data_start_ + t.begin, dst, len, "tensor data");
      if (t.crc) {
        uint32_t crc = crc32(dst, len);
        CS_CHECK(crc == *t.crc,
                 "checkpoint {}: tensor '{}' (safetensors entry '{}') is damaged: its bytes fail "
                 "the CRC-32 check (stored {:08x}, computed {:08x})",
                 path, show_key(e.info.key), t.name, *t.crc, crc);
      }
      if (t.dtype == DType::boolean) {
        auto* b = static_cast<uint8_t*>(dst);
        for (int64_t i = 0; i < e.info.nbytes; ++i) b[i] = b[i] != 0;
      }
      if (t.f64)
        narrow_f64(wide.data(), static_cast<float*>(tensor_dst), numel(t.shape), path, e.info.key);
    });
  }

 private:
  struct T {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
    std::optional<uint32_t> crc;  // from __metadata__, when the writer stored one
    bool f64 = false;             // F64 in the file, read as f32
  };
  // The per-tensor CRC-32 keys. A file that has them has one for every tensor (a tensor
  // without one, or a key naming no tensor, means the header was damaged, e.g. a name changed).
  void read_checksums(const Json& meta, const std::map<std::string, int64_t>& by_name,
                      const std::string& p) {
    size_t found = 0;
    for (auto& [k, v] : meta.items()) {
      const std::string& prefix = k.rfind(kCrcPrefix, 0) == 0      ? kCrcPrefix
                                  : k.rfind(kOldCrcPrefix, 0) == 0 ? kOldCrcPrefix
                                                                   : std::string();
      if (prefix.empty()) continue;
      if (prefix == kCrcPrefix)
        CS_CHECK(meta.contains(kHeaderCrcKey),
                 "checkpoint {}: safetensors metadata {} comes with a header checksum ({}), "
                 "which is missing: the header is damaged",
                 p, k, kHeaderCrcKey);
      std::string name = k.substr(prefix.size());
      auto it = by_name.find(name);
      CS_CHECK(it != by_name.end(),
               "checkpoint {}: safetensors metadata {} holds the checksum of a tensor '{}' the "
               "file does not have: the header is damaged",
               p, k, name);
      auto crc = v.is_string() ? parse_crc(v.get<std::string>()) : std::nullopt;
      CS_CHECK(crc.has_value(),
               "checkpoint {}: safetensors metadata {} is not a CRC-32 (8 hex digits): the "
               "header is damaged",
               p, k);
      tensors_[static_cast<size_t>(it->second)].crc = crc;
      ++found;
    }
    if (found == 0) return;
    for (const auto& t : tensors_)
      CS_CHECK(t.crc.has_value(),
               "checkpoint {}: safetensors entry '{}' has no checksum (metadata {}{}) while the "
               "other tensors have one: the header is damaged",
               p, t.name, kCrcPrefix, t.name);
  }
  // As the format's reference implementation requires: the tensors' data, in offset order,
  // tiles the data buffer exactly, from its start to the end of the file, without gaps or
  // overlaps. A header length a few bytes off (the JSON still parses: the header's padding
  // is spaces) shifts the buffer, which this catches.
  void check_data_layout(const std::string& p, uint64_t data_size) const {
    std::vector<const T*> order;
    for (const auto& t : tensors_) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](const T* a, const T* b) {
      return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
    });
    uint64_t at = 0;
    for (const T* t : order) {
      if (t->begin != at)
        fail(
            "checkpoint {}: safetensors entry '{}': its data starts at byte {} of the data buffer "
            "where the previous tensor's data ends at byte {} ({}); the header (or its length) "
            "is damaged",
            p, t->name, t->begin, at, t->begin > at ? "a gap" : "an overlap");
      at = t->end;
    }
    if (at != data_size)
      fail(
          "checkpoint {}: safetensors {}: the tensors' data ends at byte {} of the data buffer "
          "but the buffer (the rest of the file after the header) holds {} bytes; the header "
          "length or the file size is wrong",
          p, order.empty() ? std::string("header") : "entry '" + order.back()->name + "'", at,
          data_size);
  }
  int64_t add_entry(const std::string& key, int64_t storage) {
    const T& t = tensors_[static_cast<size_t>(storage)];
    Entry e;
    e.info.key = key;
    e.info.dtype = t.dtype;
    e.info.shape = t.shape;
    e.info.nbytes = numel(t.shape) * static_cast<int64_t>(itemsize(t.dtype));
    if (t.f64) e.info.file_dtype = "float64";
    e.storage = storage;
    entries.push_back(std::move(e));
    return static_cast<int64_t>(entries.size() - 1);
  }
  FileReader f_;
  uint64_t data_start_ = 0;
  std::vector<T> tensors_;
};

}  // namespace

std::unique_ptr<FormatReader> open_safetensors(const std::string& path) {
  return std::make_unique<SafetensorsReader>(path);
}

}  // namespace ckpt

void save_safetensors(const State& state, const std::string& path_arg) {
  using namespace ckpt;
  const std::string path = save_path(path_arg, "save_safetensors");
  struct Item {
    std::string name;
    Tensor t;
  };
  std::vector<Item> items;
  std::map<const void*, std::string> stored;
  std::set<std::string> names;
  bool flat = state.is_map();
  Json structure = encode_structure(state, path, [&](const std::string& key, const Tensor& t) {
    CS_CHECK(t.defined(), "save {}: the tensor at key '{}' is undefined", path, show_key(key));
    Json shape = Json::array();
    for (auto d : t.shape()) shape.push_back(d);
    Json j{{"kind", "tensor"}, {"dtype", dtype_name(t.dtype())}, {"shape", shape}};
    auto it = stored.find(tensor_identity(t));
    if (it != stored.end()) {  // tied: the format forbids overlapping data, so store once
      j["dataset"] = it->second;
      flat = false;
      return j;
    }
    std::string name = key.empty() ? "tensor" : key, base = name;
    for (int i = 1; names.count(name) || name == "__metadata__"; ++i)
      name = base + "#" + std::to_string(i);
    if (name != key) flat = false;
    names.insert(name);
    stored.emplace(tensor_identity(t), name);
    items.push_back({name, t});
    j["dataset"] = name;
    return j;
  });
  if (flat)
    for (auto& v : state.items()) flat = flat && v.is_tensor();
  if (flat) flat = structure.at("keys").size() == items.size();

  // The header holds each tensor's CRC-32, known once its bytes have been read: it is written
  // with placeholders (the same length: 8 hex digits) and rewritten after the data.
  Json meta = Json::object();
  if (!flat) meta["cstorch_structure"] = structure.dump();
  for (auto& it : items) meta[kCrcPrefix + it.name] = "00000000";
  meta[kHeaderCrcKey] = "00000000";
  auto make_header = [&] {
    Json header = Json::object();
    header["__metadata__"] = meta;
    uint64_t off = 0;
    for (auto& it : items) {
      Json shape = Json::array();
      for (auto d : it.t.shape()) shape.push_back(d);
      uint64_t n = static_cast<uint64_t>(it.t.numel()) * itemsize(it.t.dtype());
      header[it.name] = Json{{"dtype", st_dtype(it.t.dtype())},
                             {"shape", shape},
                             {"data_offsets", Json::array({off, off + n})}};
      off += n;
    }
    std::string h = header.dump();
    h.append((8 - h.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the spec suggests
    return h;
  };
  const std::string h = make_header();
  AtomicFile out(path);
  {
    FileWriter w(out.temp_path(), path);
    uint64_t n = h.size();
    w.write(&n, 8);
    w.write(h.data(), h.size());
    for (auto& it : items) {
      const auto bytes = tensor_bytes(it.t, path, it.name);
      size_t nb = static_cast<size_t>(it.t.numel()) * itemsize(it.t.dtype());
      meta[kCrcPrefix + it.name] = fmt::format("{:08x}", crc32(bytes.data(), nb));
      w.write(bytes.data(), nb);
    }
    // The header's own checksum last, over the header with the tensors' checksums in it.
    meta[kHeaderCrcKey] = "00000000";
    const std::string zeroed = make_header();
    meta[kHeaderCrcKey] = fmt::format("{:08x}", crc32(zeroed.data(), zeroed.size()));
    const std::string final_header = make_header();
    CS_CHECK(final_header.size() == h.size(), "save {}: the header changed size", path);
    w.write_at(8, final_header.data(), final_header.size());
    w.close();
  }
  out.commit();
}

}  // namespace cstorch
