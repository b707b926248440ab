// CPU kernels for random draws: Philox 4x32-10 (Salmon et al., SC'11) keyed by the seed, one
// block per element with counter {offset, element index}. An element's value therefore depends
// only on (seed, offset, index), never on the thread count or the chunking.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cpu/dtype_dispatch.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "backend/philox.h"

namespace cstorch::cpu {

namespace {

// Each element runs 10 Philox rounds, so chunks can be smaller than for plain arithmetic.
constexpr int64_t kRandomGrain = kElementwiseGrain / 8;

using Block = rng::PhiloxBlock;
using Stream = rng::PhiloxStream;
using rng::philox;

Stream stream_of(const void* state) {
  return Stream::of(state);
}

// Mantissa bits of T: a uniform built from that many random bits is exact in T and < 1.
template <class T>
constexpr int mantissa_digits() {
  if constexpr (std::is_same_v<T, bf16_t>)
    return 8;
  else if constexpr (std::is_same_v<T, f16_t>)
    return 11;
  else
    return 24;
}

constexpr float k2Pow24Inv = 1.0f / 16777216.0f;

}  // namespace

// Exposed for the known-answer test of the generator.
void philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  Block b = philox(ctr[0], ctr[1], ctr[2], ctr[3], key[0], key[1]);
  for (int i = 0; i < 4; ++i) out[i] = b.w[i];
}

void cpu_RandUniform(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                     void* out) {
  const Stream s = stream_of(in[0]);
  const auto& a = n.attr<ir::RandomAttrs>();
  const float low = static_cast<float>(a.a), range = static_cast<float>(a.b - a.a);
  dispatch_float(n.dtype, "rand_uniform", [&]<class T>(T*) {
    constexpr int digits = mantissa_digits<T>();
    const float scale = std::ldexp(1.0f, -digits);
    T* o = static_cast<T*>(out);
    parallel_for(n.numel(), kRandomGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        float u = static_cast<float>(s.at(i).w[0] >> (32 - digits)) * scale;
        o[i] = store<T>(low + range * u);
      }
    });
  });
}

// Box-Muller on the first two words of element i's block; u1 in (0, 1] keeps log finite.
void cpu_RandNormal(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                    void* out) {
  const Stream s = stream_of(in[0]);
  const auto& a = n.attr<ir::RandomAttrs>();
  const float mean = static_cast<float>(a.a), stdev = static_cast<float>(a.b);
  constexpr float kTwoPi = static_cast<float>(2.0 * M_PI);
  dispatch_float(n.dtype, "rand_normal", [&]<class T>(T*) {
    T* o = static_cast<T*>(out);
    parallel_for(n.numel(), kRandomGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        Block r = s.at(i);
        float u1 = static_cast<float>((r.w[0] >> 8) + 1) * k2Pow24Inv;
        float u2 = static_cast<float>(r.w[1] >> 8) * k2Pow24Inv;
        float z = std::sqrt(-2.0f * std::log(u1)) * std::cos(kTwoPi * u2);
        o[i] = store<T>(mean + stdev * z);
      }
    });
  });
}

void cpu_Bernoulli(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                   void* out) {
  const Stream s = stream_of(in[0]);
  const double p = n.attr<ir::RandomAttrs>().a;
  dispatch_all(n.dtype, [&]<class T>(T*) {
    T* o = static_cast<T*>(out);
    const T one = from_double<T>(1.0), zero = from_double<T>(0.0);
    parallel_for(n.numel(), kRandomGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
      for (int64_t i = b; i < e; ++i) {
        double u = static_cast<double>(s.at(i).w[0] >> 8) * (1.0 / 16777216.0);
        o[i] = u < p ? one : zero;
      }
    });
  });
}

}  // namespace cstorch::cpu
