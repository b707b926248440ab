// The rows of a GEMM micro-kernel's in-place operand (op(A) read where it lies, rows along K),
// addressed from one pointer per four rows and two strides: rows 4q + {0, 1, 2, 3} at
// g[q] + {0, L, 2L, 3L}, which x86's base + index * scale addressing covers in each load. With a
// pointer per row, a 12-row tile's pointers do not fit the general registers beside the loop's
// own, and GCC moved some through the stack or vector registers on every step (gemm.cpp,
// gemm_bf16.cpp; measured in bench/README.md).
#pragma once
#include <cstdint>

namespace cstorch::cpu {

template <class T, int Rows>
struct TileRows {
  static constexpr int kGroups = (Rows + 3) / 4;
  const T* g[kGroups];
  int64_t L, L3;  // elements of T between consecutive rows, and three times that

  TileRows(const T* first, int64_t stride) : L(stride), L3(3 * stride) {
    for (int q = 0; q < kGroups; ++q) g[q] = first + 4 * q * stride;
  }
  // Call once per step of the loop: with the strides opaque, GCC cannot fold each row's address
  // into an induction variable of its own again.
  void hide_strides() { asm("" : "+r"(L), "+r"(L3)); }
  const T* row(int r) const {
    const T* q = g[r / 4];
    return r % 4 == 0 ? q : r % 4 == 1 ? q + L : r % 4 == 2 ? q + 2 * L : q + L3;
  }
  void advance(int64_t n) {
    for (int q = 0; q < kGroups; ++q) g[q] += n;
  }
};

}  // namespace cstorch::cpu
