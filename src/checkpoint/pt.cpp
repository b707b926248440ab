// PyTorch's torch.save format, written and read without Python: a zip archive (entries stored
// uncompressed) holding `<prefix>/data.pkl` (a pickle, protocol 2, of the object with each
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
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>

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
// Zip writer (stored entries, zip64 when sizes or offsets need it, data 64-byte aligned as
// torch.save does).

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50,
                   kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;
constexpr uint64_t k32 = 0xFFFFFFFFu;

class ZipWriter {
 public:
  ZipWriter(const std::string& file, const std::string& shown) : w_(file, shown) {}

  void add(const std::string& name, const void* data, uint64_t n) {
    uint32_t crc = crc32(data, static_cast<size_t>(n));
    uint64_t off = w_.offset();
    bool z64 = n >= k32;
    std::string h;
    put<uint32_t>(h, kLocalSig);
    put<uint16_t>(h, z64 ? 45 : 20);  // version needed
    put<uint16_t>(h, 0);              // flags
    put<uint16_t>(h, 0);              // stored
    put<uint16_t>(h, 0);              // time
    put<uint16_t>(h, 0x21);           // date 1980-01-01
    put<uint32_t>(h, crc);
    put<uint32_t>(h, z64 ? static_cast<uint32_t>(k32) : static_cast<uint32_t>(n));
    put<uint32_t>(h, z64 ? static_cast<uint32_t>(k32) : static_cast<uint32_t>(n));
    put<uint16_t>(h, static_cast<uint16_t>(name.size()));
    std::string extra;
    if (z64) {
      put<uint16_t>(extra, 1);
      put<uint16_t>(extra, 16);
      put<uint64_t>(extra, n);
      put<uint64_t>(extra, n);
    }
    // Padding extra field ("FB", as PyTorch) so the data starts on a 64-byte boundary.
    uint64_t data_at = off + 30 + name.size() + extra.size() + 4;
    uint16_t pad = static_cast<uint16_t>((64 - data_at % 64) % 64);
    put<uint16_t>(extra, 0x4246);
    put<uint16_t>(extra, pad);
    extra.append(pad, 'Z');
    put<uint16_t>(h, static_cast<uint16_t>(extra.size()));
    h += name;
    h += extra;
    w_.write(h.data(), h.size());
    w_.write(data, static_cast<size_t>(n));
    entries_.push_back({name, crc, n, off});
  }

  void finish() {
    uint64_t cd_start = w_.offset();
    std::string cd;
    for (auto& e : entries_) {
      bool big_size = e.size >= k32, big_off = e.offset >= k32;
      std::string extra;
      if (big_size || big_off) {
        put<uint16_t>(extra, 1);
        put<uint16_t>(extra, static_cast<uint16_t>((big_size ? 16 : 0) + (big_off ? 8 : 0)));
        if (big_size) {
          put<uint64_t>(extra, e.size);
          put<uint64_t>(extra, e.size);
        }
        if (big_off) put<uint64_t>(extra, e.offset);
      }
      put<uint32_t>(cd, kCentralSig);
      put<uint16_t>(cd, 45);  // made by
      put<uint16_t>(cd, big_size || big_off ? 45 : 20);
      put<uint16_t>(cd, 0);
      put<uint16_t>(cd, 0);
      put<uint16_t>(cd, 0);
      put<uint16_t>(cd, 0x21);
      put<uint32_t>(cd, e.crc);
      put<uint32_t>(cd, big_size ? static_cast<uint32_t>(k32) : static_cast<uint32_t>(e.size));
      put<uint32_t>(cd, big_size ? static_cast<uint32_t>(k32) : static_cast<uint32_t>(e.size));
      put<uint16_t>(cd, static_cast<uint16_t>(e.name.size()));
      put<uint16_t>(cd, static_cast<uint16_t>(extra.size()));
      put<uint16_t>(cd, 0);  // comment
      put<uint16_t>(cd, 0);  // disk
      put<uint16_t>(cd, 0);  // internal attributes
      put<uint32_t>(cd, 0);  // external attributes
      put<uint32_t>(cd, big_off ? static_cast<uint32_t>(k32) : static_cast<uint32_t>(e.offset));
      cd += e.name;
      cd += extra;
    }
    uint64_t cd_size = cd.size(), count = entries_.size();
    bool z64 = count >= 0xFFFF || cd_start >= k32 || cd_size >= k32;
    if (z64) {
      uint64_t end64_at = cd_start + cd_size;
      put<uint32_t>(cd, kEnd64Sig);
      put<uint64_t>(cd, 44);
      put<uint16_t>(cd, 45);
      put<uint16_t>(cd, 45);
      put<uint32_t>(cd, 0);
      put<uint32_t>(cd, 0);
      put<uint64_t>(cd, count);
      put<uint64_t>(cd, count);
      put<uint64_t>(cd, cd_size);
      put<uint64_t>(cd, cd_start);
      put<uint32_t>(cd, kLocator64Sig);
      put<uint32_t>(cd, 0);
      put<uint64_t>(cd, end64_at);
      put<uint32_t>(cd, 1);
    }
    put<uint32_t>(cd, kEndSig);
    put<uint16_t>(cd, 0);
    put<uint16_t>(cd, 0);
    put<uint16_t>(cd, z64 ? 0xFFFF : static_cast<uint16_t>(count));
    put<uint16_t>(cd, z64 ? 0xFFFF : static_cast<uint16_t>(count));
    put<uint32_t>(cd, z64 ? static_cast<uint32_t>(k32) : static_cast<uint32_t>(cd_size));
    put<uint32_t>(cd, z64 ? static_cast<uint32_t>(k32) : static_cast<uint32_t>(cd_start));
    put<uint16_t>(cd, 0);
    w_.write(cd.data(), cd.size());
    w_.close();
  }

 private:
  struct E {
    std::string name;
    uint32_t crc;
    uint64_t size, offset;
  };
  FileWriter w_;
  std::vector<E> entries_;
};

// ---------------------------------------------------------------------------------------------
// Zip reader: central directory (zip64 aware); only stored (uncompressed) entries, which is
// what torch.save writes.

struct ZipEntry {
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t csize = 0, usize = 0, local = 0;
  uint64_t data = 0;  // resolved start of the data
};

class ZipReader {
 public:
  explicit ZipReader(FileReader& f) : f_(f) {
    const std::string& p = f.path();
    uint64_t size = f.size();
    CS_CHECK(size >= 22, "checkpoint {}: truncated zip file ({} bytes)", p, size);
    uint64_t tail_n = std::min<uint64_t>(size, 22 + 65535 + 20);
    std::string tail = f.read_string(size - tail_n, static_cast<size_t>(tail_n), "the zip end");
    size_t at = std::string::npos;
    for (size_t i = tail.size() - 22 + 1; i-- > 0;) {
      if (get<uint32_t>(tail, i) == kEndSig &&
          i + 22 + get<uint16_t>(tail, i + 20) == tail.size()) {
        at = i;
        break;
      }
    }
    CS_CHECK(at != std::string::npos,
             "checkpoint {}: no zip end record: the file is truncated or not a zip archive", p);
    uint64_t count = get<uint16_t>(tail, at + 10);
    uint64_t cd_size = get<uint32_t>(tail, at + 12);
    uint64_t cd_off = get<uint32_t>(tail, at + 16);
    if (count == 0xFFFF || cd_size == k32 || cd_off == k32) {
      CS_CHECK(at >= 20 && get<uint32_t>(tail, at - 20) == kLocator64Sig,
               "checkpoint {}: zip64 end locator missing", p);
      uint64_t end64 = get<uint64_t>(tail, at - 20 + 8);
      std::string e = f.read_string(end64, 56, "the zip64 end record");
      CS_CHECK(get<uint32_t>(e, 0) == kEnd64Sig, "checkpoint {}: damaged zip64 end record", p);
      count = get<uint64_t>(e, 32);
      cd_size = get<uint64_t>(e, 40);
      cd_off = get<uint64_t>(e, 48);
    }
    CS_CHECK(cd_off <= size && cd_size <= size - cd_off && count <= cd_size / 46 + 1,
             "checkpoint {}: damaged zip central directory ({} entries, {} bytes at {})", p, count,
             cd_size, cd_off);
    std::string cd = f.read_string(cd_off, static_cast<size_t>(cd_size), "the zip directory");
    size_t pos = 0;
    for (uint64_t i = 0; i < count; ++i) {
      CS_CHECK(pos + 46 <= cd.size() && get<uint32_t>(cd, pos) == kCentralSig,
               "checkpoint {}: damaged zip central directory entry {}", p, i);
      ZipEntry e;
      e.method = get<uint16_t>(cd, pos + 10);
      e.crc = get<uint32_t>(cd, pos + 16);
      e.csize = get<uint32_t>(cd, pos + 20);
      e.usize = get<uint32_t>(cd, pos + 24);
      size_t nlen = get<uint16_t>(cd, pos + 28), xlen = get<uint16_t>(cd, pos + 30),
             clen = get<uint16_t>(cd, pos + 32);
      e.local = get<uint32_t>(cd, pos + 42);
      CS_CHECK(pos + 46 + nlen + xlen + clen <= cd.size(),
               "checkpoint {}: damaged zip central directory entry {}", p, i);
      std::string name = cd.substr(pos + 46, nlen);
      // zip64 extra: the fields that were 0xFFFFFFFF, in order.
      size_t x = pos + 46 + nlen, xend = x + xlen;
      while (x + 4 <= xend) {
        uint16_t id = get<uint16_t>(cd, x), len = get<uint16_t>(cd, x + 2);
        CS_CHECK(x + 4 + len <= xend, "checkpoint {}: damaged zip extra field of {}", p, name);
        if (id == 1) {
          size_t q = x + 4, qend = x + 4 + len;
          auto next = [&](uint64_t& v) {
            if (v != k32) return;
            CS_CHECK(q + 8 <= qend, "checkpoint {}: damaged zip64 field of {}", p, name);
            v = get<uint64_t>(cd, q);
            q += 8;
          };
          next(e.usize);
          next(e.csize);
          next(e.local);
        }
        x += 4 + len;
      }
      pos += 46 + nlen + xlen + clen;
      entries_[name] = e;
      names_.push_back(name);
    }
  }

  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }

  // The entry's data location, validated (stored, in bounds).
  const ZipEntry& entry(const std::string& name) {
    auto it = entries_.find(name);
    CS_CHECK(it != entries_.end(), "checkpoint {}: the zip archive has no record {}", f_.path(),
             name);
    ZipEntry& e = it->second;
    if (e.data == 0) {
      CS_CHECK(e.method == 0 && e.csize == e.usize,
               "checkpoint {}: record {} is compressed (method {}); only the uncompressed "
               "records torch.save writes are supported",
               f_.path(), name, e.method);
      std::string h = f_.read_string(e.local, 30, "a zip local header");
      CS_CHECK(get<uint32_t>(h, 0) == kLocalSig, "checkpoint {}: damaged zip local header of {}",
               f_.path(), name);
      uint64_t data = e.local + 30 + get<uint16_t>(h, 26) + get<uint16_t>(h, 28);
      CS_CHECK(data <= f_.size() && e.usize <= f_.size() - data,
               "checkpoint {}: record {} ({} bytes) lies past the end of the file: truncated",
               f_.path(), name, e.usize);
      e.data = data;
    }
    return e;
  }

  std::string read_all(const std::string& name, uint64_t limit) {
    const ZipEntry& e = entry(name);
    CS_CHECK(e.usize <= limit, "checkpoint {}: record {} is implausibly large ({} bytes)",
             f_.path(), name, e.usize);
    std::string s = f_.read_string(e.data, static_cast<size_t>(e.usize), name.c_str());
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
  FileReader& f_;
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

  void value(const State& s, const std::string& key, int depth) {
    CS_CHECK(depth < kMaxDepth, "save {}: state nested deeper than {} levels at '{}'", path_,
             kMaxDepth, show_key(key));
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
      case State::Kind::Map:
        out += '}';
        if (s.size() > 0) {
          out += '(';
          for (size_t i = 0; i < s.size(); ++i) {
            CS_CHECK(valid_utf8(s.keys()[i]), "save {}: a key under '{}' is not valid UTF-8", path_,
                     show_key(key));
            string(s.keys()[i]);
            value(s.items()[i], join_key(key, s.keys()[i]), depth + 1);
          }
          out += 'u';  // SETITEMS
        }
        break;
    }
  }

 private:
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
    size_t item = itemsize(dt);
    const std::string record = prefix_ + "data/" + v.storage->s;
    const ZipEntry& z = zip_.entry(record);
    CS_CHECK(z.usize == static_cast<uint64_t>(v.storage->numel) * item,
             "checkpoint {}: storage {} of tensor '{}' holds {} bytes, expected {}", path,
             v.storage->s, show_key(e.info.key), z.usize, v.storage->numel * item);
    int64_t n = e.info.nbytes / static_cast<int64_t>(item);
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
    Tensor t = make_host_tensor(v.shape, dt, [&](void* dst) {
      if (contiguous) {
        const uint64_t len = static_cast<uint64_t>(n) * item;
        f_.read(z.data + begin, dst, static_cast<size_t>(len), "tensor data");
        if (check) {
          uint32_t crc = crc_span(z.data, begin, 0);
          crc = crc32(dst, static_cast<size_t>(len), crc);
          crc = crc_span(z.data + begin + len, z.usize - begin - len, crc);
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
        std::string span = f_.read_string(z.data + from, static_cast<size_t>(len), "tensor data");
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
      case PyObj::T::Dict:
        n.kind = State::Kind::Map;
        for (auto& [k, v] : o->dict) {
          std::string ks;
          if (k->t == PyObj::T::Str)
            ks = k->s;
          else if (k->t == PyObj::T::Int)  // optimizer state is keyed by parameter index
            ks = std::to_string(k->i);
          else
            fail("checkpoint {}: a dict under '{}' has a key that is not a string or integer", path,
                 show_key(key));
          CS_CHECK(std::find(n.keys.begin(), n.keys.end(), ks) == n.keys.end(),
                   "checkpoint {}: key '{}' appears twice under '{}'", path, ks, show_key(key));
          n.items.push_back(convert(v, join_key(key, ks), depth + 1));
          n.keys.push_back(std::move(ks));
        }
        break;
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
    CS_CHECK(st->dtype.has_value(),
             "checkpoint {}: tensor '{}' has dtype {} ({}), which cstorch does not support (f32, "
             "bf16, f16, i32, i64 and bool are); convert it in PyTorch before saving",
             path, show_key(key), st->s2, st->s2 == "DoubleStorage" ? "float64" : "other");
    DType dt = *st->dtype;
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
    e.storage = id;
    entries.push_back(std::move(e));
    return static_cast<int64_t>(entries.size() - 1);
  }

  // Continues `crc` over `n` bytes of the file at `at` (read in blocks).
  uint32_t crc_span(uint64_t at, uint64_t n, uint32_t crc) const {
    std::vector<char> buf(static_cast<size_t>(std::min<uint64_t>(n, 4 << 20)));
    while (n > 0) {
      size_t k = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
      f_.read(at, buf.data(), k, "tensor data");
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
