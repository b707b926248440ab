// CPU kernels for shape and indexing ops. Pure data movement (reshape, permute, expand, slice,
// cat, index_select, gather, tri) copies raw items by size, so one code path serves every dtype;
// index_add and scatter_add add in the element type.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "backend/cpu/dtype_dispatch.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/parallel.h"
#include "cstorch/core/error.h"

namespace cstorch::cpu {

namespace {

using Byte = unsigned char;

// A memcpy worth of work per parallel chunk, and the piece size long rows are cut into so that
// a few large rows still spread over the threads.
constexpr int64_t kCopyGrainBytes = 256 << 10;
constexpr int64_t kCopyPieceBytes = 64 << 10;
constexpr int64_t kTile = 32;  // transpose tile (elements): 2 tiles of 8-byte items fit in L1

// Calls f.operator()<W>() with W an unsigned word of `size` bytes: moving items by their bit
// pattern is exact for every dtype (bool, bf16 and f16 included).
template <class F>
void dispatch_word(size_t size, F&& f) {
  switch (size) {
    case 1:
      f.template operator()<uint8_t>(nullptr);
      return;
    case 2:
      f.template operator()<uint16_t>(nullptr);
      return;
    case 4:
      f.template operator()<uint32_t>(nullptr);
      return;
    case 8:
      f.template operator()<uint64_t>(nullptr);
      return;
  }
  fail("internal: unsupported item size {}", size);
}

template <class F>
void dispatch_index(DType t, F&& f) {
  if (t == DType::i32)
    f.template operator()<int32_t>(nullptr);
  else if (t == DType::i64)
    f.template operator()<int64_t>(nullptr);
  else
    fail("internal: index dtype {} reached a kernel", dtype_name(t));
}

// Copies `rows` rows of `row_bytes` bytes; src(r) and dst(r) give the row addresses.
template <class Src, class Dst>
void copy_rows(int64_t rows, int64_t row_bytes, Src src, Dst dst) {
  if (rows <= 0 || row_bytes <= 0) return;
  if (row_bytes <= kCopyPieceBytes) {
    int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / row_bytes);
    parallel_for(rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) std::memcpy(dst(r), src(r), row_bytes);
    });
    return;
  }
  int64_t pieces = (row_bytes + kCopyPieceBytes - 1) / kCopyPieceBytes;
  parallel_for(rows * pieces, kCopyGrainBytes / kCopyPieceBytes, [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      int64_t r = u / pieces, off = (u % pieces) * kCopyPieceBytes;
      std::memcpy(dst(r) + off, src(r) + off, std::min(kCopyPieceBytes, row_bytes - off));
    }
  });
}

void copy_bytes(Byte* dst, const Byte* src, int64_t n) {
  if (dst == src) return;
  copy_rows(
      1, n, [&](int64_t) { return src; }, [&](int64_t) { return dst; });
}

// Row-major walk over a shape carrying K linear offsets, each with its own strides; next()
// costs an add per operand instead of a div/mod per element.
template <int K>
struct Walker {
  int rank = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[K][kMaxDims] = {};
  int64_t idx[kMaxDims] = {};
  int64_t off[K] = {};

  void seek(int64_t linear) {
    for (int k = 0; k < K; ++k) off[k] = 0;
    for (int d = rank - 1; d >= 0; --d) {
      idx[d] = linear % shape[d];
      linear /= shape[d];
      for (int k = 0; k < K; ++k) off[k] += idx[d] * stride[k][d];
    }
  }
  void next() {
    for (int d = rank - 1; d >= 0; --d) {
      ++idx[d];
      for (int k = 0; k < K; ++k) off[k] += stride[k][d];
      if (idx[d] < shape[d]) return;
      for (int k = 0; k < K; ++k) off[k] -= stride[k][d] * shape[d];
      idx[d] = 0;
    }
  }
};

// Row-major strides of `s` (a 0-d shape is treated as [1]).
int contiguous_strides(const Shape& s, int64_t* st, int64_t* sh) {
  int r = static_cast<int>(s.size());
  if (r == 0) {
    st[0] = 1;
    sh[0] = 1;
    return 1;
  }
  int64_t acc = 1;
  for (int d = r - 1; d >= 0; --d) {
    st[d] = acc;
    sh[d] = s[d];
    acc *= s[d];
  }
  return r;
}

// Raises the op's error for the first index outside [0, size). Checked before any parallel
// work so kernels never throw from inside a parallel region.
template <class I>
void check_indices(const I* idx, int64_t n, int64_t size, const char* op, int64_t dim) {
  std::atomic<int64_t> first{n};
  parallel_for(n, kElementwiseGrain, [&](int64_t b, int64_t e) {
    bool bad = false;
    for (int64_t i = b; i < e; ++i)
      bad |= static_cast<uint64_t>(static_cast<int64_t>(idx[i])) >= static_cast<uint64_t>(size);
    if (!bad) return;
    int64_t i = b;
    while (static_cast<int64_t>(idx[i]) >= 0 && static_cast<int64_t>(idx[i]) < size) ++i;
    int64_t cur = first.load();
    while (i < cur && !first.compare_exchange_weak(cur, i)) {
    }
  });
  int64_t at = first.load();
  if (at < n)
    fail("{}: index {} at position {} is out of range for dim {} of size {} (valid range [0, {}))",
         op, static_cast<int64_t>(idx[at]), at, dim, size, size);
}

constexpr int64_t kIndexAhead = 4;  // index_add: destination rows prefetched ahead

template <class T>
inline T add_item(T a, T b) {
  if constexpr (std::is_same_v<T, bool>)
    return a || b;
  else
    return store<T>(load(a) + load(b));
}

}  // namespace

// Reshape is an alias in eager mode; this copy serves programs whose planner cannot alias.
void cpu_Reshape(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                 void* out) {
  copy_bytes(static_cast<Byte*>(out), static_cast<const Byte*>(in[0]),
             static_cast<int64_t>(n.nbytes()));
}

void cpu_Permute(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                 void* out) {
  const Shape& is = n.inputs[0]->shape;
  const auto& perm = n.attr<ir::PermuteAttrs>().perm;
  int64_t total = n.numel();
  if (total == 0) return;
  size_t isz = itemsize(n.dtype);
  int r = static_cast<int>(is.size());

  // Size-1 dims move nothing: drop them.
  int64_t newid[kMaxDims], s[kMaxDims];
  int rr = 0;
  for (int d = 0; d < r; ++d) {
    newid[d] = is[d] == 1 ? -1 : rr;
    if (is[d] != 1) s[rr++] = is[d];
  }
  int64_t p[kMaxDims];
  int pr = 0;
  for (int k = 0; k < r; ++k)
    if (newid[perm[k]] >= 0) p[pr++] = newid[perm[k]];

  // Input dims that stay adjacent and in order in the output move as one dim.
  int64_t gfirst[kMaxDims], glast[kMaxDims];
  int ng = 0;
  for (int k = 0; k < pr; ++k) {
    if (ng > 0 && p[k] == glast[ng - 1] + 1) {
      glast[ng - 1] = p[k];
    } else {
      gfirst[ng] = glast[ng] = p[k];
      ++ng;
    }
  }
  int R = ng;
  int64_t P[kMaxDims], IS[kMaxDims], IST[kMaxDims];
  for (int g = 0; g < R; ++g) {
    int rank = 0;
    for (int h = 0; h < R; ++h) rank += gfirst[h] < gfirst[g];
    P[g] = rank;
    int64_t size = 1;
    for (int64_t d = gfirst[g]; d <= glast[g]; ++d) size *= s[d];
    IS[rank] = size;
  }
  int64_t acc = 1;
  for (int d = R - 1; d >= 0; --d) {
    IST[d] = acc;
    acc *= IS[d];
  }

  const Byte* src = static_cast<const Byte*>(in[0]);
  Byte* dst = static_cast<Byte*>(out);
  if (R <= 1) {  // the permutation only moved size-1 dims
    copy_bytes(dst, src, total * static_cast<int64_t>(isz));
    return;
  }
  if (P[R - 1] == R - 1) {  // the innermost dim stays innermost: copy contiguous blocks
    int64_t inner = IS[R - 1], row_bytes = inner * static_cast<int64_t>(isz);
    Walker<1> w;
    w.rank = R - 1;
    for (int k = 0; k < R - 1; ++k) {
      w.shape[k] = IS[P[k]];
      w.stride[0][k] = IST[P[k]] * static_cast<int64_t>(isz);
    }
    int64_t rows = total / inner;
    parallel_for(rows, std::max<int64_t>(1, kCopyGrainBytes / row_bytes),
                 [&](int64_t b, int64_t e) {
                   Walker<1> c = w;
                   c.seek(b);
                   for (int64_t row = b; row < e; ++row, c.next())
                     std::memcpy(dst + row * row_bytes, src + c.off[0], row_bytes);
                 });
    return;
  }
  // The innermost input dim (stride 1) lands at output dim q, while the output's innermost dim
  // reads input stride `ls`: a strided 2-D transpose per index of the other dims, done in
  // square tiles so that reads and writes each stay within a few cache lines.
  int64_t OST[kMaxDims];
  acc = 1;
  for (int k = R - 1; k >= 0; --k) {
    OST[k] = acc;
    acc *= IS[P[k]];
  }
  int q = 0;
  while (P[q] != R - 1) ++q;
  int64_t M = IS[R - 1], N = IS[P[R - 1]], oq = OST[q], ls = IST[P[R - 1]];
  Walker<2> w;  // the other dims: offsets into the input (0) and the output (1)
  for (int k = 0; k < R - 1; ++k) {
    if (k == q) continue;
    w.shape[w.rank] = IS[P[k]];
    w.stride[0][w.rank] = IST[P[k]];
    w.stride[1][w.rank] = OST[k];
    ++w.rank;
  }
  int64_t tm = (M + kTile - 1) / kTile, tn = (N + kTile - 1) / kTile, tiles = tm * tn;
  int64_t units = total / (M * N) * tiles;
  dispatch_word(isz, [&]<class W>(W*) {
    const W* x = reinterpret_cast<const W*>(src);
    W* o = reinterpret_cast<W*>(dst);
    parallel_for(units, std::max<int64_t>(1, kElementwiseGrain / (kTile * kTile)),
                 [&](int64_t b, int64_t e) {
                   Walker<2> c = w;
                   for (int64_t u = b; u < e; ++u) {
                     c.seek(u / tiles);
                     int64_t ti = (u % tiles) / tn, tj = u % tn;
                     const W* xb = x + c.off[0];
                     W* ob = o + c.off[1];
                     int64_t i0 = ti * kTile, i1 = std::min(M, i0 + kTile);
                     int64_t j0 = tj * kTile, j1 = std::min(N, j0 + kTile);
                     for (int64_t i = i0; i < i1; ++i)
                       for (int64_t j = j0; j < j1; ++j) ob[i * oq + j] = xb[i + j * ls];
                   }
                 });
  });
}

void cpu_Expand(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const Shape& is = n.inputs[0]->shape;
  const Shape& os = n.shape;
  int64_t total = n.numel();
  if (total == 0) return;
  size_t isz = itemsize(n.dtype);
  int ro = static_cast<int>(os.size()), lead = ro - static_cast<int>(is.size());

  // Collapse to alternating runs of broadcast (input stride 0) and copied dims.
  int64_t S[kMaxDims], ST[kMaxDims];
  int R = 0;
  int64_t cs = 1;  // contiguous input stride of dim d
  int64_t in_st[kMaxDims];
  for (int d = ro - 1; d >= 0; --d) {
    int64_t isize = d < lead ? 1 : is[d - lead];
    in_st[d] = cs;
    cs *= isize;
  }
  for (int d = 0; d < ro; ++d) {
    if (os[d] == 1) continue;
    int64_t isize = d < lead ? 1 : is[d - lead];
    int64_t st = isize == 1 ? 0 : in_st[d];
    if (R > 0 && ((ST[R - 1] == 0 && st == 0) || (st != 0 && ST[R - 1] == st * os[d]))) {
      S[R - 1] *= os[d];
      ST[R - 1] = st;
      continue;
    }
    S[R] = os[d];
    ST[R] = st;
    ++R;
  }

  const Byte* src = static_cast<const Byte*>(in[0]);
  Byte* dst = static_cast<Byte*>(out);
  if (R == 0) {  // every dim has size 1
    std::memcpy(dst, src, isz);
    return;
  }
  int64_t inner = S[R - 1], rows = total / inner;
  bool fill = ST[R - 1] == 0;
  Walker<1> w;
  w.rank = R - 1;
  for (int k = 0; k < R - 1; ++k) {
    w.shape[k] = S[k];
    w.stride[0][k] = ST[k];
  }
  int64_t grain = std::max<int64_t>(1, kCopyGrainBytes / (inner * static_cast<int64_t>(isz)));
  dispatch_word(isz, [&]<class W>(W*) {
    const W* x = reinterpret_cast<const W*>(src);
    W* o = reinterpret_cast<W*>(dst);
    parallel_for(rows, grain, [&](int64_t b, int64_t e) {
      Walker<1> c = w;
      c.seek(b);
      for (int64_t row = b; row < e; ++row, c.next()) {
        W* orow = o + row * inner;
        if (fill)
          std::fill(orow, orow + inner, x[c.off[0]]);
        else
          std::memcpy(orow, x + c.off[0], inner * sizeof(W));
      }
    });
  });
}

void cpu_Slice(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const auto& a = n.attr<ir::SliceAttrs>();
  const Shape& is = n.inputs[0]->shape;
  int64_t outer = numel(is, 0, a.dim), S = is[a.dim], L = n.shape[a.dim];
  int64_t inner = numel(is, a.dim + 1, static_cast<int64_t>(is.size()));
  int64_t isz = static_cast<int64_t>(itemsize(n.dtype)), row = inner * isz;
  const Byte* src = static_cast<const Byte*>(in[0]);
  Byte* dst = static_cast<Byte*>(out);
  if (n.numel() == 0) return;
  if (a.step == 1) {
    copy_rows(
        outer, L * row, [&](int64_t r) { return src + (r * S + a.start) * row; },
        [&](int64_t r) { return dst + r * L * row; });
  } else if (inner == 1) {  // strided items: a typed loop beats one memcpy per item
    dispatch_word(static_cast<size_t>(isz), [&]<class W>(W*) {
      const W* x = reinterpret_cast<const W*>(src);
      W* o = reinterpret_cast<W*>(dst);
      parallel_for(outer, std::max<int64_t>(1, kElementwiseGrain / L), [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
          for (int64_t j = 0; j < L; ++j) o[r * L + j] = x[r * S + a.start + j * a.step];
      });
    });
  } else {
    copy_rows(
        outer * L, row,
        [&](int64_t r) { return src + ((r / L) * S + a.start + (r % L) * a.step) * row; },
        [&](int64_t r) { return dst + r * row; });
  }
}

void cpu_Cat(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  int64_t dim = n.attr<ir::DimAttrs>().dim;
  const Shape& os = n.shape;
  int64_t outer = numel(os, 0, dim), D = os[dim];
  int64_t row =
      numel(os, dim + 1, static_cast<int64_t>(os.size())) * static_cast<int64_t>(itemsize(n.dtype));
  Byte* dst = static_cast<Byte*>(out);
  int64_t off = 0;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    int64_t dk = n.inputs[k]->shape[dim];
    const Byte* src = static_cast<const Byte*>(in[k]);
    copy_rows(
        outer, dk * row, [&](int64_t r) { return src + r * dk * row; },
        [&](int64_t r) { return dst + (r * D + off) * row; });
    off += dk;
  }
}

void cpu_IndexSelect(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                     void* out) {
  const ir::Node& a = *n.inputs[0];
  const ir::Node& index = *n.inputs[1];
  int64_t dim = n.attr<ir::DimAttrs>().dim;
  bool scalar = a.shape.empty();
  int64_t outer = scalar ? 1 : numel(a.shape, 0, dim), S = scalar ? 1 : a.shape[dim];
  int64_t inner = scalar ? 1 : numel(a.shape, dim + 1, static_cast<int64_t>(a.shape.size()));
  int64_t row = inner * static_cast<int64_t>(itemsize(a.dtype)), m = index.numel();
  const Byte* src = static_cast<const Byte*>(in[0]);
  Byte* dst = static_cast<Byte*>(out);
  dispatch_index(index.dtype, [&]<class I>(I*) {
    const I* idx = static_cast<const I*>(in[1]);
    check_indices(idx, m, S, "index_select", dim);
    copy_rows(
        outer * m, row,
        [&](int64_t r) { return src + ((r / m) * S + static_cast<int64_t>(idx[r % m])) * row; },
        [&](int64_t r) { return dst + r * row; });
  });
}

void cpu_IndexAdd(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                  void* out) {
  const ir::Node& a = *n.inputs[0];
  const ir::Node& index = *n.inputs[1];
  int64_t dim = n.attr<ir::DimAttrs>().dim;
  bool scalar = a.shape.empty();
  int64_t outer = scalar ? 1 : numel(a.shape, 0, dim), S = scalar ? 1 : a.shape[dim];
  int64_t inner = scalar ? 1 : numel(a.shape, dim + 1, static_cast<int64_t>(a.shape.size()));
  int64_t m = index.numel();
  dispatch_index(index.dtype, [&]<class I>(I*) {
    const I* idx = static_cast<const I*>(in[1]);
    check_indices(idx, m, S, "index_add", dim);
    copy_bytes(static_cast<Byte*>(out), static_cast<const Byte*>(in[0]),
               static_cast<int64_t>(n.nbytes()));
    if (m == 0 || outer * inner == 0) return;
    dispatch_all(n.dtype, [&]<class T>(T*) {
      const T* sv = static_cast<const T*>(in[2]);
      T* o = static_cast<T*>(out);
      // Each (outer, inner) column is owned by one chunk, so repeated indices accumulate
      // without races and in index order.
      int64_t grain = std::max<int64_t>(1, kElementwiseGrain / m);
      parallel_for(outer * inner, grain, [&](int64_t b, int64_t e) {
        for (int64_t q = b / inner; q * inner < e; ++q) {
          int64_t i0 = std::max(b, q * inner) - q * inner;
          int64_t i1 = std::min(e, (q + 1) * inner) - q * inner;
          for (int64_t j = 0; j < m; ++j) {
            T* d = o + (q * S + static_cast<int64_t>(idx[j])) * inner;
            const T* s = sv + (q * m + j) * inner;
            // The destination row kIndexAhead indices on: rows of a large table (an embedding's
            // gradient) in index order, which no hardware prefetcher can guess.
            if (j + kIndexAhead < m) {
              const char* p = reinterpret_cast<const char*>(
                  o + (q * S + static_cast<int64_t>(idx[j + kIndexAhead])) * inner + i0);
              for (int64_t b = 0; b < (i1 - i0) * static_cast<int64_t>(sizeof(T)); b += 64)
                __builtin_prefetch(p + b, 1, 3);
            }
            // s (a separate input) never overlaps d (the result's buffer).
#pragma omp simd
            for (int64_t i = i0; i < i1; ++i) d[i] = add_item(d[i], s[i]);
          }
        }
      });
    });
  });
}

void cpu_Gather(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const ir::Node& a = *n.inputs[0];
  const ir::Node& index = *n.inputs[1];
  int64_t dim = n.attr<ir::DimAttrs>().dim;
  int64_t total = index.numel();
  if (total == 0) return;
  int64_t ast[kMaxDims], ash[kMaxDims];
  contiguous_strides(a.shape, ast, ash);
  Walker<1> w;
  w.rank = contiguous_strides(index.shape, w.stride[0], w.shape);
  for (int d = 0; d < w.rank; ++d) w.stride[0][d] = d == dim ? 0 : ast[d];
  int64_t dstride = ast[dim], size = ash[dim];
  dispatch_index(index.dtype, [&]<class I>(I*) {
    const I* idx = static_cast<const I*>(in[1]);
    check_indices(idx, total, size, "gather", dim);
    dispatch_word(itemsize(n.dtype), [&]<class W>(W*) {
      const W* x = static_cast<const W*>(in[0]);
      W* o = static_cast<W*>(out);
      parallel_for(total, kElementwiseGrain, [&](int64_t b, int64_t e) {
        Walker<1> c = w;
        c.seek(b);
        for (int64_t i = b; i < e; ++i, c.next())
          o[i] = x[c.off[0] + static_cast<int64_t>(idx[i]) * dstride];
      });
    });
  });
}

void cpu_ScatterAdd(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in,
                    void* out) {
  const ir::Node& index = *n.inputs[1];
  const ir::Node& src = *n.inputs[2];
  int64_t dim = n.attr<ir::DimAttrs>().dim;
  int64_t total = index.numel();
  int64_t ost[kMaxDims], osh[kMaxDims], sst[kMaxDims], ssh[kMaxDims];
  contiguous_strides(n.shape, ost, osh);
  contiguous_strides(src.shape, sst, ssh);
  Walker<2> w;
  w.rank = contiguous_strides(index.shape, w.stride[0], w.shape);
  for (int d = 0; d < w.rank; ++d) {
    w.stride[0][d] = d == dim ? 0 : ost[d];
    w.stride[1][d] = sst[d];
  }
  int64_t dstride = ost[dim], size = osh[dim];
  // Index positions that differ before `dim` write disjoint output rows: parallel over those.
  int64_t outer = 1;
  for (int d = 0; d < dim; ++d) outer *= w.shape[d];
  int64_t per = outer == 0 ? 0 : total / outer;
  dispatch_index(index.dtype, [&]<class I>(I*) {
    const I* idx = static_cast<const I*>(in[1]);
    check_indices(idx, total, size, "scatter_add", dim);
    copy_bytes(static_cast<Byte*>(out), static_cast<const Byte*>(in[0]),
               static_cast<int64_t>(n.nbytes()));
    if (total == 0) return;
    dispatch_all(n.dtype, [&]<class T>(T*) {
      const T* sv = static_cast<const T*>(in[2]);
      T* o = static_cast<T*>(out);
      parallel_for(outer, std::max<int64_t>(1, kElementwiseGrain / per), [&](int64_t b, int64_t e) {
        Walker<2> c = w;
        c.seek(b * per);
        for (int64_t i = b * per; i < e * per; ++i, c.next()) {
          T& d = o[c.off[0] + static_cast<int64_t>(idx[i]) * dstride];
          d = add_item(d, sv[c.off[1]]);
        }
      });
    });
  });
}

void cpu_Tri(const ir::KernelContext& ctx, const ir::Node& n, const void* const* in, void* out) {
  const auto& a = n.attr<ir::TriAttrs>();
  const Shape& s = n.shape;
  int64_t r = static_cast<int64_t>(s.size());
  int64_t M = s[r - 2], N = s[r - 1], rows = numel(s, 0, r - 1);
  int64_t isz = static_cast<int64_t>(itemsize(n.dtype)), row = N * isz;
  if (rows == 0 || N == 0) return;
  const Byte* src = static_cast<const Byte*>(in[0]);
  Byte* dst = static_cast<Byte*>(out);
  // All-zero bytes are zero in every dtype, so masking is memset plus memcpy per row.
  parallel_for(rows, std::max<int64_t>(1, kCopyGrainBytes / row), [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      int64_t i = q % M;
      int64_t lo = a.upper ? std::clamp<int64_t>(i + a.diagonal, 0, N) : 0;
      int64_t hi = a.upper ? N : std::clamp<int64_t>(i + a.diagonal + 1, 0, N);
      Byte* o = dst + q * row;
      const Byte* x = src + q * row;
      std::memset(o, 0, lo * isz);
      std::memcpy(o + lo * isz, x + lo * isz, (hi - lo) * isz);
      std::memset(o + hi * isz, 0, (N - hi) * isz);
    }
  });
}

}  // namespace cstorch::cpu
