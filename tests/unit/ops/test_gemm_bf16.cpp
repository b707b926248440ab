// The bf16 GEMM (src/backend/cpu/gemm_bf16.cpp, VDPBF16PS) against a double-precision product
// of the same bf16 values: every transpose, leading dims with padding, odd K, several K blocks
// and column blocks, 1-3 threads (bitwise the same result), the scratch guards, and the result
// stored as bf16 (with a bias) bitwise the f32 result rounded; then the
// bf16 Linear and Matmul kernels against their f32 products.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/amx.h"
#include "backend/cpu/variant.h"
#include "cstorch/cstorch.h"

namespace {

namespace cpu = cstorch::cpu;

uint16_t to_bf16(float x) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
double from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

struct Case {
  int64_t M, N, K;
  bool ta, tb;
};

// C from 1, 2 and 3 threads (bitwise equal), checked against the double product: the bf16
// products are exact in f32, so the only error is f32 summation, bounded by K * 2^-24 * sum|ab|
// (4 * K * 2^-24 allowed), plus flushed denormals (none here: values are O(1)).
void check(const Case& c, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const int64_t lda = (c.ta ? c.M : c.K) + 3, ldb = (c.tb ? c.K : c.N) + 1, ldc = c.N + 2;
  std::vector<uint16_t> A((c.ta ? c.K : c.M) * lda), B((c.tb ? c.N : c.K) * ldb);
  for (auto& x : A) x = to_bf16(u(rng));
  for (auto& x : B) x = to_bf16(u(rng));
  const size_t floats = cpu::kernels().sgemm_bf16_scratch_floats();
  std::vector<float> first;
  for (int threads : {1, 2, 3}) {
    const size_t stride = floats + 16;
    std::vector<float> ws(stride * threads + 16, -7.f);
    // 64-byte aligned areas, as a planned workspace is.
    float* base = ws.data();
    while (reinterpret_cast<uintptr_t>(base) % 64) ++base;
    const cpu::Scratch scratch{base, stride, floats, threads};
    std::vector<float> C(c.M * ldc, 5.f);
    ASSERT_TRUE(cpu::kernels().sgemm_bf16(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb,
                                          C.data(), ldc, threads, scratch, {}));
    for (int t = 0; t < threads; ++t)
      for (size_t i = floats; i < stride; ++i)
        ASSERT_EQ(base[t * stride + i], -7.f) << "guard after area " << t << " written";
    if (first.empty()) {
      first = C;
      for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          if (j >= c.N) {
            ASSERT_EQ(C[i * ldc + j], 5.f) << "padding column written";
            continue;
          }
          double s = 0, mag = 0;
          for (int64_t k = 0; k < c.K; ++k) {
            const double p = from_bf16(c.ta ? A[k * lda + i] : A[i * lda + k]) *
                             from_bf16(c.tb ? B[j * ldb + k] : B[k * ldb + j]);
            s += p;
            mag += std::fabs(p);
          }
          ASSERT_LE(std::fabs(C[i * ldc + j] - s), 4.0 * c.K * std::ldexp(mag, -24) + 1e-30)
              << "M" << c.M << " N" << c.N << " K" << c.K << " ta" << c.ta << " tb" << c.tb
              << " at (" << i << ", " << j << ")";
        }
    } else {
      EXPECT_EQ(C, first) << threads << " threads differ from 1";
    }
    // Stored as bf16, with and without a bias: bitwise the f32 result (plus the bias) rounded,
    // and nothing written past N.
    std::vector<float> bias(c.N);
    for (auto& x : bias) x = u(rng);
    for (bool with_bias : {false, true}) {
      std::vector<uint16_t> C16(c.M * ldc, 0xBEEF);
      std::vector<float> partial(c.M * ldc, 5.f);
      ASSERT_TRUE(cpu::kernels().sgemm_bf16(c.ta, c.tb, c.M, c.N, c.K, A.data(), lda, B.data(), ldb,
                                            partial.data(), ldc, threads, scratch,
                                            {C16.data(), with_bias ? bias.data() : nullptr}));
      for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = 0; j < ldc; ++j) {
          const float f = first[i * ldc + j];
          const uint16_t want = j >= c.N ? 0xBEEF : to_bf16(with_bias ? f + bias[j] : f);
          ASSERT_EQ(C16[i * ldc + j], want)
              << "bf16 result, bias " << with_bias << ", M" << c.M << " N" << c.N << " K" << c.K
              << " ta" << c.ta << " tb" << c.tb << ", " << threads << " threads, at (" << i << ", "
              << j << ")";
        }
    }
  }
}

// The paths sgemm_bf16 can take on this CPU: VDPBF16PS, and AMX tiles where the CPU has them.
// Runs f once on each (turning the tiles off for the second) and leaves them as they were.
template <class F>
void on_each_path(F&& f) {
  const bool amx = cpu::kernels().bf16_gemm_amx(-1);
  for (bool tiles : {true, false}) {
    if (tiles && !amx) continue;
    cpu::kernels().bf16_gemm_amx(tiles ? 1 : 0);
    SCOPED_TRACE(tiles ? "AMX tiles" : "VDPBF16PS");
    f();
  }
  cpu::kernels().bf16_gemm_amx(amx ? 1 : 0);
}

// Where /proc/cpuinfo lists AMX-BF16 and the tiles and Linux grants this process the tile state
// (since 5.16, unless a sandbox refuses the request), the products run on them; elsewhere never.
TEST(GemmBf16, TilesRunWhereTheCpuHasThem) {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  bool amx_bf16 = false, amx_tile = false;
  while (std::getline(info, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    amx_bf16 = line.find(" amx_bf16") != std::string::npos;
    amx_tile = line.find(" amx_tile") != std::string::npos;
    break;
  }
  const bool runs = cpu::kernels().bf16_gemm_runs_here();
  if (runs && amx_bf16 && amx_tile && !cpu::amx_granted())
    GTEST_SKIP() << "the CPU has AMX tiles but this process may not use them (the OS refused)";
  EXPECT_EQ(cpu::kernels().bf16_gemm_amx(-1), runs && amx_bf16 && amx_tile);
}

TEST(GemmBf16, MatchesTheDoubleProductOnEveryLayout) {
  if (!cpu::kernels().bf16_gemm_runs_here())
    GTEST_SKIP() << "this CPU has no avx512_bf16 (or the variant no AVX-512): bf16 products are "
                    "widened to f32 there (GemmBf16.KernelsAgreeWithF32 checks that path)";
  on_each_path([] {
    std::mt19937 rng(11);
    const Case cases[] = {
        {1, 1, 1, false, false},
        {12, 32, 2, false, true},
        {13, 33, 3, true, false},
        {25, 70, 513, false, true},
        {40, 100, 1031, true, true},
        {7, 600, 64, false, false},
        {400, 40, 17, true, false},
        {64, 1100, 96, false, true},
        {390, 530, 520, false, false},
        // Three K blocks of 267 pairs, whose A blocks (180 rows) and B blocks (480 columns) are
        // each several on one thread.
        {200, 600, 1600, true, false},
        // A linear layer's forward with more columns than rows, computed as C^T = B A^T (the
        // weight read in place): edges in both dims, three K blocks, unaligned weight rows.
        {70, 300, 1800, false, true},
        {100, 2000, 64, false, true},
        // Rows read in place (K a multiple of 32) with a last group of fewer than 16 rows; then
        // several K blocks of whole tile chunks in place, and a few rows in one group.
        {77, 50, 768, false, false},
        {250, 40, 3072, false, true},
        {5, 17, 1024, false, false},
        // A one-row transposed A (lda = 1: a layer with one output's weight gradient), whose
        // strides are both 1 (the f32 GEMM once took its copy for rows along k).
        {1, 32, 512, true, false},
    };
    for (const Case& c : cases) check(c, rng);
  });
}

// The swapped form (A B^T with N > M, computed as C^T = B A^T) against the direct form of the
// same product (B given un-transposed, which packs B): the same pairs summed in the same order,
// so bitwise equal, in each way a result is stored (f32, bf16 with a bias, f32 rounded to bf16),
// at 1 and 2 threads.
TEST(GemmBf16, SwappedFormIsBitwiseTheDirectForm) {
  if (!cpu::kernels().bf16_gemm_runs_here())
    GTEST_SKIP() << "this CPU has no avx512_bf16 (or the variant no AVX-512)";
  on_each_path([] {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    struct Shape {
      int64_t M, N, K;
    };
    for (const Shape sh :
         {Shape{64, 65, 2}, Shape{77, 500, 768}, Shape{96, 1234, 1602}, Shape{256, 3072, 768}}) {
      const int64_t M = sh.M, N = sh.N, K = sh.K, lda = K + 1, ldbt = K + 3, ldb = N + 5,
                    ldc = N + 2;
      // The first call below takes the swapped form, the second the direct one.
      ASSERT_TRUE(cpu::bf16_gemm_swaps(false, true, M, N, K));
      ASSERT_FALSE(cpu::bf16_gemm_swaps(false, false, M, N, K));
      std::vector<uint16_t> A(M * lda), Bt(N * ldbt), B(K * ldb);
      for (auto& x : A) x = to_bf16(u(rng));
      for (auto& x : Bt) x = to_bf16(u(rng));
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) B[k * ldb + j] = Bt[j * ldbt + k];
      std::vector<float> bias(N);
      for (auto& x : bias) x = u(rng);
      const size_t floats = cpu::kernels().sgemm_bf16_scratch_floats();
      for (int threads : {1, 2}) {
        std::vector<float> ws(floats * threads + 16);
        float* base = ws.data();
        while (reinterpret_cast<uintptr_t>(base) % 64) ++base;
        const cpu::Scratch scratch{base, floats, floats, threads};
        for (int form = 0; form < 3; ++form) {  // f32, bf16 with a bias, f32 rounded to bf16
          std::vector<float> swapped(M * ldc, 5.f), direct(M * ldc, 5.f);
          std::vector<uint16_t> s16(M * ldc, 0xBEEF), d16(M * ldc, 0xBEEF);
          cpu::Bf16Result so, dout;
          if (form == 1) {
            so = {s16.data(), bias.data()};
            dout = {d16.data(), bias.data()};
          }
          so.round_c = dout.round_c = form == 2;
          ASSERT_TRUE(cpu::kernels().sgemm_bf16(false, true, M, N, K, A.data(), lda, Bt.data(),
                                                ldbt, swapped.data(), ldc, threads, scratch, so));
          ASSERT_TRUE(cpu::kernels().sgemm_bf16(false, false, M, N, K, A.data(), lda, B.data(), ldb,
                                                direct.data(), ldc, threads, scratch, dout));
          const std::string what = "M" + std::to_string(M) + " N" + std::to_string(N) + " K" +
                                   std::to_string(K) + ", form " + std::to_string(form) + ", " +
                                   std::to_string(threads) + " threads";
          if (form == 1) {
            ASSERT_EQ(s16, d16) << what;
          } else {
            ASSERT_EQ(swapped, direct) << what;
          }
        }
      }
    }
  });
}

// On the AMX path a final f32 result of 8 MiB or more with 64-byte aligned rows is stored around
// the caches (streaming stores), directly or transposed (the swapped form): bitwise what the
// plain stores give the same product into a C whose rows are not aligned, as f32 and as f32
// rounded to bf16, at 1 and 2 threads.
TEST(GemmBf16, ResultsStoredAroundTheCachesAreThePlainOnes) {
  if (!cpu::kernels().bf16_gemm_amx(-1)) GTEST_SKIP() << "no AMX tiles here: no streamed stores";
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  const size_t floats = cpu::kernels().sgemm_bf16_scratch_floats();
  struct Shape {
    int64_t M, N, K;
    bool tb;
  };
  // 2048 x 1100 direct; 1040 x 2100 as A B^T with N > M, computed as C^T = B A^T.
  for (const Shape sh : {Shape{2048, 1100, 64, false}, Shape{1040, 2100, 96, true}}) {
    const int64_t M = sh.M, N = sh.N, K = sh.K, lda = K, ldb = sh.tb ? K : N;
    std::vector<uint16_t> A(M * lda), B((sh.tb ? N : K) * ldb);
    for (auto& x : A) x = to_bf16(u(rng));
    for (auto& x : B) x = to_bf16(u(rng));
    for (int threads : {1, 2}) {
      std::vector<float> ws(floats * threads + 16);
      float* base = ws.data();
      while (reinterpret_cast<uintptr_t>(base) % 64) ++base;
      const cpu::Scratch scratch{base, floats, floats, threads};
      for (bool round : {false, true}) {
        const int64_t ld_aligned = (N + 15) / 16 * 16, ld_plain = N + 1;
        std::vector<float> streamed(M * ld_aligned + 16, 5.f), plain(M * ld_plain, 5.f);
        float* cs = streamed.data();
        while (reinterpret_cast<uintptr_t>(cs) % 64) ++cs;
        cpu::Bf16Result out;
        out.round_c = round;
        ASSERT_TRUE(cpu::kernels().sgemm_bf16(false, sh.tb, M, N, K, A.data(), lda, B.data(), ldb,
                                              cs, ld_aligned, threads, scratch, out));
        ASSERT_TRUE(cpu::kernels().sgemm_bf16(false, sh.tb, M, N, K, A.data(), lda, B.data(), ldb,
                                              plain.data(), ld_plain, threads, scratch, out));
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j)
            ASSERT_EQ(cs[i * ld_aligned + j], plain[i * ld_plain + j])
                << "M" << M << " N" << N << " tb" << sh.tb << " round " << round << ", " << threads
                << " threads, at (" << i << ", " << j << ")";
      }
    }
  }
}

// The bf16 Linear and Matmul kernels (VDPBF16PS here, widened f32 products elsewhere) against
// the f32 ops on the same bf16-valued inputs: within the bf16 rounding of the result (2^-8
// relative) plus f32 summation.
TEST(GemmBf16, KernelsAgreeWithF32) {
  namespace cs = cstorch;
  cs::manual_seed(3);
  const cs::Tensor x = cs::randn({70, 200}).to(cs::DType::bf16);
  const cs::Tensor w = cs::randn({90, 200}).to(cs::DType::bf16);
  const cs::Tensor b = cs::randn({90}).to(cs::DType::bf16);
  const cs::Tensor m = cs::randn({200, 50}).to(cs::DType::bf16);
  auto expect_close = [](const cs::Tensor& got, const cs::Tensor& want, const char* what) {
    const auto g = got.to(cs::DType::f32).to_vector<float>();
    const auto w = want.to_vector<float>();
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i)
      ASSERT_NEAR(g[i], w[i], std::fabs(w[i]) * std::ldexp(1.0, -8) + 1e-3) << what << " at " << i;
  };
  expect_close(cs::linear(x, w, b),
               cs::linear(x.to(cs::DType::f32), w.to(cs::DType::f32), b.to(cs::DType::f32)),
               "linear");
  expect_close(cs::matmul(x, m), cs::matmul(x.to(cs::DType::f32), m.to(cs::DType::f32)), "matmul");
  // Traced, the transposes become the product's flags (both operands read transposed).
  const cs::Tensor y = cs::randn({30, 70}).to(cs::DType::bf16);
  auto tt =
      cs::trace([](const cs::Tensor& a, const cs::Tensor& c) { return cs::matmul(a.t(), c.t()); });
  expect_close(tt(x, y), cs::matmul(x.to(cs::DType::f32).t(), y.to(cs::DType::f32).t()),
               "traced matmul of transposes");
}

// Where bf16 products take sgemm_bf16: not on Intel CPUs whose products are off the AMX tiles
// (VDPBF16PS at half the FMA's rate there: widened to f32), everywhere else it runs. The vendor
// as /proc/cpuinfo reports it.
TEST(GemmBf16, WidenedWhereItsProductsRunAtHalfRate) {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  bool intel = false;
  while (std::getline(info, line))
    if (line.rfind("vendor_id", 0) == 0) {
      intel = line.find("GenuineIntel") != std::string::npos;
      break;
    }
  const auto& k = cpu::kernels();
  if (std::getenv("CSTORCH_BF16_GEMM")) GTEST_SKIP() << "CSTORCH_BF16_GEMM sets the path";
  EXPECT_EQ(k.bf16_gemm_widened(-1), !k.bf16_gemm_runs_here() || (intel && !k.bf16_gemm_amx(-1)));
}

// Widened, a bf16 Linear and Matmul are bitwise the f32 ops on the widened inputs, rounded once;
// on sgemm_bf16 (where it runs), within the bf16 rounding of the same. Both paths on each CPU
// that has the bf16 GEMM, whatever its default.
TEST(GemmBf16, BothPathsOfABf16Product) {
  namespace cs = cstorch;
  const auto& k = cpu::kernels();
  const bool was = k.bf16_gemm_widened(-1);
  cs::manual_seed(5);
  const cs::Tensor x = cs::randn({70, 300}).to(cs::DType::bf16);
  const cs::Tensor w = cs::randn({90, 300}).to(cs::DType::bf16);
  const cs::Tensor b = cs::randn({90}).to(cs::DType::bf16);
  const cs::Tensor m = cs::randn({300, 50}).to(cs::DType::bf16);
  auto f32 = [](const cs::Tensor& t) { return t.to(cs::DType::f32); };
  const auto lin = cs::linear(f32(x), f32(w), f32(b)).to(cs::DType::bf16);
  const auto mm = cs::matmul(f32(x), f32(m)).to(cs::DType::bf16);
  for (int mode : {1, 0}) {
    if (mode == 0 && !k.bf16_gemm_runs_here()) continue;
    k.bf16_gemm_widened(mode);
    ASSERT_EQ(k.bf16_gemm_widened(-1), mode == 1);
    const auto got_lin = cs::linear(x, w, b), got_mm = cs::matmul(x, m);
    ASSERT_EQ(got_lin.dtype(), cs::DType::bf16);
    const auto gl = f32(got_lin).to_vector<float>(), wl = f32(lin).to_vector<float>();
    const auto gm = f32(got_mm).to_vector<float>(), wm = f32(mm).to_vector<float>();
    if (mode == 1) {
      EXPECT_EQ(gl, wl) << "widened linear";
      EXPECT_EQ(gm, wm) << "widened matmul";
    } else {
      for (size_t i = 0; i < gl.size(); ++i)
        ASSERT_NEAR(gl[i], wl[i], std::fabs(wl[i]) * std::ldexp(1.0, -7) + 1e-3) << "linear " << i;
      for (size_t i = 0; i < gm.size(); ++i)
        ASSERT_NEAR(gm[i], wm[i], std::fabs(wm[i]) * std::ldexp(1.0, -7) + 1e-3) << "matmul " << i;
    }
  }
  k.bf16_gemm_widened(was ? 1 : 0);
}

}  // namespace
