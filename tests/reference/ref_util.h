// Helpers shared by the PyTorch reference tests: a small deterministic RNG (independent of
// cstorch's generator), JSON encoding of tensors, and running the reference Python scripts.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "cstorch/tensor.h"

#ifndef CSTORCH_PYTHON
#define CSTORCH_PYTHON "/usr/bin/python3"
#endif
#ifndef CSTORCH_SOURCE_DIR
#define CSTORCH_SOURCE_DIR "."
#endif

namespace cstorch::reftest {

using json = nlohmann::json;

// SplitMix64: tiny, deterministic, seedable per row.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() {
    return static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
  }  // [0, 1)
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int64_t integer(int64_t lo, int64_t hi) {  // [lo, hi)
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo));
  }

 private:
  uint64_t s_;
};

inline uint64_t hash_name(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Rounds `v` to the nearest value representable in `t` (as torch's .to(t) does).
inline double round_to(double v, DType t) {
  switch (t) {
    case DType::f32:
      return static_cast<double>(static_cast<float>(v));
    case DType::bf16:
      return static_cast<float>(bf16_t(static_cast<float>(v)));
    case DType::f16:
      return static_cast<float>(f16_t(static_cast<float>(v)));
    case DType::i32:
    case DType::i64:
      return std::trunc(v);
    case DType::boolean:
      return v != 0 ? 1.0 : 0.0;
  }
  return v;
}

// A cstorch tensor of dtype `t` holding `v` (values already representable in `t`).
inline Tensor make_tensor(const std::vector<double>& v, const Shape& s, DType t) {
  size_t n = v.size();
  switch (t) {
    case DType::f32: {
      std::vector<float> b(n);
      for (size_t i = 0; i < n; ++i) b[i] = static_cast<float>(v[i]);
      return from_blob(b.data(), s, t);
    }
    case DType::bf16: {
      std::vector<bf16_t> b(n);
      for (size_t i = 0; i < n; ++i) b[i] = bf16_t(static_cast<float>(v[i]));
      return from_blob(b.data(), s, t);
    }
    case DType::f16: {
      std::vector<f16_t> b(n);
      for (size_t i = 0; i < n; ++i) b[i] = f16_t(static_cast<float>(v[i]));
      return from_blob(b.data(), s, t);
    }
    case DType::i32: {
      std::vector<int32_t> b(n);
      for (size_t i = 0; i < n; ++i) b[i] = static_cast<int32_t>(v[i]);
      return from_blob(b.data(), s, t);
    }
    case DType::i64: {
      std::vector<int64_t> b(n);
      for (size_t i = 0; i < n; ++i) b[i] = static_cast<int64_t>(v[i]);
      return from_blob(b.data(), s, t);
    }
    case DType::boolean: {
      std::vector<uint8_t> b(n);
      for (size_t i = 0; i < n; ++i) b[i] = v[i] != 0;
      return from_blob(b.data(), s, t);
    }
  }
  return Tensor();
}

// Finite numbers as JSON numbers; NaN and infinities as the strings "nan", "inf", "-inf".
inline json encode_values(const std::vector<double>& v) {
  json a = json::array();
  for (double d : v) {
    if (std::isnan(d))
      a.push_back("nan");
    else if (std::isinf(d))
      a.push_back(d > 0 ? "inf" : "-inf");
    else
      a.push_back(d);
  }
  return a;
}
inline double decode_value(const json& j) {
  if (j.is_string()) {
    auto s = j.get<std::string>();
    if (s == "nan") return NAN;
    return s == "inf" ? INFINITY : -INFINITY;
  }
  return j.get<double>();
}

// Host values of a tensor as doubles (exact for every dtype cstorch has, ints up to 2^53).
inline std::vector<double> host_values(const Tensor& t) {
  return t.to_vector<double>();
}

inline json tensor_json(const Shape& s, DType t, const std::vector<double>& v) {
  return json{{"shape", s}, {"dtype", dtype_name(t)}, {"data", encode_values(v)}};
}
inline json tensor_json(const Tensor& t) {
  return tensor_json(t.shape(), t.dtype(), host_values(t));
}

// A fresh directory under the system temp dir.
inline std::filesystem::path make_temp_dir(const std::string& tag) {
  auto p = std::filesystem::temp_directory_path() /
           ("cstorch_" + tag + "_" + std::to_string(static_cast<long>(::getpid())));
  std::filesystem::create_directories(p);
  return p;
}

inline void write_json(const std::filesystem::path& p, const json& j) {
  std::ofstream f(p);
  f << j.dump();
}
inline json read_json(const std::filesystem::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

// Runs a shell command, returns its exit status and (stdout + stderr) in *out.
inline int run_command(const std::string& cmd, std::string* out) {
  std::string full = cmd + " 2>&1";
  FILE* p = ::popen(full.c_str(), "r");
  if (!p) {
    if (out) *out = "popen failed";
    return -1;
  }
  std::array<char, 4096> buf;
  std::string s;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) s.append(buf.data(), n);
  int rc = ::pclose(p);
  if (out) *out = s;
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

inline std::string shell_quote(const std::string& s) {
  std::string r = "'";
  for (char c : s) {
    if (c == '\'')
      r += "'\\''";
    else
      r += c;
  }
  return r + "'";
}

// The interpreter with torch: $CSTORCH_PYTHON when set, else the one configured at build time.
inline std::string python_path() {
  const char* env = std::getenv("CSTORCH_PYTHON");
  return env && *env ? std::string(env) : std::string(CSTORCH_PYTHON);
}

// Empty when python_path() can import torch; otherwise a message that says what to do.
inline std::string torch_unavailable_reason() {
  static const std::string reason = [] {
    std::string out;
    int rc = run_command(
        shell_quote(python_path()) + " -c 'import torch; print(torch.__version__)'", &out);
    if (rc == 0) return std::string();
    return "the PyTorch reference needs " + python_path() +
           " with torch installed, which failed (exit " + std::to_string(rc) + "): " + out +
           "\nRun scripts/setup.sh (installs python3 and python3-torch), or configure with "
           "-DCSTORCH_PYTHON=<python with torch>.";
  }();
  return reason;
}

// Runs tests/reference/<script> with `args`; returns the exit status, output in *out.
inline int run_reference_script(const std::string& script, const std::vector<std::string>& args,
                                std::string* out) {
  std::string cmd = shell_quote(python_path()) + " " +
                    shell_quote(std::string(CSTORCH_SOURCE_DIR) + "/tests/reference/" + script);
  for (auto& a : args) cmd += " " + shell_quote(a);
  return run_command(cmd, out);
}

}  // namespace cstorch::reftest
