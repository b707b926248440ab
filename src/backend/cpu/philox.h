// Philox 4x32-10 (Salmon et al., SC'11): the counter-based generator behind every random draw
// (random.cpp) and attention dropout (attention.cpp). Element i of a draw is block
// philox({offset, i}, seed), so a value depends only on (seed, offset, i).
#pragma once
#include <cstdint>

namespace cstorch::cpu {

struct PhiloxBlock {
  uint32_t w[4];
};

inline PhiloxBlock philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0,
                          uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  // Straight-line rounds let the per-element loops vectorise.
#pragma GCC unroll 10
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    uint32_t n1 = static_cast<uint32_t>(p1);
    uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  return PhiloxBlock{{c0, c1, c2, c3}};
}

// The generator state tensor's value (i64 {seed, offset}) as a keyed stream.
struct PhiloxStream {
  uint32_t k0, k1;  // seed
  uint32_t o0, o1;  // offset
  PhiloxBlock at(int64_t i) const {
    uint64_t u = static_cast<uint64_t>(i);
    return philox(o0, o1, static_cast<uint32_t>(u), static_cast<uint32_t>(u >> 32), k0, k1);
  }
  static PhiloxStream of(const void* state) {
    const int64_t* s = static_cast<const int64_t*>(state);
    uint64_t seed = static_cast<uint64_t>(s[0]), off = static_cast<uint64_t>(s[1]);
    return PhiloxStream{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32),
                        static_cast<uint32_t>(off), static_cast<uint32_t>(off >> 32)};
  }
};

}  // namespace cstorch::cpu
