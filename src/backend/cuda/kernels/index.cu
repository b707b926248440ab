// CUDA indexing kernels: index_select, index_add, gather and scatter_add along one dim. Indices
// are i32 or i64 and live on the device, so a bad one cannot throw here: it stores kErrorIndex in
// the backend's error word (raised at the next host read) and its element is skipped. Every sum
// into one destination runs in one thread in index order, the CPU's order: results are the CPU's
// bits and do not depend on scheduling (no atomics).
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels/common.cuh"

namespace cstorch::cuda::k {

namespace {

__device__ inline int64_t index_at(const void* idx, bool idx64, int64_t k) {
  return idx64 ? static_cast<const int64_t*>(idx)[k] : static_cast<const int32_t*>(idx)[k];
}

__device__ inline bool in_range(int64_t v, int64_t size) {
  return static_cast<uint64_t>(v) < static_cast<uint64_t>(size);
}

// y [outer, m, inner] from x [outer, size, inner]: element e = (o, j, i) reads x[o, idx[j], i].
template <class W>
__global__ void index_select_kernel(const W* __restrict__ x, const void* idx, bool idx64,
                                    W* __restrict__ y, int64_t size, int64_t inner, int64_t m,
                                    int64_t total, int* error) {
  CS_GRID_STRIDE(e, total) {
    const int64_t i = e % inner, j = (e / inner) % m, o = e / (inner * m);
    const int64_t v = index_at(idx, idx64, j);
    if (!in_range(v, size)) {
      report(error, kErrorIndex);
      y[e] = W(0);
      continue;
    }
    y[e] = x[(o * size + v) * inner + i];
  }
}

// One thread per (outer, inner) column and destination bucket: destinations are shared out in
// `buckets` ranges of `chunk` rows, and the thread of bucket b adds src[o, j, i] into
// y[o, idx[j], i] for every j in order whose idx[j] falls in its range. Each destination still
// has one thread adding in index order (the CPU's bits); the buckets only give a long index
// with few columns (an embedding's gradient: 768 columns, thousands of tokens) more threads
// than columns. Every bucket sees a bad index; any of them reports it.
template <class T>
__global__ void index_add_kernel(const void* idx, bool idx64, const T* __restrict__ src, T* y,
                                 int64_t outer, int64_t size, int64_t inner, int64_t m,
                                 int64_t buckets, int64_t chunk, int* error) {
  const int64_t cols = outer * inner;
  CS_GRID_STRIDE(t, cols * buckets) {
    const int64_t c = t % cols, lo = (t / cols) * chunk, hi = lo + chunk;
    const int64_t o = c / inner, i = c % inner;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t v = index_at(idx, idx64, j);
      if (!in_range(v, size)) {
        report(error, kErrorIndex);
        continue;
      }
      if (v < lo || v >= hi) continue;
      T& d = y[(o * size + v) * inner + i];
      d = d + src[(o * m + j) * inner + i];
    }
  }
}

// Element e of the index (row-major over w.shape) reads x at its coordinates with the index's
// value along `dim` (strides[0] is 0 there).
template <class W>
__global__ void gather_kernel(IndexWalk w, const W* __restrict__ x, const void* idx, bool idx64,
                              W* __restrict__ y, int64_t n, int64_t dstride, int64_t size,
                              int* error) {
  CS_GRID_STRIDE(e, n) {
    int64_t rest = e, off = 0;
    for (int d = w.rank - 1; d >= 0; --d) {
      off += (rest % w.shape[d]) * w.strides[0][d];
      rest /= w.shape[d];
    }
    const int64_t v = index_at(idx, idx64, e);
    if (!in_range(v, size)) {
      report(error, kErrorIndex);
      y[e] = W(0);
      continue;
    }
    y[e] = x[off + v * dstride];
  }
}

// One thread per line of index positions along `dim` (lines = index elements / shape[dim]): the
// positions of a line are the only ones that can share a destination, and they add in order.
template <class T>
__global__ void scatter_add_kernel(IndexWalk w, int dim, const void* idx, bool idx64,
                                   const T* __restrict__ src, T* y, int64_t lines, int64_t dstride,
                                   int64_t size, int* error) {
  const int64_t len = w.shape[dim];
  int64_t istride = 1;  // the index's (contiguous) stride along dim
  for (int d = w.rank - 1; d > dim; --d) istride *= w.shape[d];
  CS_GRID_STRIDE(l, lines) {
    // Coordinates of line l over every dim but `dim`, innermost first.
    int64_t rest = l, pos = 0, dst = 0, sp = 0, stride = 1;
    for (int d = w.rank - 1; d >= 0; --d) {
      if (d == dim) {
        stride *= len;
        continue;
      }
      const int64_t c = rest % w.shape[d];
      rest /= w.shape[d];
      pos += c * stride;
      stride *= w.shape[d];
      dst += c * w.strides[0][d];
      sp += c * w.strides[1][d];
    }
    for (int64_t k = 0; k < len; ++k) {
      const int64_t v = index_at(idx, idx64, pos + k * istride);
      if (!in_range(v, size)) {
        report(error, kErrorIndex);
        continue;
      }
      T& d = y[dst + v * dstride];
      d = d + src[sp + k * w.strides[1][dim]];
    }
  }
}

// Calls f with a null pointer of the C++ type of an arithmetic dtype (f32, i32, i64).
template <class F>
void with_number(Ty t, F&& f) {
  switch (t) {
    case Ty::i32:
      return f(static_cast<int32_t*>(nullptr));
    case Ty::i64:
      return f(static_cast<int64_t*>(nullptr));
    default:
      return f(static_cast<float*>(nullptr));
  }
}

}  // namespace

void index_select(const void* x, const void* idx, bool idx64, void* y, int64_t outer, int64_t size,
                  int64_t inner, int64_t m, int item_bytes, int* error, void* stream) {
  const int64_t total = outer * m * inner;
  with_word(item_bytes, [&](auto* tag) {
    using W = std::remove_pointer_t<decltype(tag)>;
    index_select_kernel<W><<<blocks_for(total), kThreads, 0, as_stream(stream)>>>(
        static_cast<const W*>(x), idx, idx64, static_cast<W*>(y), size, inner, m, total, error);
  });
}

void index_add(Ty t, const void* idx, bool idx64, const void* src, void* y, int64_t outer,
               int64_t size, int64_t inner, int64_t m, int* error, void* stream) {
  with_number(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    // About 64K threads where the columns alone are fewer and the index is long enough to
    // share out; one bucket (the whole range) otherwise.
    const int64_t cols = outer * inner;
    int64_t buckets = 1;
    if (cols < 16384 && m >= 256) buckets = std::min<int64_t>({65536 / cols, size, 256});
    if (buckets < 1) buckets = 1;
    const int64_t chunk = (size + buckets - 1) / buckets;
    buckets = chunk > 0 ? (size + chunk - 1) / chunk : 1;
    index_add_kernel<T><<<blocks_for(cols * buckets), kThreads, 0, as_stream(stream)>>>(
        idx, idx64, static_cast<const T*>(src), static_cast<T*>(y), outer, size, inner, m, buckets,
        chunk > 0 ? chunk : 1, error);
  });
}

void gather(const IndexWalk& w, const void* x, const void* idx, bool idx64, void* y, int64_t n,
            int64_t dstride, int64_t size, int item_bytes, int* error, void* stream) {
  with_word(item_bytes, [&](auto* tag) {
    using W = std::remove_pointer_t<decltype(tag)>;
    gather_kernel<W><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(
        w, static_cast<const W*>(x), idx, idx64, static_cast<W*>(y), n, dstride, size, error);
  });
}

void scatter_add(Ty t, const IndexWalk& w, int dim, const void* idx, bool idx64, const void* src,
                 void* y, int64_t dstride, int64_t size, int* error, void* stream) {
  int64_t total = 1;
  for (int d = 0; d < w.rank; ++d) total *= w.shape[d];
  const int64_t lines = total / w.shape[dim];
  with_number(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    scatter_add_kernel<T><<<blocks_for(lines), kThreads, 0, as_stream(stream)>>>(
        w, dim, idx, idx64, static_cast<const T*>(src), static_cast<T*>(y), lines, dstride, size,
        error);
  });
}

}  // namespace cstorch::cuda::k
