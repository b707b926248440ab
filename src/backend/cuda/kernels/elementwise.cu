// CUDA elementwise kernels: f32 unary math, broadcasting binary ops, comparisons of any
// supported dtype, addcmul, casts and fills. Each output element is read and written by one
// thread, so an output may alias an input of the same shape (in-place state updates).
#include <cmath>
#include <type_traits>

#include "backend/cuda/kernels/common.cuh"

namespace cstorch::cuda::k {

namespace {

template <Unary op>
__device__ inline float unary_f(float x) {
  if constexpr (op == Unary::Neg) return -x;
  if constexpr (op == Unary::Abs) return fabsf(x);
  if constexpr (op == Unary::Exp) return expf(x);
  if constexpr (op == Unary::Log) return logf(x);
  if constexpr (op == Unary::Sqrt) return sqrtf(x);
  if constexpr (op == Unary::Rsqrt) return 1.0f / sqrtf(x);  // not rsqrtf: that one is approximate
  if constexpr (op == Unary::Reciprocal) return 1.0f / x;
  if constexpr (op == Unary::Tanh) return tanhf(x);
  if constexpr (op == Unary::Sigmoid) return 1.0f / (1.0f + expf(-x));
  if constexpr (op == Unary::Relu) return x < 0.0f ? 0.0f : x;  // keeps NaN, as the CPU
  if constexpr (op == Unary::Expm1) return expm1f(x);
  // The CPU's formulas (PyTorch's): gelu's exact (erf) and tanh forms, silu as x / (1 + e^-x),
  // sign 0 for NaN ((0 < x) - (x < 0)).
  if constexpr (op == Unary::Gelu) return x * 0.5f * (1.0f + erff(x * 0.70710678118654752f));
  if constexpr (op == Unary::GeluTanh)
    return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
  if constexpr (op == Unary::Silu) return x / (1.0f + expf(-x));
  if constexpr (op == Unary::Erf) return erff(x);
  if constexpr (op == Unary::Sin) return sinf(x);
  if constexpr (op == Unary::Cos) return cosf(x);
  if constexpr (op == Unary::Floor) return floorf(x);
  if constexpr (op == Unary::Sign) return static_cast<float>((0.0f < x) - (x < 0.0f));
  return x;
}

template <Unary op>
__global__ void unary_kernel(const float* __restrict__ x, float* y, int64_t n) {
  CS_GRID_STRIDE(i, n) y[i] = unary_f<op>(x[i]);
}

template <Binary op>
__device__ inline float binary_f(float x, float y) {
  if constexpr (op == Binary::Add) return x + y;
  if constexpr (op == Binary::Sub) return x - y;
  if constexpr (op == Binary::Mul) return x * y;
  if constexpr (op == Binary::Div) return x / y;
  if constexpr (op == Binary::Maximum) return max_nan(x, y);
  if constexpr (op == Binary::Minimum) return min_nan(x, y);
  if constexpr (op == Binary::ReluGrad) return y <= 0.0f ? 0.0f : x;  // (g, y): g where y > 0
  return x;
}

template <Binary op>
__global__ void binary_kernel(Bcast b, const float* x, const float* y, float* out, int64_t n) {
  if (b.contiguous) {
    CS_GRID_STRIDE(i, n) out[i] = binary_f<op>(x[i], y[i]);
  } else {
    CS_GRID_STRIDE(i, n) {
      int64_t off[2];
      bcast_offsets<2>(b, i, off);
      out[i] = binary_f<op>(x[off[0]], y[off[1]]);
    }
  }
}

template <class T>
__device__ inline bool cmp_f(Cmp op, T x, T y) {
  switch (op) {
    case Cmp::Eq:
      return x == y;
    case Cmp::Ne:
      return x != y;
    case Cmp::Lt:
      return x < y;
    case Cmp::Le:
      return x <= y;
    case Cmp::Gt:
      return x > y;
    case Cmp::Ge:
      return x >= y;
  }
  return false;
}

template <class T>
__global__ void compare_kernel(Cmp op, Bcast b, const T* x, const T* y, bool* out, int64_t n) {
  CS_GRID_STRIDE(i, n) {
    int64_t off[2] = {i, i};
    if (!b.contiguous) bcast_offsets<2>(b, i, off);
    out[i] = cmp_f<T>(op, x[off[0]], y[off[1]]);
  }
}

__global__ void addcmul_kernel(Bcast b, const float* a, const float* x, const float* c, float* out,
                               int64_t n) {
  CS_GRID_STRIDE(i, n) {
    int64_t off[3] = {i, i, i};
    if (!b.contiguous) bcast_offsets<3>(b, i, off);
    out[i] = a[off[0]] + x[off[1]] * c[off[2]];
  }
}

template <class TO, class TI>
__device__ inline TO convert(TI v) {
  if constexpr (std::is_same_v<TO, bool>)
    return v != TI(0);
  else
    return static_cast<TO>(v);
}

template <class TI, class TO>
__global__ void cast_kernel(const TI* x, TO* y, int64_t n) {
  CS_GRID_STRIDE(i, n) y[i] = convert<TO, TI>(x[i]);
}

template <class T>
__global__ void fill_kernel(T v, T* y, int64_t n) {
  CS_GRID_STRIDE(i, n) y[i] = v;
}

// Calls f with a null pointer of the C++ type of t.
template <class F>
void with_type(Ty t, F&& f) {
  switch (t) {
    case Ty::f32:
      return f(static_cast<float*>(nullptr));
    case Ty::i32:
      return f(static_cast<int32_t*>(nullptr));
    case Ty::i64:
      return f(static_cast<int64_t*>(nullptr));
    case Ty::b8:
      return f(static_cast<bool*>(nullptr));
  }
}

__global__ void isfinite_kernel(const float* __restrict x, bool* y, int64_t n) {
  CS_GRID_STRIDE(i, n) y[i] = isfinite(x[i]);
}
__global__ void logical_not_kernel(const bool* __restrict x, bool* y, int64_t n) {
  CS_GRID_STRIDE(i, n) y[i] = !x[i];
}

}  // namespace

void is_finite(const float* x, bool* y, int64_t n, void* stream) {
  isfinite_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(x, y, n);
}
void logical_not(const bool* x, bool* y, int64_t n, void* stream) {
  logical_not_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(x, y, n);
}

void unary(Unary op, const float* x, float* y, int64_t n, void* stream) {
  const unsigned g = blocks_for(n);
  cudaStream_t s = as_stream(stream);
  switch (op) {
#define CS_UNARY(Name)                                         \
  case Unary::Name:                                            \
    unary_kernel<Unary::Name><<<g, kThreads, 0, s>>>(x, y, n); \
    break;
    CS_UNARY(Neg)
    CS_UNARY(Abs)
    CS_UNARY(Exp)
    CS_UNARY(Log)
    CS_UNARY(Sqrt)
    CS_UNARY(Rsqrt)
    CS_UNARY(Reciprocal)
    CS_UNARY(Tanh)
    CS_UNARY(Sigmoid)
    CS_UNARY(Relu)
    CS_UNARY(Expm1)
    CS_UNARY(Gelu)
    CS_UNARY(GeluTanh)
    CS_UNARY(Silu)
    CS_UNARY(Erf)
    CS_UNARY(Sin)
    CS_UNARY(Cos)
    CS_UNARY(Floor)
    CS_UNARY(Sign)
#undef CS_UNARY
  }
}

void binary(Binary op, const Bcast& b, const float* x, const float* y, float* out, int64_t n,
            void* stream) {
  const unsigned g = blocks_for(n);
  cudaStream_t s = as_stream(stream);
  switch (op) {
#define CS_BINARY(Name)                                                  \
  case Binary::Name:                                                     \
    binary_kernel<Binary::Name><<<g, kThreads, 0, s>>>(b, x, y, out, n); \
    break;
    CS_BINARY(Add)
    CS_BINARY(Sub)
    CS_BINARY(Mul)
    CS_BINARY(Div)
    CS_BINARY(Maximum)
    CS_BINARY(Minimum)
    CS_BINARY(ReluGrad)
#undef CS_BINARY
  }
}

void compare(Cmp op, Ty t, const Bcast& b, const void* x, const void* y, bool* out, int64_t n,
             void* stream) {
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    compare_kernel<T><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(
        op, b, static_cast<const T*>(x), static_cast<const T*>(y), out, n);
  });
}

void addcmul(const Bcast& b, const float* a, const float* x, const float* c, float* out, int64_t n,
             void* stream) {
  addcmul_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(b, a, x, c, out, n);
}

void cast(Ty from, Ty to, const void* x, void* y, int64_t n, void* stream) {
  with_type(from, [&](auto* ti) {
    using TI = std::remove_pointer_t<decltype(ti)>;
    with_type(to, [&](auto* to_tag) {
      using TO = std::remove_pointer_t<decltype(to_tag)>;
      cast_kernel<TI, TO><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(
          static_cast<const TI*>(x), static_cast<TO*>(y), n);
    });
  });
}

void fill(Ty t, double value, void* y, int64_t n, void* stream) {
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T v;
    if constexpr (std::is_same_v<T, bool>)
      v = value != 0;
    else
      v = static_cast<T>(value);
    fill_kernel<T><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(v, static_cast<T*>(y), n);
  });
}

}  // namespace cstorch::cuda::k
