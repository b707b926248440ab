// The autocast scope: a thread-local dtype read by matmul/linear (cast down) and by softmax,
// losses, layer_norm and reductions (cast up to f32).
#include "amp/autocast_state.h"
#include "cstorch/amp.h"
#include "cstorch/core/error.h"

namespace cstorch::amp {

namespace detail {
namespace {
thread_local std::optional<DType> t_active;
}
std::optional<DType> active() {
  return t_active;
}
void set_active(std::optional<DType> t) {
  t_active = t;
}
Tensor to_low(const Tensor& t) {
  if (!t_active || !t.defined() || !is_floating(t.dtype()) || t.dtype() == *t_active) return t;
  return cast(t, *t_active);
}
Tensor to_f32(const Tensor& t) {
  if (!t_active || !t.defined() || (t.dtype() != DType::bf16 && t.dtype() != DType::f16)) return t;
  return cast(t, DType::f32);
}
}  // namespace detail

autocast::autocast(std::optional<DType> dtype) : prev_(detail::active()) {
  CS_CHECK(!dtype || *dtype == DType::bf16 || *dtype == DType::f16,
           "autocast: dtype must be bf16 or f16 (or none to switch it off), got {}",
           dtype ? dtype_name(*dtype) : "none");
  detail::set_active(dtype);
}

autocast::~autocast() {
  detail::set_active(prev_);
}

std::optional<DType> autocast_dtype() {
  return detail::active();
}

}  // namespace cstorch::amp
