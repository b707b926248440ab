// The AVX2 variant's vector math (vec_math.h, elementwise_math.h) and the scalar forms it must
// equal, both compiled here with that variant's flags (tests/CMakeLists.txt: -march=x86-64-v3),
// for CpuVariants.Avx2VectorMathIsBitwiseTheScalarForms. Only called where the CPU has AVX2 and
// FMA. The headers' namespace is renamed for this file: its copies of their inline functions
// differ from the copies other test files compile for the baseline, and must not be merged with
// them at link time.
#include "unit/device/avx2_math_ref.h"

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#define cpu cpu_avx2_ref
#include "backend/cpu/elementwise_math.h"
#undef cpu

namespace avx2_ref {

namespace m = cstorch::cpu_avx2_ref;

bool vector_code() {
  return CSTORCH_AVX2_KERNELS == 1;
}
void vector_gelu(const float* x, float* o, int64_t n) {
  m::gelu_tanh_n(x, o, n);
}
void scalar_gelu(const float* x, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = m::gelu_tanh(x[i]);
}
void vector_gelu_grad(const float* dy, const float* x, float* o, int64_t n) {
  m::gelu_tanh_grad_n(dy, x, o, n);
}
void scalar_gelu_grad(const float* dy, const float* x, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = m::gelu_tanh_grad(dy[i], x[i]);
}
void vector_exp(const float* x, float* o, int64_t n, float shift) {
  m::vexp_n(x, o, n, shift);
}
void scalar_exp(const float* x, float* o, int64_t n, float shift) {
  for (int64_t i = 0; i < n; ++i) o[i] = m::vexp(x[i] - shift);
}

}  // namespace avx2_ref
