// The CUDA Fused kernel's per-thread work run on the host (elementwise_math.cuh is __host__
// __device__ code): a thread's group of kFusedLanes elements (fused_elements, the kernel's unit of
// work, each input's index stepped from the group's first) must give each element the value a
// group of one element gives it (its indices computed by division), bit for bit, for programs
// over every instruction, broadcast inputs of every kind (one value, rows, columns, a middle
// dim), bool and bf16 inputs and groups cut by the end of the output. Built with
// -ffp-contract=off (tests/CMakeLists.txt), as the header asks of host builds, so the two paths'
// arithmetic is compiled alike.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/fused_plan.h"
#include "backend/cuda/kernels/elementwise_math.cuh"

namespace {

using namespace cstorch::cuda::k;

void check_groups(const FusedProgram& p, int64_t n, int trial, int64_t& checked) {
  constexpr int L = kFusedLanes;
  for (int64_t i0 = 0; i0 < n; i0 += L) {
    const int cnt = static_cast<int>(std::min<int64_t>(L, n - i0));
    float group[L];
    fused_elements<CudaMath, L>(p, i0, cnt, n, group);
    for (int e = 0; e < cnt; ++e) {
      float single[1];
      fused_elements<CudaMath, 1>(p, i0 + e, 1, n, single);
      const float one = single[0];
      uint32_t x, y;
      std::memcpy(&x, &group[e], 4);
      std::memcpy(&y, &one, 4);
      // NaNs may differ in payload only where the program makes them alike in both paths.
      ASSERT_TRUE(x == y || (one != one && group[e] != group[e]))
          << "trial " << trial << " element " << i0 + e << ": " << group[e] << " vs " << one;
      ++checked;
    }
  }
}

TEST(CudaFusedHost, AThreadsGroupOfElementsGetsTheOneElementValues) {
  std::mt19937 rng(7);
  // Output shapes [a, b, c]; inputs broadcast as (div, mod) over the flat index.
  const int64_t shapes[][3] = {{3, 5, 7}, {1, 1, 13}, {4, 1, 6}, {2, 3, 1}, {5, 9, 11}};
  int64_t checked = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const auto& sh = shapes[trial % 5];
    const int64_t a = sh[0], b = sh[1], c = sh[2], n = a * b * c;
    // (div, mod) of: the full shape, one value, the last dim (rows), the first dim (columns),
    // the middle dim.
    const int64_t forms[][2] = {{1, n}, {1, 1}, {1, c}, {b * c, a}, {c, b}};
    FusedProgram p;
    p.ninputs = 1 + static_cast<int>(rng() % 4);
    std::vector<std::vector<float>> f32(p.ninputs);
    std::vector<std::vector<uint8_t>> bools(p.ninputs);
    std::vector<std::vector<bf16>> halves(p.ninputs);
    for (int k = 0; k < p.ninputs; ++k) {
      const auto& f = forms[rng() % 5];
      p.div[k] = f[0];
      p.mod[k] = f[1];
      const int kind = static_cast<int>(rng() % 4);  // 0, 1: f32; 2: bool; 3: bf16
      const int64_t len = f[1];
      std::uniform_real_distribution<float> u(-3.0f, 3.0f);
      if (kind == 2) {
        p.bool_inputs |= 1u << k;
        for (int64_t i = 0; i < len; ++i) bools[k].push_back(static_cast<uint8_t>(rng() % 2));
        p.in[k] = bools[k].data();
      } else if (kind == 3) {
        p.bf16_inputs |= 1u << k;
        for (int64_t i = 0; i < len; ++i) halves[k].push_back(store<bf16>(u(rng)));
        p.in[k] = halves[k].data();
      } else {
        for (int64_t i = 0; i < len; ++i) f32[k].push_back(u(rng));
        p.in[k] = f32[k].data();
      }
    }
    p.ncode = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < p.ncode; ++i) {
      FusedIns& s = p.code[i];
      s.op = static_cast<FOp>(rng() % static_cast<unsigned>(FOp::kCount));
      s.flag = static_cast<uint8_t>(rng() % 2);
      if (s.op == FOp::Cast) s.flag = 0;  // to f32 (the flag's bool form is exercised by Eq)
      for (int j = 0; j < cstorch::cuda::fused_arity(s.op); ++j)
        s.args[j] = static_cast<uint8_t>(rng() % static_cast<unsigned>(p.ninputs + i));
    }
    p.out_bf16 = 0;
    check_groups(p, n, trial, checked);
  }
  EXPECT_GT(checked, 200000);
  // The kernel's choice: groups for short programs over large outputs only.
  FusedProgram p;
  p.ninputs = 3;
  p.ncode = 3;
  EXPECT_EQ(fused_lanes(p, 1 << 20), kFusedLanes);
  EXPECT_EQ(fused_lanes(p, 768), 1);
  p.ninputs = 7;
  p.ncode = 6;
  EXPECT_EQ(fused_lanes(p, 1 << 20), 1);
}

}  // namespace
