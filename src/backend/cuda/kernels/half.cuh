// 16-bit float storage for the kernels and its conversions, as __host__ __device__ integer code
// so that a host program can compare every bit pattern with the CPU's bf16_t / f16_t
// (include/cstorch/core/dtype.h) without a GPU. Kernels that read 16-bit values compute in
// float, as the CPU's do (load: exact widening; store: one rounding to nearest even). C++17, no
// CUDA header needed (see launch.h).
//
// The conversions are written out rather than taken from cuda_bf16.h / cuda_fp16.h so that NaNs
// come out as the CPU's: bf16 keeps the upper payload bits and sets the quiet bit; f16 does what
// the CPU's F16C instructions (vcvtps2ph / vcvtph2ps, used by every x86-64-v3 and v4 build) do:
// keep the upper payload bits and set the quiet bit in both directions.
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "backend/cuda/kernels/host_device.h"

namespace cstorch::cuda::k {

// Storage types of bf16 and f16 elements (the bits, two bytes each, as the CPU stores them).
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

CS_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
CS_HD inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Round to nearest even; a NaN keeps its upper payload and becomes quiet. Values that round
// past the largest finite bf16 become infinity (the carry runs into the exponent).
CS_HD inline uint16_t f32_to_bf16_bits(float f) {
  const uint32_t v = float_bits(f);
  if ((v & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((v >> 16) | 0x40u);
  return static_cast<uint16_t>((v + 0x7fffu + ((v >> 16) & 1u)) >> 16);
}
CS_HD inline float bf16_bits_to_f32(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

// IEEE binary16, round to nearest even, subnormals kept; values from 65520 up become infinity.
CS_HD inline uint16_t f32_to_f16_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a >= 0x38800000u) {  // a normal half: drop 13 mantissa bits, rounding to nearest even
    const uint32_t h = (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu);
    const uint32_t rem = a & 0x1fffu;
    // A carry out of the mantissa moves into the exponent, which is the right result.
    return static_cast<uint16_t>(sign | (h + (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))));
  }
  if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // at most 2^-25: rounds to zero
  // A subnormal half: the value in units of 2^-24 is m * 2^(e - 126), e in [102, 112], so the
  // significand shifts right by 126 - e (14 to 24 bits), rounding to nearest even.
  const uint32_t m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - (a >> 23);
  const uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  return static_cast<uint16_t>(sign | (q + (rem > half || (rem == half && (q & 1u)))));
}
CS_HD inline float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (e == 0)  // zero or subnormal: mant * 2^-24, exact in float
    return bits_float(sign | float_bits(static_cast<float>(mant) * 5.9604644775390625e-8f));
  if (e == 31) return bits_float(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  return bits_float(sign | ((e + 112u) << 23) | (mant << 13));
}

// load: an element as the float the kernels compute in; store: a float rounded to the element
// type. Identities for float.
CS_HD inline float load(float v) {
  return v;
}
CS_HD inline float load(bf16 v) {
  return bf16_bits_to_f32(v.bits);
}
CS_HD inline float load(f16 v) {
  return f16_bits_to_f32(v.bits);
}
template <class T>
CS_HD inline T store(float v) {
  if constexpr (std::is_same_v<T, bf16>)
    return bf16{f32_to_bf16_bits(v)};
  else if constexpr (std::is_same_v<T, f16>)
    return f16{f32_to_f16_bits(v)};
  else
    return v;
}

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bf16> || std::is_same_v<T, f16>;

}  // namespace cstorch::cuda::k
