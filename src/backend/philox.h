// Philox 4x32-10 (Salmon et al., SC'11): the counter-based generator behind every random draw
// and attention dropout, on every backend. Element i of a draw is block philox({offset, i},
// seed), so a value depends only on (seed, offset, i), never on which thread computes it; one
// implementation for the CPU's kernels (plain C++) and the CUDA kernels (host and device
// functions under nvcc) keeps a GPU's draws and dropout masks bitwise the CPU's.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define CS_PHILOX_HD __host__ __device__
#else
#define CS_PHILOX_HD
#endif

namespace cstorch::rng {

struct PhiloxBlock {
  uint32_t w[4];
};

// The high and low 32 bits of a * b.
CS_PHILOX_HD inline void philox_mul(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
#if defined(__CUDA_ARCH__)
  *hi = __umulhi(a, b);
  *lo = a * b;
#else
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
#endif
}

CS_PHILOX_HD inline PhiloxBlock philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                       uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  // Straight-line rounds let the CPU's per-element loops vectorise.
#if defined(__CUDA_ARCH__)
#pragma unroll
#elif defined(__GNUC__) && !defined(__CUDACC__)
#pragma GCC unroll 10
#endif
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    philox_mul(kM0, c0, &hi0, &lo0);
    philox_mul(kM1, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

// The generator state tensor's value (i64 {seed, offset}) as a keyed stream.
struct PhiloxStream {
  uint32_t k0, k1;  // seed
  uint32_t o0, o1;  // offset
  CS_PHILOX_HD PhiloxBlock at(int64_t i) const {
    const uint64_t u = static_cast<uint64_t>(i);
    return philox(o0, o1, static_cast<uint32_t>(u), static_cast<uint32_t>(u >> 32), k0, k1);
  }
  CS_PHILOX_HD static PhiloxStream from(int64_t seed, int64_t offset) {
    const uint64_t s = static_cast<uint64_t>(seed), o = static_cast<uint64_t>(offset);
    return PhiloxStream{static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32),
                        static_cast<uint32_t>(o), static_cast<uint32_t>(o >> 32)};
  }
  // The state as it lies in the memory of the kernel's device (the generator state input of an
  // op): host memory for the CPU's kernels, device memory for the CUDA kernels.
  CS_PHILOX_HD static PhiloxStream of(const void* state) {
    const int64_t* s = static_cast<const int64_t*>(state);
    return from(s[0], s[1]);
  }
};

}  // namespace cstorch::rng

#undef CS_PHILOX_HD
