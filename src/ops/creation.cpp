// Creation ops: leaves (Input, Constant), full, arange, host data. Random draws live in
// random.cpp.
#include <cmath>
#include <cstring>

#include "core/internal.h"
#include "ops/vjp.h"
#include "runtime/trace_context.h"

namespace cstorch {
namespace ops {

void infer_Input(ir::Node&) {}     // shape and dtype set when the placeholder is made
void infer_Constant(ir::Node&) {}  // shape and dtype set with the buffer
void infer_Full(ir::Node& n) {
  CS_CHECK(n.inputs.empty(), "full: takes no inputs");
}
void infer_Arange(ir::Node& n) {}
CS_NO_VJP(Input)
CS_NO_VJP(Constant)
CS_NO_VJP(Full)
CS_NO_VJP(Arange)

}  // namespace ops

static Tensor make_full(const Shape& s, double v, DType t, Device d = {}) {
  if (d.type == DeviceType::CSX) d = Device{};
  return detail::dispatch(ir::OpCode::Full, ir::FullAttrs{v}, {}, detail::OutSpec{s, t, d});
}

Tensor full(const Shape& s, double value, DType dtype, Device device) {
  return make_full(s, value, dtype, device);
}
Tensor zeros(const Shape& s, DType dtype, Device device) {
  return make_full(s, 0.0, dtype, device);
}
Tensor ones(const Shape& s, DType dtype, Device device) {
  return make_full(s, 1.0, dtype, device);
}
Tensor zeros_like(const Tensor& t) {
  return zeros(t.shape(), t.dtype(), t.device());
}
Tensor ones_like(const Tensor& t) {
  return ones(t.shape(), t.dtype(), t.device());
}
Tensor full_like(const Tensor& t, double v) {
  return full(t.shape(), v, t.dtype(), t.device());
}
Tensor scalar_tensor(double v, DType dtype) {
  return make_full({}, v, dtype);
}

Tensor arange(double end, DType dtype, Device device) {
  return arange(0, end, 1, dtype, device);
}
Tensor arange(double start, double end, double step, DType dtype, Device device) {
  CS_CHECK(step != 0, "arange: step must be nonzero");
  CS_CHECK((end - start) / step >= 0,
           "arange: range [{}, {}) with step {} is empty in the wrong "
           "direction",
           start, end, step);
  int64_t count = static_cast<int64_t>(std::ceil((end - start) / step));
  return detail::dispatch(ir::OpCode::Arange, ir::ArangeAttrs{start, step}, {},
                          detail::OutSpec{{count}, dtype, device});
}

Tensor from_blob(const void* data, const Shape& shape, DType dtype) {
  for (auto d : shape)
    CS_CHECK(d >= 0, "from_blob: negative dimension in shape {}", shape_str(shape));
  size_t bytes = static_cast<size_t>(numel(shape)) * itemsize(dtype);
  auto buf = ir::Buffer::alloc(bytes);
  if (bytes) std::memcpy(buf->data, data, bytes);
  auto n = detail::make_constant_node(std::move(buf), shape, dtype);
  if (detail::in_trace()) runtime::TraceContext::current()->record(n);
  return make_tensor(n);
}

template <class T>
static Tensor from_vec(const std::vector<T>& v, const Shape& s, DType t) {
  CS_CHECK(static_cast<int64_t>(v.size()) == numel(s),
           "from_vector: {} values given for shape {} ({} elements)", v.size(), shape_str(s),
           numel(s));
  return from_blob(v.data(), s, t);
}
Tensor from_vector(const std::vector<float>& d, const Shape& s) {
  return from_vec(d, s, DType::f32);
}
Tensor from_vector(const std::vector<int64_t>& d, const Shape& s) {
  return from_vec(d, s, DType::i64);
}
Tensor from_vector(const std::vector<int32_t>& d, const Shape& s) {
  return from_vec(d, s, DType::i32);
}
Tensor from_vector(const std::vector<uint8_t>& d, const Shape& s, DType t) {
  CS_CHECK(t == DType::boolean || itemsize(t) == 1 ||
               static_cast<int64_t>(d.size()) == numel(s) * static_cast<int64_t>(itemsize(t)),
           "from_vector: byte data for dtype {}", dtype_name(t));
  if (t == DType::boolean) return from_vec(d, s, t);
  CS_CHECK(static_cast<int64_t>(d.size()) == numel(s) * static_cast<int64_t>(itemsize(t)),
           "from_vector: {} bytes given for shape {} of {}", d.size(), shape_str(s), dtype_name(t));
  return from_blob(d.data(), s, t);
}

}  // namespace cstorch
