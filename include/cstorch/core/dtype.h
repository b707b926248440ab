// Element types (f32, bf16, f16, i32, i64, bool), their sizes, promotion rules and the 16-bit
// float storage types with round-to-nearest-even conversion from float.
#pragma once
#include <cstdint>
#include <cstring>
#if defined(__F16C__)
#include <immintrin.h>
#endif
#include <string>

namespace cstorch {

enum class DType : uint8_t { f32, bf16, f16, i32, i64, boolean };
inline constexpr int kNumDTypes = 6;

size_t itemsize(DType t);
const char* dtype_name(DType t);  // "f32", "bf16", "f16", "i32", "i64", "bool"
inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::bf16 || t == DType::f16;
}
inline bool is_integral(DType t) {
  return t == DType::i32 || t == DType::i64;
}
// PyTorch-style promotion of two tensor dtypes: bool < ints < floats; bf16+f16 -> f32.
DType promote_types(DType a, DType b);

// bfloat16 storage: upper 16 bits of an IEEE float, rounded to nearest even.
struct bf16_t {
  uint16_t bits = 0;
  bf16_t() = default;
  explicit bf16_t(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = static_cast<uint16_t>((u >> 16) | 0x40);  // keep NaN a quiet NaN
    } else {
      u += 0x7fffu + ((u >> 16) & 1u);
      bits = static_cast<uint16_t>(u >> 16);
    }
  }
  operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// IEEE binary16 storage with round-to-nearest-even conversion (handles subnormals, inf, NaN).
// With F16C (x86, -march=native) the conversions are single instructions, inline, so 16-bit
// kernels and casts run at memory speed; otherwise the portable bit-level versions are used.
struct f16_t {
  uint16_t bits = 0;
  f16_t() = default;
#if defined(__F16C__)
  explicit f16_t(float f)
      : bits(static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC))) {}
  operator float() const {
    return _cvtsh_ss(bits);
  }
#else
  explicit f16_t(float f) : bits(from_float(f)) {}
  operator float() const {
    return to_float(bits);
  }
#endif
  static uint16_t from_float(float f);  // portable conversions (also used by tests)
  static float to_float(uint16_t h);
};

}  // namespace cstorch
