// CPU kernels for elementwise ops: unary math, cast, broadcasting binary ops, comparisons,
// logical ops, where and the fused relu/gelu gradients. Each op has a same-shape contiguous
// loop, a single-element-operand loop and a general broadcast walk; none allocates.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/cpu/dtype_dispatch.h"
#include "backend/cpu/elementwise_math.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/vec_math.h"

namespace cstorch::cpu {

namespace {

// Transcendental functions cost ~10x an add, so they go parallel on smaller tensors.
constexpr int64_t kMathGrain = kElementwiseGrain / 8;

// ---- scalar helpers (computed in compute_t<T>) ----

// Integer arithmetic wraps around like PyTorch's (signed overflow is UB in C++, so go through
// the unsigned type).
template <class C>
inline C wrap_add(C x, C y) {
  if constexpr (std::is_same_v<C, bool>)
    return x || y;
  else if constexpr (std::is_integral_v<C>)
    return static_cast<C>(static_cast<std::make_unsigned_t<C>>(x) +
                          static_cast<std::make_unsigned_t<C>>(y));
  else
    return x + y;
}
template <class C>
inline C wrap_sub(C x, C y) {
  if constexpr (std::is_same_v<C, bool>)
    return x != y;
  else if constexpr (std::is_integral_v<C>)
    return static_cast<C>(static_cast<std::make_unsigned_t<C>>(x) -
                          static_cast<std::make_unsigned_t<C>>(y));
  else
    return x - y;
}
template <class C>
inline C wrap_mul(C x, C y) {
  if constexpr (std::is_same_v<C, bool>)
    return x && y;
  else if constexpr (std::is_integral_v<C>)
    return static_cast<C>(static_cast<std::make_unsigned_t<C>>(x) *
                          static_cast<std::make_unsigned_t<C>>(y));
  else
    return x * y;
}
template <class C>
inline C wrap_neg(C x) {
  if constexpr (std::is_same_v<C, bool>)
    return x;
  else if constexpr (std::is_integral_v<C>)
    return static_cast<C>(std::make_unsigned_t<C>(0) - static_cast<std::make_unsigned_t<C>>(x));
  else
    return -x;
}

// Integer power by squaring; negative exponents follow PyTorch (1, -1 stay finite; others 0).
template <class C>
inline C int_pow(C base, C e) {
  if (e < 0) {
    if (base == 1) return 1;
    if (base == -1) return (e & 1) ? C(-1) : C(1);
    return 0;
  }
  C r = 1;
  while (e) {
    if (e & 1) r = wrap_mul(r, base);
    e >>= 1;
    base = wrap_mul(base, base);
  }
  return r;
}

template <class C>
inline bool truthy(C x) {
  if constexpr (std::is_same_v<C, bool>)
    return x;
  else
    return x != C(0);
}

// ---- loops ----

// out[i] = f(a[i]).
template <class TA, class TO, class F>
void map1(const ir::Node& n, const void* const* in, void* out, int64_t grain, F f) {
  const TA* a = static_cast<const TA*>(in[0]);
  TO* o = static_cast<TO*>(out);
  parallel_for(n.numel(), grain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) o[i] = store<TO>(f(load(a[i])));
  });
}

// Per-input element strides over the output's dims (0 where broadcast), with size-1 dims
// dropped and runs that are contiguous for every input merged, so the innermost dim is as
// long as possible and has stride 0 or 1 for each input.
template <int N>
struct Bcast {
  int nd = 0;
  int64_t size[kMaxDims];
  int64_t st[N][kMaxDims];
};

template <int N>
void make_bcast(const ir::Node& n, Bcast<N>& bc) {
  const Shape& os = n.shape;
  const int od = static_cast<int>(os.size());
  int64_t rsize[kMaxDims];  // collapsed dims, innermost first
  int64_t rst[N][kMaxDims];
  int64_t cstride[N];
  for (int k = 0; k < N; ++k) cstride[k] = 1;
  int cnt = 0;
  for (int d = od - 1; d >= 0; --d) {
    int64_t s[N];
    for (int k = 0; k < N; ++k) {
      const Shape& is = n.inputs[k]->shape;
      int id = d - (od - static_cast<int>(is.size()));
      int64_t isz = id >= 0 ? is[id] : 1;
      s[k] = isz == 1 ? 0 : cstride[k];
      cstride[k] *= isz;
    }
    if (os[d] == 1) continue;
    if (cnt > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k) merge = merge && s[k] == rst[k][cnt - 1] * rsize[cnt - 1];
      if (merge) {
        rsize[cnt - 1] *= os[d];
        continue;
      }
    }
    CS_CHECK(cnt < kMaxDims, "{}: broadcasting over more than {} dims is not supported", n.name(),
             kMaxDims);
    rsize[cnt] = os[d];
    for (int k = 0; k < N; ++k) rst[k][cnt] = s[k];
    ++cnt;
  }
  if (cnt == 0) {
    rsize[0] = 1;
    for (int k = 0; k < N; ++k) rst[k][0] = 0;
    cnt = 1;
  }
  bc.nd = cnt;
  for (int d = 0; d < cnt; ++d) {
    bc.size[d] = rsize[cnt - 1 - d];
    for (int k = 0; k < N; ++k) bc.st[k][d] = rst[k][cnt - 1 - d];
  }
}

// Calls row(out_offset, in_offsets, len) for each stretch of the innermost dim within [0,
// total), split into parallel chunks of the flat output index.
template <int N, class Row>
void bcast_for(const Bcast<N>& bc, int64_t total, int64_t grain, Row row) {
  const int nd = bc.nd;
  const int64_t inner = bc.size[nd - 1];
  parallel_for(total, grain, [&](int64_t b, int64_t e) {
    int64_t idx[kMaxDims];
    int64_t off[N];
    for (int k = 0; k < N; ++k) off[k] = 0;
    int64_t r = b / inner, col = b % inner;
    for (int d = nd - 2; d >= 0; --d) {
      idx[d] = r % bc.size[d];
      r /= bc.size[d];
      for (int k = 0; k < N; ++k) off[k] += idx[d] * bc.st[k][d];
    }
    int64_t i = b;
    while (i < e) {
      int64_t len = std::min(inner - col, e - i);
      int64_t o2[N];
      for (int k = 0; k < N; ++k) o2[k] = off[k] + col * bc.st[k][nd - 1];
      row(i, o2, len);
      i += len;
      col = 0;
      for (int d = nd - 2; d >= 0; --d) {
        for (int k = 0; k < N; ++k) off[k] += bc.st[k][d];
        if (++idx[d] < bc.size[d]) break;
        for (int k = 0; k < N; ++k) off[k] -= bc.st[k][d] * bc.size[d];
        idx[d] = 0;
      }
    }
  });
}

// out = f(a, b) with broadcasting. Fast paths: same size (element i of each), and a
// single-element operand (hoisted into a register).
template <class TA, class TB, class TO, class F>
void map2(const ir::Node& n, const void* const* in, void* out, int64_t grain, F f) {
  const TA* a = static_cast<const TA*>(in[0]);
  const TB* b = static_cast<const TB*>(in[1]);
  TO* o = static_cast<TO*>(out);
  const int64_t total = n.numel();
  const int64_t na = n.inputs[0]->numel(), nb = n.inputs[1]->numel();
  if (total == 0) return;
  if (na == total && nb == total) {
    parallel_for(total, grain, [&](int64_t s, int64_t e) {
#pragma omp simd
      for (int64_t i = s; i < e; ++i) o[i] = store<TO>(f(load(a[i]), load(b[i])));
    });
  } else if (na == total && nb == 1) {
    const auto bv = load(b[0]);
    parallel_for(total, grain, [&](int64_t s, int64_t e) {
#pragma omp simd
      for (int64_t i = s; i < e; ++i) o[i] = store<TO>(f(load(a[i]), bv));
    });
  } else if (nb == total && na == 1) {
    const auto av = load(a[0]);
    parallel_for(total, grain, [&](int64_t s, int64_t e) {
#pragma omp simd
      for (int64_t i = s; i < e; ++i) o[i] = store<TO>(f(av, load(b[i])));
    });
  } else {
    Bcast<2> bc;
    make_bcast(n, bc);
    const int64_t sa = bc.st[0][bc.nd - 1], sb = bc.st[1][bc.nd - 1];
    bcast_for(bc, total, grain, [&](int64_t oo, const int64_t* off, int64_t len) {
      const TA* pa = a + off[0];
      const TB* pb = b + off[1];
      TO* po = o + oo;
      if (sa == 1 && sb == 1) {
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) po[j] = store<TO>(f(load(pa[j]), load(pb[j])));
      } else if (sa == 1 && sb == 0) {
        const auto bv = load(pb[0]);
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) po[j] = store<TO>(f(load(pa[j]), bv));
      } else if (sa == 0 && sb == 1) {
        const auto av = load(pa[0]);
#pragma omp simd
        for (int64_t j = 0; j < len; ++j) po[j] = store<TO>(f(av, load(pb[j])));
      } else {
        for (int64_t j = 0; j < len; ++j) po[j] = store<TO>(f(load(pa[j * sa]), load(pb[j * sb])));
      }
    });
  }
}

// where(cond, a, b) with broadcasting. A select only moves bits, so it runs on the unsigned
// integer of the element's size (which also vectorises for the 16-bit float types); both
// values are loaded unconditionally so the loops become vector blends.
template <class U>
void where_kernel(const ir::Node& n, const void* const* in, void* out) {
  const uint8_t* c = static_cast<const uint8_t*>(in[0]);
  const U* a = static_cast<const U*>(in[1]);
  const U* b = static_cast<const U*>(in[2]);
  U* o = static_cast<U*>(out);
  const int64_t total = n.numel();
  if (total == 0) return;
  const int64_t nc = n.inputs[0]->numel(), na = n.inputs[1]->numel(), nb = n.inputs[2]->numel();
  if (nc == total && (na == total || na == 1) && (nb == total || nb == 1)) {
    // Same shape, and the masking forms where(mask, x, scalar) / where(mask, scalar, x).
    parallel_for(total, kElementwiseGrain, [&](int64_t s, int64_t e) {
      if (na == total && nb == total) {
#pragma omp simd
        for (int64_t i = s; i < e; ++i) {
          const U x = a[i], y = b[i];
          o[i] = c[i] ? x : y;
        }
      } else if (na == total) {
        const U y = b[0];
#pragma omp simd
        for (int64_t i = s; i < e; ++i) {
          const U x = a[i];
          o[i] = c[i] ? x : y;
        }
      } else if (nb == total) {
        const U x = a[0];
#pragma omp simd
        for (int64_t i = s; i < e; ++i) {
          const U y = b[i];
          o[i] = c[i] ? x : y;
        }
      } else {
        const U x = a[0], y = b[0];
#pragma omp simd
        for (int64_t i = s; i < e; ++i) o[i] = c[i] ? x : y;
      }
    });
    return;
  }
  Bcast<3> bc;
  make_bcast(n, bc);
  const int64_t sc = bc.st[0][bc.nd - 1], sa = bc.st[1][bc.nd - 1], sb = bc.st[2][bc.nd - 1];
  bcast_for(bc, total, kElementwiseGrain, [&](int64_t oo, const int64_t* off, int64_t len) {
    const uint8_t* pc = c + off[0];
    const U* pa = a + off[1];
    const U* pb = b + off[2];
    U* po = o + oo;
    if (sc == 1 && sa == 1 && sb == 1) {
#pragma omp simd
      for (int64_t j = 0; j < len; ++j) {
        const U x = pa[j], y = pb[j];
        po[j] = pc[j] ? x : y;
      }
    } else {
      for (int64_t j = 0; j < len; ++j) po[j] = pc[j * sc] ? pa[j * sa] : pb[j * sb];
    }
  });
}

// Dispatch helpers: T is the input dtype's storage type.
template <class F>
void unary_float(const ir::Node& n, const void* const* in, void* out, int64_t grain, F f) {
  dispatch_float(n.dtype, n.name(), [&]<class T>(T*) {
    map1<T, T>(n, in, out, grain, [&](float x) { return f(x); });
  });
}
template <class F>
void binary_float(const ir::Node& n, const void* const* in, void* out, int64_t grain, F f) {
  dispatch_float(n.dtype, n.name(), [&]<class T>(T*) {
    map2<T, T, T>(n, in, out, grain, [&](float x, float y) { return f(x, y); });
  });
}
// Comparisons and logical ops: input dtype from the inputs, bool out.
template <class F>
void binary_to_bool(const ir::Node& n, const void* const* in, void* out, F f) {
  dispatch_all(n.inputs[0]->dtype, [&]<class T>(T*) {
    map2<T, T, bool>(n, in, out, kElementwiseGrain,
                     [&](compute_t<T> x, compute_t<T> y) -> bool { return f(x, y); });
  });
}

}  // namespace

// ---- unary ----
void cpu_Neg(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  dispatch_numeric(n.dtype, "neg", [&]<class T>(T*) {
    map1<T, T>(n, in, out, kElementwiseGrain, [](auto x) { return wrap_neg(x); });
  });
}
void cpu_Abs(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  dispatch_numeric(n.dtype, "abs", [&]<class T>(T*) {
    map1<T, T>(n, in, out, kElementwiseGrain, [](auto x) {
      using C = decltype(x);
      if constexpr (std::is_floating_point_v<C>)
        return std::fabs(x);
      else if constexpr (std::is_same_v<C, bool>)
        return x;
      else
        return x < 0 ? wrap_neg(x) : x;
    });
  });
}
void cpu_Sign(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  dispatch_all(n.dtype, [&]<class T>(T*) {
    map1<T, T>(n, in, out, kElementwiseGrain, [](auto x) {
      using C = decltype(x);
      if constexpr (std::is_same_v<C, bool>)
        return x;
      else
        return static_cast<C>((C(0) < x) - (x < C(0)));
    });
  });
}
void cpu_Exp(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kMathGrain, [](float x) { return std::exp(x); });
}
void cpu_Log(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kMathGrain, [](float x) { return std::log(x); });
}
void cpu_Sqrt(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kElementwiseGrain, [](float x) { return std::sqrt(x); });
}
void cpu_Rsqrt(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kElementwiseGrain, [](float x) { return rsqrt_f(x); });
}
void cpu_Reciprocal(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                    void* out) {
  unary_float(n, in, out, kElementwiseGrain, [](float x) { return 1.0f / x; });
}
void cpu_Tanh(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kMathGrain, [](float x) { return std::tanh(x); });
}
void cpu_Sigmoid(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                 void* out) {
  unary_float(n, in, out, kMathGrain, [](float x) { return sigmoid_f(x); });
}
void cpu_Relu(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  dispatch_numeric(n.dtype, "relu", [&]<class T>(T*) {
    // x < 0 ? 0 : x keeps nan (as PyTorch's clamp_min).
    map1<T, T>(n, in, out, kElementwiseGrain, [](auto x) {
      using C = decltype(x);
      return x < C(0) ? C(0) : x;
    });
  });
}
// A 16-bit elementwise op as f32 loops over chunks widened on the stack: the f32 loops
// vectorise (the generic 16-bit path calls the math per element). f(ins, out, count) runs the
// f32 loop on `count` elements; inputs have the output's shape.
template <int N, class F>
bool via_f32_chunks(const ir::Node& n, const void* const* in, void* out, F f) {
  if (n.dtype != DType::bf16 && n.dtype != DType::f16) return false;
  for (int k = 0; k < N; ++k)
    if (n.inputs[k]->numel() != n.numel() || n.inputs[k]->dtype != n.dtype) return false;
  dispatch_float(n.dtype, "elementwise", [&]<class T>(T*) {
    if constexpr (!std::is_same_v<T, float>) {
      parallel_for(n.numel(), kMathGrain, [&](int64_t b, int64_t e) {
        constexpr int64_t kChunk = 512;
        alignas(64) float buf[N + 1][kChunk];
        for (int64_t c = b; c < e; c += kChunk) {
          const int64_t m = std::min(kChunk, e - c);
          for (int k = 0; k < N; ++k) {
            const T* x = static_cast<const T*>(in[k]) + c;
            if constexpr (std::is_same_v<T, bf16_t>) {
              // Bit operations: bf16_t's scalar conversions took 2x the op's time (measured).
              bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(x), buf[k], m);
            } else {
              for (int64_t i = 0; i < m; ++i) buf[k][i] = static_cast<float>(x[i]);
            }
          }
          const float* ins[N];
          for (int k = 0; k < N; ++k) ins[k] = buf[k];
          f(ins, buf[N], m);
          T* o = static_cast<T*>(out) + c;
          if constexpr (std::is_same_v<T, bf16_t>) {
            f32_to_bf16_bits(buf[N], reinterpret_cast<uint16_t*>(o), m);
          } else {
            for (int64_t i = 0; i < m; ++i) o[i] = T(buf[N][i]);
          }
        }
      });
    }
  });
  return true;
}

void cpu_Gelu(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const bool t = n.attr<ir::GeluAttrs>().tanh_approx;
  if (via_f32_chunks<1>(n, in, out, [t](const float* const* x, float* o, int64_t m) {
        if (t) {
          gelu_tanh_n(x[0], o, m);
        } else {
          for (int64_t i = 0; i < m; ++i) o[i] = gelu_erf(x[0][i]);
        }
      }))
    return;
  if (n.attr<ir::GeluAttrs>().tanh_approx && n.dtype == DType::f32) {
    // f32: same shape as its input (a unary op), contiguous.
    const float* x = static_cast<const float*>(in[0]);
    float* o = static_cast<float*>(out);
    parallel_for(n.numel(), kMathGrain,
                 [&](int64_t b, int64_t e) { gelu_tanh_n(x + b, o + b, e - b); });
    return;
  }
  if (n.attr<ir::GeluAttrs>().tanh_approx)
    unary_float(n, in, out, kMathGrain, [](float x) { return gelu_tanh(x); });
  else
    unary_float(n, in, out, kMathGrain, [](float x) { return gelu_erf(x); });
}
void cpu_Silu(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kMathGrain, [](float x) { return silu_f(x); });
}
void cpu_Erf(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kMathGrain, [](float x) { return std::erf(x); });
}
void cpu_Sin(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kMathGrain, [](float x) { return std::sin(x); });
}
void cpu_Cos(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kMathGrain, [](float x) { return std::cos(x); });
}
void cpu_Expm1(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kMathGrain, [](float x) { return std::expm1(x); });
}
void cpu_Floor(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  unary_float(n, in, out, kElementwiseGrain, [](float x) { return std::floor(x); });
}
void cpu_IsFinite(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                  void* out) {
  dispatch_all(n.inputs[0]->dtype, [&]<class T>(T*) {
    map1<T, bool>(n, in, out, kElementwiseGrain, [](auto x) -> bool {
      if constexpr (std::is_floating_point_v<decltype(x)>)
        return std::isfinite(x);
      else
        return true;
    });
  });
}
void cpu_LogicalNot(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                    void* out) {
  dispatch_all(n.inputs[0]->dtype, [&]<class T>(T*) {
    map1<T, bool>(n, in, out, kElementwiseGrain, [](auto x) -> bool { return !truthy(x); });
  });
}
// f32 <-> bf16 as bit operations on whole arrays (vectorised; the element conversions of
// bf16_t round the same way: to nearest even, NaNs kept quiet NaNs). Autocast casts every
// weight and many activations each step, so these run at memory speed.
void cast_f32_to_bf16(const float* x, uint16_t* o, int64_t n) {
  parallel_for(n, kElementwiseGrain,
               [&](int64_t b, int64_t e) { f32_to_bf16_bits(x + b, o + b, e - b); });
}
void cast_bf16_to_f32(const uint16_t* x, float* o, int64_t n) {
  parallel_for(n, kElementwiseGrain,
               [&](int64_t b, int64_t e) { bf16_bits_to_f32(x + b, o + b, e - b); });
}

void cpu_Cast(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const DType from = n.inputs[0]->dtype;
  if (from == DType::f32 && n.dtype == DType::bf16) {
    cast_f32_to_bf16(static_cast<const float*>(in[0]), static_cast<uint16_t*>(out), n.numel());
    return;
  }
  if (from == DType::bf16 && n.dtype == DType::f32) {
    cast_bf16_to_f32(static_cast<const uint16_t*>(in[0]), static_cast<float*>(out), n.numel());
    return;
  }
  dispatch_all(n.inputs[0]->dtype, [&]<class TI>(TI*) {
    dispatch_all(n.dtype, [&]<class TO>(TO*) {
      map1<TI, TO>(n, in, out, kElementwiseGrain, [](compute_t<TI> x) -> compute_t<TO> {
        using CO = compute_t<TO>;
        if constexpr (std::is_same_v<CO, bool>)
          return truthy(x);
        else
          return static_cast<CO>(x);
      });
    });
  });
}
void cpu_Copy(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const size_t isz = itemsize(n.dtype);
  const char* src = static_cast<const char*>(in[0]);
  char* dst = static_cast<char*>(out);
  if (dst == src) return;  // an in-place state write of the same value
  parallel_for(n.numel(), kElementwiseGrain * 4, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b * isz, src + b * isz, (e - b) * isz);
  });
}

// ---- binary ----
void cpu_Add(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  dispatch_all(n.dtype, [&]<class T>(T*) {
    map2<T, T, T>(n, in, out, kElementwiseGrain, [](auto x, auto y) { return wrap_add(x, y); });
  });
}
void cpu_Sub(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  dispatch_numeric(n.dtype, "sub", [&]<class T>(T*) {
    map2<T, T, T>(n, in, out, kElementwiseGrain, [](auto x, auto y) { return wrap_sub(x, y); });
  });
}
void cpu_Mul(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  dispatch_all(n.dtype, [&]<class T>(T*) {
    map2<T, T, T>(n, in, out, kElementwiseGrain, [](auto x, auto y) { return wrap_mul(x, y); });
  });
}
void cpu_Div(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  binary_float(n, in, out, kElementwiseGrain, [](float x, float y) { return x / y; });
}
void cpu_Pow(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  if (!is_floating(n.dtype)) {
    dispatch_numeric(n.dtype, "pow", [&]<class T>(T*) {
      if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
        map2<T, T, T>(n, in, out, kElementwiseGrain, [](T x, T y) { return int_pow(x, y); });
    });
    return;
  }
  // A single exponent of a common value uses the exact cheaper form, as PyTorch does.
  dispatch_float(n.dtype, "pow", [&]<class T>(T*) {
    if (n.inputs[1]->numel() == 1 && n.inputs[0]->numel() == n.numel()) {
      const float e = load(static_cast<const T*>(in[1])[0]);
      if (pow_exact_form(e, [&](auto f) { map1<T, T>(n, in, out, kElementwiseGrain, f); })) return;
    }
    map2<T, T, T>(n, in, out, kMathGrain, [](float x, float y) { return std::pow(x, y); });
  });
}
void cpu_Maximum(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                 void* out) {
  dispatch_all(n.dtype, [&]<class T>(T*) {
    map2<T, T, T>(n, in, out, kElementwiseGrain, [](auto x, auto y) { return max_nan(x, y); });
  });
}
void cpu_Minimum(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                 void* out) {
  dispatch_all(n.dtype, [&]<class T>(T*) {
    map2<T, T, T>(n, in, out, kElementwiseGrain, [](auto x, auto y) { return min_nan(x, y); });
  });
}
void cpu_Eq(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  binary_to_bool(n, in, out, [](auto x, auto y) { return x == y; });
}
void cpu_Ne(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  binary_to_bool(n, in, out, [](auto x, auto y) { return x != y; });
}
void cpu_Lt(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  binary_to_bool(n, in, out, [](auto x, auto y) { return x < y; });
}
void cpu_Le(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  binary_to_bool(n, in, out, [](auto x, auto y) { return x <= y; });
}
void cpu_Gt(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  binary_to_bool(n, in, out, [](auto x, auto y) { return x > y; });
}
void cpu_Ge(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  binary_to_bool(n, in, out, [](auto x, auto y) { return x >= y; });
}
void cpu_LogicalAnd(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                    void* out) {
  binary_to_bool(n, in, out, [](auto x, auto y) { return truthy(x) && truthy(y); });
}
void cpu_LogicalOr(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                   void* out) {
  binary_to_bool(n, in, out, [](auto x, auto y) { return truthy(x) || truthy(y); });
}
void cpu_LogicalXor(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                    void* out) {
  binary_to_bool(n, in, out, [](auto x, auto y) { return truthy(x) != truthy(y); });
}

// ---- ternary and fused gradients ----
void cpu_Where(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  switch (itemsize(n.dtype)) {
    case 1:
      return where_kernel<uint8_t>(n, in, out);
    case 2:
      return where_kernel<uint16_t>(n, in, out);
    case 4:
      return where_kernel<uint32_t>(n, in, out);
    default:
      return where_kernel<uint64_t>(n, in, out);
  }
}
// out = a + b * c. Fast paths: all the same size, and same-size a and b with a
// single-element c (the optimizer update p + g * (-lr)).
template <class T>
void addcmul_kernel(const ir::Node& n, const void* const* in, void* out) {
  const T* a = static_cast<const T*>(in[0]);
  const T* b = static_cast<const T*>(in[1]);
  const T* c = static_cast<const T*>(in[2]);
  T* o = static_cast<T*>(out);
  const int64_t total = n.numel();
  if (total == 0) return;
  const int64_t na = n.inputs[0]->numel(), nb = n.inputs[1]->numel(), nc = n.inputs[2]->numel();
  if (na == total && nb == total && nc == 1) {
    const auto cv = load(c[0]);
    parallel_for(total, kElementwiseGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
      for (int64_t i = s; i < e; ++i) o[i] = store<T>(load(a[i]) + load(b[i]) * cv);
    });
    return;
  }
  if (na == total && nb == total && nc == total) {
    parallel_for(total, kElementwiseGrain, [&](int64_t s, int64_t e) {
#pragma omp simd
      for (int64_t i = s; i < e; ++i) o[i] = store<T>(load(a[i]) + load(b[i]) * load(c[i]));
    });
    return;
  }
  Bcast<3> bc;
  make_bcast(n, bc);
  const int64_t sa = bc.st[0][bc.nd - 1], sb = bc.st[1][bc.nd - 1], sc = bc.st[2][bc.nd - 1];
  bcast_for(bc, total, kElementwiseGrain, [&](int64_t oo, const int64_t* off, int64_t len) {
    const T *pa = a + off[0], *pb = b + off[1], *pc = c + off[2];
    T* po = o + oo;
    for (int64_t j = 0; j < len; ++j)
      po[j] = store<T>(load(pa[j * sa]) + load(pb[j * sb]) * load(pc[j * sc]));
  });
}
void cpu_Addcmul(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                 void* out) {
  dispatch_float(n.dtype, "addcmul", [&]<class T>(T*) { addcmul_kernel<T>(n, in, out); });
}

// grad where the relu output is positive (PyTorch's threshold_backward: out <= 0 gives 0).
void cpu_ReluGrad(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                  void* out) {
  binary_float(n, in, out, kElementwiseGrain, [](float g, float y) { return relu_grad_f(g, y); });
}
void cpu_GeluGrad(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                  void* out) {
  // The common case (f32, same shapes) as a plain loop: through the generic map2 gcc does not
  // inline the tanh-form lambda and calls it per element (4x slower, seen in perf).
  if (n.dtype == DType::f32 && n.inputs[0]->numel() == n.numel() &&
      n.inputs[1]->numel() == n.numel()) {
    const float* g = static_cast<const float*>(in[0]);
    const float* x = static_cast<const float*>(in[1]);
    float* o = static_cast<float*>(out);
    const bool t = n.attr<ir::GeluAttrs>().tanh_approx;
    parallel_for(n.numel(), kMathGrain,
                 [&](int64_t b, int64_t e) { gelu_grad_n(t, g + b, x + b, o + b, e - b); });
    return;
  }
  if (via_f32_chunks<2>(
          n, in, out,
          [t = n.attr<ir::GeluAttrs>().tanh_approx](const float* const* x, float* o, int64_t m) {
            gelu_grad_n(t, x[0], x[1], o, m);
          }))
    return;
  if (n.attr<ir::GeluAttrs>().tanh_approx)
    binary_float(n, in, out, kMathGrain, [](float g, float x) { return gelu_tanh_grad(g, x); });
  else
    binary_float(n, in, out, kMathGrain, [](float g, float x) { return gelu_erf_grad(g, x); });
}

}  // namespace cstorch::cpu
