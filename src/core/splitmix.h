// SplitMix64: the finaliser (a bijective 64-bit mix) and the counter generator built on it.
// Deterministic on every machine; used where data order or synthetic data must not depend on
// the thread count (shuffling, the synthetic-digits generator).
#pragma once
#include <cstdint>

namespace cstorch {

inline constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Advances `state` and returns the next 64 random bits.
inline uint64_t splitmix64_next(uint64_t& state) {
  return mix64(state += kGoldenGamma);
}

}  // namespace cstorch
