// Dispatch on a runtime DType to a templated body. 16-bit floats are stored as bf16_t / f16_t
// and computed in float (Compute<T>::type).
#pragma once
#include <cstdint>

#include "cstorch/core/dtype.h"
#include "cstorch/core/error.h"

namespace cstorch::cpu {

template <class T>
struct Compute {
  using type = T;
};
template <>
struct Compute<bf16_t> {
  using type = float;
};
template <>
struct Compute<f16_t> {
  using type = float;
};
template <class T>
using compute_t = typename Compute<T>::type;

template <class T>
inline T from_double(double v) {
  if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>)
    return T(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>)
    return v != 0;
  else
    return static_cast<T>(v);
}
template <class T>
inline T store(compute_t<T> v) {
  if constexpr (std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>)
    return T(v);
  else
    return static_cast<T>(v);
}
template <class T>
inline compute_t<T> load(T v) {
  return static_cast<compute_t<T>>(v);
}

// f(T* tag) for every dtype; bool is stored as uint8_t-sized `bool`.
template <class F>
inline void dispatch_all(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      f.template operator()<float>(nullptr);
      return;
    case DType::bf16:
      f.template operator()<bf16_t>(nullptr);
      return;
    case DType::f16:
      f.template operator()<f16_t>(nullptr);
      return;
    case DType::i32:
      f.template operator()<int32_t>(nullptr);
      return;
    case DType::i64:
      f.template operator()<int64_t>(nullptr);
      return;
    case DType::boolean:
      f.template operator()<bool>(nullptr);
      return;
  }
}
// Floating types only; `op` names the op in the error for other dtypes.
template <class F>
inline void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32:
      f.template operator()<float>(nullptr);
      return;
    case DType::bf16:
      f.template operator()<bf16_t>(nullptr);
      return;
    case DType::f16:
      f.template operator()<f16_t>(nullptr);
      return;
    default:
      fail("{}: dtype {} is not supported (floating-point dtypes only)", op, dtype_name(t));
  }
}
// Numeric (non-bool) types.
template <class F>
inline void dispatch_numeric(DType t, const char* op, F&& f) {
  if (t == DType::boolean) fail("{}: dtype bool is not supported", op);
  dispatch_all(t, std::forward<F>(f));
}

}  // namespace cstorch::cpu
