// DType tables and the binary16 conversions.
#include "cstorch/core/dtype.h"

#include <cmath>

#include "cstorch/core/error.h"

namespace cstorch {

size_t itemsize(DType t) {
  switch (t) {
    case DType::f32:
      return 4;
    case DType::bf16:
      return 2;
    case DType::f16:
      return 2;
    case DType::i32:
      return 4;
    case DType::i64:
      return 8;
    case DType::boolean:
      return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::bf16:
      return "bf16";
    case DType::f16:
      return "f16";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::boolean:
      return "bool";
  }
  return "?";
}

static int rank(DType t) {
  switch (t) {
    case DType::boolean:
      return 0;
    case DType::i32:
      return 1;
    case DType::i64:
      return 2;
    case DType::f16:
      return 3;
    case DType::bf16:
      return 3;
    case DType::f32:
      return 4;
  }
  return 0;
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::bf16 && b == DType::f16) || (a == DType::f16 && b == DType::bf16))
    return DType::f32;
  return rank(a) >= rank(b) ? a : b;
}

uint16_t f16_t::from_float(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) {  // rounds to >= 65520 -> inf
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (absx < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
    // value = absx as float; half subnormal unit is 2^-24.
    float af;
    std::memcpy(&af, &absx, 4);
    float scaled = af * 16777216.0f;  // / 2^-24, exact
    // round to nearest even
    float r = std::nearbyint(scaled);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t mant = absx & 0x7fffffu;
  uint32_t exp = (absx >> 23) - 127 + 15;
  uint32_t h = (exp << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1;  // may carry into exponent: fine
  return static_cast<uint16_t>(sign | h);
}

float f16_t::to_float(uint16_t bits) {
  uint32_t sign = (static_cast<uint32_t>(bits) & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t out;
  if (exp == 0) {
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
    std::memcpy(&out, &v, 4);
    out |= sign;
  } else if (exp == 31) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace cstorch
