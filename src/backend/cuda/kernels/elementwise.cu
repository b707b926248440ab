// CUDA elementwise kernels: f32 unary math, broadcasting binary ops (pow and gelu's gradient
// among them), comparisons and logical ops of any supported dtype, where, addcmul, casts, fills
// and arange. Each output element is read and written by one
// thread, so an output may alias an input of the same shape (in-place state updates).
// The ops that autocast's graphs run in 16-bit (relu, gelu, mul and the gradients of relu and
// gelu) are the f32 kernels over an element type: loaded to float, computed as in f32, rounded
// once to the element type (kernels/half.cuh), as the CPU's 16-bit kernels do.
#include <cmath>
#include <type_traits>

#include "backend/cuda/kernels/common.cuh"
#include "backend/cuda/kernels/elementwise_math.cuh"
#include "backend/cuda/kernels/half.cuh"

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
  if constexpr (op == Unary::Sigmoid) return sigmoid_f<CudaMath>(x);
  if constexpr (op == Unary::Relu) return x < 0.0f ? 0.0f : x;  // keeps NaN, as the CPU
  if constexpr (op == Unary::Expm1) return expm1f(x);
  // The CPU's formulas (PyTorch's), rounded as the Fused kernel rounds them
  // (elementwise_math.cuh): gelu's exact (erf) and tanh forms, silu as x / (1 + e^-x); sign 0
  // for NaN ((0 < x) - (x < 0)).
  if constexpr (op == Unary::Gelu) return gelu_erf<CudaMath>(x);
  if constexpr (op == Unary::GeluTanh) return gelu_tanh<CudaMath>(x);
  if constexpr (op == Unary::Silu) return silu_f<CudaMath>(x);
  if constexpr (op == Unary::Erf) return erff(x);
  if constexpr (op == Unary::Sin) return sinf(x);
  if constexpr (op == Unary::Cos) return cosf(x);
  if constexpr (op == Unary::Floor) return floorf(x);
  if constexpr (op == Unary::Sign) return static_cast<float>((0.0f < x) - (x < 0.0f));
  return x;
}

template <Unary op, class T>
__global__ void unary_kernel(const T* __restrict__ x, T* y, int64_t n) {
  CS_GRID_STRIDE(i, n) y[i] = store<T>(unary_f<op>(load(x[i])));
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
  if constexpr (op == Binary::Pow) return pow_f<CudaMath>(x, y, false);
  // (g, v): g * gelu'(v), as the Fused kernel computes it.
  if constexpr (op == Binary::GeluGrad) return gelu_erf_grad<CudaMath>(x, y);
  if constexpr (op == Binary::GeluTanhGrad) return gelu_tanh_grad<CudaMath>(x, y);
  return x;
}

// Integer add and sub wrap around, as the CPU's (unsigned arithmetic, no overflow UB).
template <Binary op>
__device__ inline int64_t binary_f(int64_t x, int64_t y) {
  const uint64_t a = static_cast<uint64_t>(x), c = static_cast<uint64_t>(y);
  return static_cast<int64_t>(op == Binary::Sub ? a - c : a + c);
}

template <Binary op, class T>
__device__ inline T binary_at(T x, T y) {
  if constexpr (std::is_same_v<T, int64_t>)
    return binary_f<op>(x, y);
  else
    return store<T>(binary_f<op>(load(x), load(y)));
}

template <Binary op, class T>
__global__ void binary_kernel(Bcast b, const T* x, const T* y, T* out, int64_t n) {
  if (b.contiguous) {
    CS_GRID_STRIDE(i, n) out[i] = binary_at<op, T>(x[i], y[i]);
  } else {
    CS_GRID_STRIDE(i, n) {
      int64_t off[2];
      bcast_offsets<2>(b, i, off);
      out[i] = binary_at<op, T>(x[off[0]], y[off[1]]);
    }
  }
}

// pow with one exponent for the whole tensor: the exact cheaper forms the CPU (and PyTorch) use
// for common exponents, else powf. Every thread reads the same exponent.
__global__ void pow_scalar_kernel(const float* __restrict__ x, const float* __restrict__ e,
                                  float* out, int64_t n) {
  const float p = e[0];
  CS_GRID_STRIDE(i, n) out[i] = pow_f<CudaMath>(x[i], p, true);
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

template <class T>
__global__ void logical_kernel(Logic op, Bcast b, const T* x, const T* y, bool* out, int64_t n) {
  CS_GRID_STRIDE(i, n) {
    int64_t off[2] = {i, i};
    if (!b.contiguous) bcast_offsets<2>(b, i, off);
    const bool p = x[off[0]] != T(0), q = y[off[1]] != T(0);
    out[i] = op == Logic::And ? (p && q) : op == Logic::Or ? (p || q) : (p != q);
  }
}

// W: an unsigned word of the item's size (a select only moves bits).
template <class W>
__global__ void where_kernel(Bcast b, const bool* c, const W* a, const W* x, W* out, int64_t n) {
  CS_GRID_STRIDE(i, n) {
    int64_t off[3] = {i, i, i};
    if (!b.contiguous) bcast_offsets<3>(b, i, off);
    out[i] = c[off[0]] ? a[off[1]] : x[off[2]];
  }
}

__global__ void addcmul_kernel(Bcast b, const float* a, const float* x, const float* c, float* out,
                               int64_t n) {
  CS_GRID_STRIDE(i, n) {
    int64_t off[3] = {i, i, i};
    if (!b.contiguous) bcast_offsets<3>(b, i, off);
    out[i] = ffma(x[off[1]], c[off[2]], a[off[0]]);  // fused, as on the CPU
  }
}

// The CPU's conversions: 16-bit values go through float both ways (an integer is rounded to
// float first, then to 16 bits: two roundings, as the CPU's cast does them), bool is x != 0.
template <class TO, class TI>
__device__ inline TO convert(TI v) {
  if constexpr (is_half_v<TI>) {
    return convert<TO, float>(load(v));
  } else if constexpr (is_half_v<TO>) {
    if constexpr (std::is_same_v<TI, bool>)
      return store<TO>(v ? 1.0f : 0.0f);
    else
      return store<TO>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<TO, bool>) {
    return v != TI(0);
  } else {
    return static_cast<TO>(v);
  }
}

template <class TI, class TO>
__global__ void cast_kernel(const TI* x, TO* y, int64_t n) {
  CS_GRID_STRIDE(i, n) y[i] = convert<TO, TI>(x[i]);
}

template <class T>
__global__ void fill_kernel(T v, T* y, int64_t n) {
  CS_GRID_STRIDE(i, n) y[i] = v;
}

template <class T>
__global__ void arange_kernel(double start, double step, T* y, int64_t n) {
  CS_GRID_STRIDE(i, n) {
    const double v = start + step * static_cast<double>(i);
    if constexpr (std::is_same_v<T, bool>)
      y[i] = v != 0;
    else
      y[i] = static_cast<T>(v);
  }
}

// Calls f with a null pointer of the C++ type of t (f32, i32, i64, bool; with `halves`, also
// bf16 and f16). Returns false, calling nothing, for a 16-bit t without `halves`.
template <bool halves = false, class F>
bool with_type(Ty t, F&& f) {
  switch (t) {
    case Ty::f32:
      return f(static_cast<float*>(nullptr)), true;
    case Ty::i32:
      return f(static_cast<int32_t*>(nullptr)), true;
    case Ty::i64:
      return f(static_cast<int64_t*>(nullptr)), true;
    case Ty::b8:
      return f(static_cast<bool*>(nullptr)), true;
    case Ty::bf16:
      if constexpr (halves) return f(static_cast<bf16*>(nullptr)), true;
      break;
    case Ty::f16:
      if constexpr (halves) return f(static_cast<f16*>(nullptr)), true;
      break;
  }
  return false;
}

template <class T>
__global__ void bias_round_kernel(const float* __restrict__ y, const T* __restrict__ bias, T* out,
                                  int64_t m, int64_t n) {
  CS_GRID_STRIDE(i, m * n) out[i] = store<T>(fadd(y[i], load(bias[i % n])));
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

bool unary(Unary op, Ty t, const void* x, void* y, int64_t n, void* stream) {
  const unsigned g = blocks_for(n);
  cudaStream_t s = as_stream(stream);
  auto run = [&](auto kernel, auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    kernel<<<g, kThreads, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y), n);
    return true;
  };
  // The 16-bit instances: the ops autocast's graphs run in bf16 / f16.
  auto run_half = [&](auto kernel_bf16, auto kernel_f16) {
    if (t == Ty::bf16) return run(kernel_bf16, static_cast<bf16*>(nullptr));
    if (t == Ty::f16) return run(kernel_f16, static_cast<f16*>(nullptr));
    return false;
  };
  if (t != Ty::f32) {
    switch (op) {
#define CS_UNARY_HALF(Name) \
  case Unary::Name:         \
    return run_half(unary_kernel<Unary::Name, bf16>, unary_kernel<Unary::Name, f16>);
      CS_UNARY_HALF(Relu)
      CS_UNARY_HALF(Gelu)
      CS_UNARY_HALF(GeluTanh)
#undef CS_UNARY_HALF
      default:
        return false;
    }
  }
  switch (op) {
#define CS_UNARY(Name) \
  case Unary::Name:    \
    return run(unary_kernel<Unary::Name, float>, static_cast<float*>(nullptr));
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
  return false;
}

bool binary(Binary op, Ty t, const Bcast& b, const void* x, const void* y, void* out, int64_t n,
            void* stream, bool scalar_exponent) {
  const unsigned g = blocks_for(n);
  cudaStream_t s = as_stream(stream);
  auto run = [&](auto kernel, auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    kernel<<<g, kThreads, 0, s>>>(b, static_cast<const T*>(x), static_cast<const T*>(y),
                                  static_cast<T*>(out), n);
    return true;
  };
  if (t == Ty::bf16 || t == Ty::f16) {
    auto run_half = [&](auto kernel_bf16, auto kernel_f16) {
      return t == Ty::bf16 ? run(kernel_bf16, static_cast<bf16*>(nullptr))
                           : run(kernel_f16, static_cast<f16*>(nullptr));
    };
    switch (op) {
#define CS_BINARY_HALF(Name) \
  case Binary::Name:         \
    return run_half(binary_kernel<Binary::Name, bf16>, binary_kernel<Binary::Name, f16>);
      CS_BINARY_HALF(Mul)
      CS_BINARY_HALF(ReluGrad)
      CS_BINARY_HALF(GeluGrad)
      CS_BINARY_HALF(GeluTanhGrad)
#undef CS_BINARY_HALF
      default:
        return false;
    }
  }
  if (t == Ty::i64) {  // the loss scaler's step counters
    if (op == Binary::Add)
      return run(binary_kernel<Binary::Add, int64_t>, static_cast<int64_t*>(nullptr));
    if (op == Binary::Sub)
      return run(binary_kernel<Binary::Sub, int64_t>, static_cast<int64_t*>(nullptr));
    return false;
  }
  if (t != Ty::f32) return false;
  if (op == Binary::Pow && scalar_exponent) {
    pow_scalar_kernel<<<g, kThreads, 0, s>>>(
        static_cast<const float*>(x), static_cast<const float*>(y), static_cast<float*>(out), n);
    return true;
  }
  switch (op) {
#define CS_BINARY(Name) \
  case Binary::Name:    \
    return run(binary_kernel<Binary::Name, float>, static_cast<float*>(nullptr));
    CS_BINARY(Add)
    CS_BINARY(Sub)
    CS_BINARY(Mul)
    CS_BINARY(Div)
    CS_BINARY(Maximum)
    CS_BINARY(Minimum)
    CS_BINARY(ReluGrad)
    CS_BINARY(Pow)
    CS_BINARY(GeluGrad)
    CS_BINARY(GeluTanhGrad)
#undef CS_BINARY
  }
  return false;
}

void bias_round(Ty t, const float* y, const void* bias, void* out, int64_t m, int64_t n,
                void* stream) {
  const unsigned g = blocks_for(m * n);
  cudaStream_t s = as_stream(stream);
  if (t == Ty::bf16)
    bias_round_kernel<bf16>
        <<<g, kThreads, 0, s>>>(y, static_cast<const bf16*>(bias), static_cast<bf16*>(out), m, n);
  else if (t == Ty::f16)
    bias_round_kernel<f16>
        <<<g, kThreads, 0, s>>>(y, static_cast<const f16*>(bias), static_cast<f16*>(out), m, n);
}

void compare(Cmp op, Ty t, const Bcast& b, const void* x, const void* y, bool* out, int64_t n,
             void* stream) {
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    compare_kernel<T><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(
        op, b, static_cast<const T*>(x), static_cast<const T*>(y), out, n);
  });
}

void logical(Logic op, Ty t, const Bcast& b, const void* x, const void* y, bool* out, int64_t n,
             void* stream) {
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    logical_kernel<T><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(
        op, b, static_cast<const T*>(x), static_cast<const T*>(y), out, n);
  });
}

void where(const Bcast& b, const bool* cond, const void* a, const void* x, void* out,
           int item_bytes, int64_t n, void* stream) {
  const unsigned g = blocks_for(n);
  cudaStream_t s = as_stream(stream);
  auto run = [&](auto* tag) {
    using W = std::remove_pointer_t<decltype(tag)>;
    where_kernel<W><<<g, kThreads, 0, s>>>(b, cond, static_cast<const W*>(a),
                                           static_cast<const W*>(x), static_cast<W*>(out), n);
  };
  with_word(item_bytes, run);
}

void addcmul(const Bcast& b, const float* a, const float* x, const float* c, float* out, int64_t n,
             void* stream) {
  addcmul_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(b, a, x, c, out, n);
}

void cast(Ty from, Ty to, const void* x, void* y, int64_t n, void* stream) {
  with_type<true>(from, [&](auto* ti) {
    using TI = std::remove_pointer_t<decltype(ti)>;
    with_type<true>(to, [&](auto* to_tag) {
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

void arange(Ty t, double start, double step, void* y, int64_t n, void* stream) {
  with_type(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    arange_kernel<T>
        <<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(start, step, static_cast<T*>(y), n);
  });
}

}  // namespace cstorch::cuda::k
