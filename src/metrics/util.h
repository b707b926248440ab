// Small tensor helpers shared by the metric implementations.
#pragma once
#include "cstorch/tensor.h"

namespace cstorch::metrics::detail {

// a / b where b > 0, else 0 (elementwise; the "divide_no_nan" of TF's metrics).
inline Tensor safe_div(const Tensor& a, const Tensor& b) {
  Tensor pos = b > 0.0;
  return where(pos, a / where(pos, b, 1.0), 0.0);
}

// f32 [n, n] identity (diagonal selector).
inline Tensor eye(int64_t n) {
  Tensor i = arange(static_cast<double>(n));
  return cast(eq(i.unsqueeze(1), i.unsqueeze(0)), DType::f32);
}

}  // namespace cstorch::metrics::detail
