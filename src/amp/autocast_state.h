// Autocast state for the op families (internal): which dtype matmul/linear compute in, and
// the casts they and the f32-only ops apply.
#pragma once
#include <optional>

#include "cstorch/tensor.h"

namespace cstorch::amp::detail {

std::optional<DType> active();
void set_active(std::optional<DType> t);
// Under autocast: a floating tensor cast to the low dtype; otherwise `t` unchanged.
Tensor to_low(const Tensor& t);
// Under autocast: a 16-bit float tensor cast to f32; otherwise `t` unchanged.
Tensor to_f32(const Tensor& t);

// Switches autocast off for its lifetime (the backward pass).
class Off {
 public:
  Off() : prev_(active()) { set_active(std::nullopt); }
  ~Off() { set_active(prev_); }
  Off(const Off&) = delete;
  Off& operator=(const Off&) = delete;

 private:
  std::optional<DType> prev_;
};

}  // namespace cstorch::amp::detail
