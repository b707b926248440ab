// The AVX2 variant's vector math and its scalar forms, compiled with that variant's flags
// (avx2_math_ref.cpp). Call only where the CPU has AVX2 and FMA.
#pragma once
#include <cstdint>

namespace avx2_ref {

// Whether the AVX2 vector code was compiled in (the vector functions are otherwise the scalar
// loops themselves).
bool vector_code();
// o[i] = gelu_tanh(x[i]), by gelu_tanh_n and by a loop of the scalar form.
void vector_gelu(const float* x, float* o, int64_t n);
void scalar_gelu(const float* x, float* o, int64_t n);
// o[i] = gelu_tanh_grad(dy[i], x[i]), the same two ways.
void vector_gelu_grad(const float* dy, const float* x, float* o, int64_t n);
void scalar_gelu_grad(const float* dy, const float* x, float* o, int64_t n);
// o[i] = vexp(x[i] - shift): vexp_n and the scalar loop.
void vector_exp(const float* x, float* o, int64_t n, float shift);
void scalar_exp(const float* x, float* o, int64_t n, float shift);

}  // namespace avx2_ref
