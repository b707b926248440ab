// Internal helpers of the data sources: tensors whose host buffer a worker fills in place (no
// extra copy, no ops: workers never run kernels or OpenMP teams of their own), and reading
// tensor bytes without going through the executor.
#pragma once
#include <cstring>

#include "core/internal.h"

namespace cstorch::data::detail {

// A new tensor of `shape` and `dtype` with uninitialised host memory; `*data` points at it.
inline Tensor host_tensor(const Shape& shape, DType dtype, void** data) {
  size_t bytes = static_cast<size_t>(numel(shape)) * itemsize(dtype);
  auto buf = ir::Buffer::alloc(bytes);
  *data = buf->data;
  return cstorch::make_tensor(cstorch::detail::make_constant_node(std::move(buf), shape, dtype));
}

template <class T>
Tensor host_tensor(const Shape& shape, DType dtype, T** data) {
  void* p = nullptr;
  Tensor t = host_tensor(shape, dtype, &p);
  *data = static_cast<T*>(p);
  return t;
}

}  // namespace cstorch::data::detail
