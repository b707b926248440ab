// Helpers shared by the unit tests (and the reference tests): deterministic test data, tensor
// constructors, near-equality and error-message checks, sample moments, and a gradient checker
// against central finite differences.
#pragma once
#include <gtest/gtest.h>

#include <unistd.h>

#include <zlib.h>
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "cstorch/tensor.h"

namespace cstorch::testing {

// A whole file's bytes, and writing them (binary, truncating).
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}
inline void write_file(const std::filesystem::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}
// The ZIP / PNG CRC-32 of `s` (zlib's).
inline uint32_t crc32_of(const std::string& s) {
  return static_cast<uint32_t>(
      ::crc32_z(0, reinterpret_cast<const unsigned char*>(s.data()), s.size()));
}

// An empty folder in the temp directory, unique to this process: `<prefix>_<name>_<pid>`.
inline std::filesystem::path temp_dir(const std::string& prefix, const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           (prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

using F = std::vector<float>;
using D = std::vector<double>;
using I = std::vector<int64_t>;
using B = std::vector<uint8_t>;

// Deterministic values in [lo, hi) (tests must not depend on the RNG family).
inline F rvals(int64_t n, double lo, double hi, uint32_t seed) {
  F v(static_cast<size_t>(n));
  uint64_t s = 0x9E3779B97F4A7C15ull * (seed + 1);
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>(lo + (hi - lo) * static_cast<double>(s >> 11) * 0x1.0p-53);
  }
  return v;
}

// f32 tensor of shape `s` filled with rvals(numel(s), lo, hi, seed).
inline Tensor rt(const Shape& s, uint32_t seed = 1, double lo = -1, double hi = 1) {
  return from_vector(rvals(numel(s), lo, hi, seed), s);
}

// f32 tensor of shape `s` holding `v`.
inline Tensor fv(F v, Shape s) {
  return from_vector(v, s);
}
// 1-d f32 tensor holding `v`.
inline Tensor fv(F v) {
  int64_t n = static_cast<int64_t>(v.size());
  return from_vector(v, {n});
}
// i64 tensor of shape `s` holding `v`.
inline Tensor iv(I v, Shape s) {
  return from_vector(v, s);
}
// 1-d i64 tensor holding `v`.
inline Tensor iv(I v) {
  int64_t n = static_cast<int64_t>(v.size());
  return from_vector(v, {n});
}
// bool tensor of shape `s` holding `v` (0 / 1).
inline Tensor bv(B v, Shape s) {
  return from_vector(v, s, DType::boolean);
}
// 1-d bool tensor holding `v` (0 / 1).
inline Tensor bv(B v) {
  int64_t n = static_cast<int64_t>(v.size());
  return from_vector(v, {n}, DType::boolean);
}

// Expects |got[i] - want[i]| <= tol * (1 + |want[i]|) for every i (a NaN in `want` needs a NaN).
inline void expect_close(const D& got, const D& want, double tol, const std::string& what = "") {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {  // e.g. var with correction 1 over a size-1 dim
      EXPECT_TRUE(std::isnan(got[i])) << what << " element " << i;
      continue;
    }
    EXPECT_NEAR(got[i], want[i], tol * (1 + std::fabs(want[i]))) << what << " element " << i;
  }
}

// Runs `f` and expects it to throw a cstorch::Error whose message contains each of `parts`.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

// The message of the cstorch::Error `f` throws, or "no error" when it throws none (for tests that
// compare whole messages).
inline std::string error_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// Expects `stmt` to throw a cstorch::Error whose message contains every string that follows it.
#define EXPECT_ERROR(stmt, ...)                                     \
  do {                                                              \
    SCOPED_TRACE("EXPECT_ERROR(" #stmt ")");                        \
    ::cstorch::testing::expect_error([&] { stmt; }, {__VA_ARGS__}); \
  } while (0)

// Checks backward() of sum(G * f(inputs)), G fixed, against central differences of f. Integer
// inputs (targets, indices) are passed through and not differentiated.
inline void check_grad(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                       const std::vector<Tensor>& inputs, double eps = 1e-2, double rtol = 1e-2,
                       double atol = 1e-4) {
  std::vector<Tensor> leaves;
  for (const auto& t : inputs) {
    if (!is_floating(t.dtype())) {
      leaves.push_back(t);
      continue;
    }
    Tensor l = from_vector(t.to_vector<float>(), t.shape());
    l.set_requires_grad();
    leaves.push_back(l);
  }
  Tensor y = f(leaves);
  Tensor g = from_vector(rvals(y.numel(), -1, 1, 77), y.shape());
  F gv = g.to_vector<float>();
  y.backward(g);
  auto objective = [&](const std::vector<Tensor>& xs) {
    NoGradGuard ng;
    D v = f(xs).to_vector<double>();
    double s = 0;
    for (size_t i = 0; i < v.size(); ++i) s += gv[i] * v[i];
    return s;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!is_floating(inputs[i].dtype())) continue;
    F base = inputs[i].to_vector<float>();
    Tensor gi = leaves[i].grad();
    ASSERT_TRUE(gi.defined()) << "no gradient for input " << i;
    ASSERT_EQ(gi.shape(), inputs[i].shape());
    F an = gi.to_vector<float>();
    for (size_t j = 0; j < base.size(); ++j) {
      auto eval = [&](double d, double& moved) {
        F p = base;
        p[j] = static_cast<float>(base[j] + d);
        moved = static_cast<double>(p[j]) - base[j];
        std::vector<Tensor> xs = inputs;
        xs[i] = from_vector(p, inputs[i].shape());
        return objective(xs);
      };
      double hp, hm;
      double fp = eval(eps, hp), fm = eval(-eps, hm);
      double num = (fp - fm) / (hp - hm);
      EXPECT_NEAR(an[j], num, atol + rtol * std::fabs(num)) << "input " << i << " element " << j;
    }
  }
}

// Sample mean, variance (correction 1), min and max of a tensor's elements.
struct Moments {
  double mean = 0, var = 0, min = INFINITY, max = -INFINITY;
};
inline Moments moments(const Tensor& t) {
  auto v = t.to_vector<double>();
  Moments m;
  for (double x : v) {
    m.mean += x;
    m.min = std::min(m.min, x);
    m.max = std::max(m.max, x);
  }
  m.mean /= static_cast<double>(v.size());
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= static_cast<double>(v.size() - 1);
  return m;
}

}  // namespace cstorch::testing
