// The machine's arithmetic peak, measured (bench/run's roofline probe), and the GEMMs of a
// GPT-2 124M training step against it.
//
//   bench_peak --threads N            the fp32 FMA peak (and the bf16 dot-product peak where
//                                     the CPU has avx512_bf16, the AMX tile peak where it has
//                                     AMX-BF16) at N threads: a register-only
//                                     loop of independent multiply-adds, no memory traffic;
//                                     and the main-memory bandwidth (read, triad) at N threads
//   bench_peak --threads N --gemm     also each product shape of GPT-2 124M (B=4, T=64): the
//                                     own AVX-512 GEMM, OpenBLAS and (where the build found
//                                     it) oneDNN's dnnl_sgemm, GFLOP/s of each; and the
//                                     own GEMM on a small product whose operands stay in the
//                                     core's caches (gemm_own_cache_resident_gflops)
//   bench_peak --shape M N K ta tb    also one product of that shape (alone, or beside --gemm's)
//
// Prints one JSON line. The probe's instruction set is picked at run time (AVX-512, else
// AVX2 + FMA, else SSE2), whatever the build targets.
#include <immintrin.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/cpu/amx.h"
#include "backend/cpu/variant.h"
#include "cstorch/cstorch.h"
#include "cstorch/version.h"

extern "C" {
#include <cblas.h>
}
#if CSTORCH_BENCH_ONEDNN
#include <dnnl.h>
#endif

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Each loop keeps kAcc independent accumulators (more than the FMA latency times the FMA ports,
// so the units never wait) and returns their sum, so the work cannot be optimised away.
constexpr int kAcc = 12;

// The sum of every lane of the accumulators, so the loops' work cannot be optimised away.
// (Not _mm512_reduce_add_ps: GCC 12 reports its undefined start value as uninitialised.)
__attribute__((target("avx512f"))) float sum_lanes(const __m512 (&acc)[kAcc]) {
  __m512 s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = _mm512_add_ps(s, acc[i]);
  alignas(64) float out[16];
  _mm512_store_ps(out, s);
  float r = 0;
  for (float x : out) r += x;
  return r;
}

__attribute__((target("avx512f"))) float fma_avx512(int64_t iters) {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_set1_ps(0.001f * static_cast<float>(i));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  return sum_lanes(acc);
}

__attribute__((target("avx2,fma"))) float fma_avx2(int64_t iters) {
  __m256 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_set1_ps(0.001f * static_cast<float>(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  alignas(32) float out[8];
  __m256 s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = _mm256_add_ps(s, acc[i]);
  _mm256_store_ps(out, s);
  float r = 0;
  for (float x : out) r += x;
  return r;
}

float mul_add_sse(int64_t iters) {
  __m128 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm_set1_ps(0.001f * static_cast<float>(i));
  const __m128 a = _mm_set1_ps(0.999999f), b = _mm_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm_add_ps(_mm_mul_ps(acc[i], a), b);
  alignas(16) float out[4];
  __m128 s = acc[0];
  for (int i = 1; i < kAcc; ++i) s = _mm_add_ps(s, acc[i]);
  _mm_store_ps(out, s);
  return out[0] + out[1] + out[2] + out[3];
}

// VDPBF16PS: per 32-bit lane, two bf16 products added to an f32 accumulator (4 flops a lane).
__attribute__((target("avx512f,avx512bf16"))) float dot_bf16(int64_t iters) {
  __m512 acc[kAcc];
  for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_setzero_ps();
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t it = 0; it < iters; ++it)
#pragma GCC unroll 16
    for (int i = 0; i < kAcc; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  return sum_lanes(acc);
}

// TDPBF16PS: a 16 x 32 bf16 tile times a 32 x 16 one into a 16 x 16 f32 tile (16 x 16 x 32
// multiply-adds), four independent accumulator tiles from two source tiles each, as the AMX
// GEMM's 2 x 2 block. Each thread loads its own tile configuration; the caller has asked Linux for
// the tile state (amx_granted).
constexpr double kAmxFlopsPerIter = 4.0 * 16 * 16 * 32 * 2;
constexpr int64_t kAmxIterDivisor = 16;  // rate()'s loop count / this: each iteration is long
__attribute__((target("amx-tile,amx-bf16"))) float dot_amx(int64_t iters) {
  const cstorch::cpu::TileConfig config;
  _tile_loadconfig(&config);
  alignas(64) static const uint16_t ones[16 * 32] = {};  // zero bits: the values do not matter
  alignas(64) float out[16 * 16];
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_loadd(6, ones, 64);
  _tile_loadd(7, ones, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iters / kAmxIterDivisor; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return out[0];
}

// GFLOP/s of f(iters) on `threads` threads at once (each runs the whole loop): the best of 5.
template <class F>
double rate(int threads, double flops_per_iter, F f) {
  const int64_t iters = 20'000'000;
  double best = 0;
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t = Clock::now();
    float s = 0;
#pragma omp parallel num_threads(threads) reduction(+ : s)
    s += f(iters);
    const double sec = seconds_since(t);
    sink = sink + s;
    best = std::max(best, flops_per_iter * static_cast<double>(iters) * threads / sec / 1e9);
  }
  return best;
}

// Main-memory bandwidth in GB/s, the roofline's other axis: the best of 5 passes over arrays
// far larger than the caches, each thread streaming its own contiguous slice (first touched by
// that thread). "read": a sum over one array (4 bytes an element). "triad": a = b + s c, counted
// as STREAM counts it (12 bytes an element; the write's read for ownership is not counted).
struct Bandwidth {
  double read_gbs, triad_gbs;
};
Bandwidth memory_bandwidth(int threads) {
  const int64_t n = int64_t{48} << 20;  // 192 MiB an array
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n)),
      c(static_cast<size_t>(n));
  float* pa = a.data();
  float* pb = b.data();
  float* pc = c.data();
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    pa[i] = 0.0f;
    pb[i] = static_cast<float>(i & 255);
    pc[i] = 1.0f;
  }
  Bandwidth best{0, 0};
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t = Clock::now();
    float sum = 0;
#pragma omp parallel for simd num_threads(threads) schedule(static) reduction(+ : sum)
    for (int64_t i = 0; i < n; ++i) sum += pb[i];
    double sec = seconds_since(t);
    sink = sink + sum;
    best.read_gbs = std::max(best.read_gbs, 4.0 * static_cast<double>(n) / sec / 1e9);
    t = Clock::now();
#pragma omp parallel for simd num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + 0.5f * pc[i];
    sec = seconds_since(t);
    sink = sink + pa[rep];
    best.triad_gbs = std::max(best.triad_gbs, 12.0 * static_cast<double>(n) / sec / 1e9);
  }
  return best;
}

struct Shape {
  const char* what;
  int64_t M, N, K;
  bool ta, tb;
  int per_step = 1;  // times a GPT-2 124M step runs this product (0: not one of its products)
};

// GFLOP/s of C = op(A) op(B) through `gemm`: the best of 5 batches of back-to-back calls, each
// batch at least 20 ms (one call of a small product lasts ~100 us, where a single timing reads
// the machine's noise more than the kernel), after one warm-up call.
template <class G>
double gemm_rate(const Shape& s, G gemm) {
  std::vector<float> A(static_cast<size_t>(s.M * s.K)), B(static_cast<size_t>(s.K * s.N)),
      Cs(static_cast<size_t>(s.M * s.N) + 16);
  for (size_t i = 0; i < A.size(); ++i) A[i] = static_cast<float>(i % 17) * 0.01f;
  for (size_t i = 0; i < B.size(); ++i) B[i] = static_cast<float>(i % 13) * 0.01f;
  float* C = Cs.data();  // on a 64-byte line, as the library's own buffers are
  while (reinterpret_cast<uintptr_t>(C) % 64) ++C;
  auto t0 = Clock::now();
  gemm(s, A.data(), B.data(), C);
  const int calls = static_cast<int>(std::clamp(0.02 / seconds_since(t0), 1.0, 1000.0));
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    auto t = Clock::now();
    for (int c = 0; c < calls; ++c) gemm(s, A.data(), B.data(), C);
    best = std::max(best, 2.0 * s.M * s.N * s.K * calls / seconds_since(t) / 1e9);
  }
  return best;
}

// GFLOP/s of the own GEMM with its operands in the core's caches: every thread runs back-to-back
// products of 24 x 32 x 384 (two micro-kernel tiles over one K block, B read in place; 84 KiB
// of operands, in L1 and L2) on its own buffers, inside one parallel region, so each product
// runs on its calling thread. The best of 5 batches of 4000 products
// (about 10-20 ms each). What the micro-kernel reaches when
// memory is not in the way: the ceiling for the GPT-2 products beside it.
double cache_resident_gemm_rate(int threads, const cstorch::cpu::KernelVariant& v) {
  constexpr int64_t M = 24, N = 32, K = 384;
  constexpr int64_t kCalls = 4000;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    double sec = 0;
#pragma omp parallel num_threads(threads) reduction(max : sec)
    {
      // One buffer, each operand on a 64-byte line as the library's own buffers are.
      std::vector<float> buf(M * K + K * N + M * N + 16, 0.01f);
      float* A = buf.data();
      while (reinterpret_cast<uintptr_t>(A) % 64) ++A;
      float *B = A + M * K, *C = B + K * N;
      const cstorch::cpu::Scratch none{nullptr, 0, 0, 1};
      auto t = Clock::now();
      for (int64_t c = 0; c < kCalls; ++c)
        v.sgemm(false, false, M, N, K, 1.f, A, K, B, N, 0.f, C, N, 1, none, {});
      sec = seconds_since(t);
    }
    best = std::max(best, 2.0 * M * N * K * kCalls * threads / sec / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_peak: the machine's fp32 / bf16 peak and GPT-2 124M's products"};
  int threads = 1;
  bool gemm = false;
  app.add_option("--threads", threads);
  app.add_flag("--gemm", gemm, "also time GPT-2 124M's product shapes");
  std::vector<int64_t> one;
  app.add_option("--shape", one, "also time one product: M N K ta tb (ta, tb: 0 or 1)")
      ->expected(5);
  CLI11_PARSE(app, argc, argv);
  cstorch::set_num_threads(threads);

  nlohmann::json j{{"threads", threads}, {"cpu_kernels", cstorch::cpu_kernels()}};
  if (__builtin_cpu_supports("avx512f")) {
    j["fp32_isa"] = "avx512";
    j["fp32_peak_gflops"] = rate(threads, kAcc * 16 * 2, fma_avx512);
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    j["fp32_isa"] = "avx2";
    j["fp32_peak_gflops"] = rate(threads, kAcc * 8 * 2, fma_avx2);
  } else {
    j["fp32_isa"] = "sse2";
    j["fp32_peak_gflops"] = rate(threads, kAcc * 4 * 2, mul_add_sse);
  }
  if (__builtin_cpu_supports("avx512bf16")) {
    j["bf16_peak_gflops"] = rate(threads, kAcc * 16 * 4, dot_bf16);
  } else {
    j["bf16_peak_gflops"] = nullptr;
  }
  // The tile unit's peak where the CPU has one (the bf16 GEMM runs there: gemm.h).
  j["amx_bf16_peak_gflops"] = nullptr;
  if (cstorch::cpu::amx_granted())
    j["amx_bf16_peak_gflops"] = rate(threads, kAmxFlopsPerIter / kAmxIterDivisor, dot_amx);
  j["bf16_gemm_on_amx"] = cstorch::cpu::kernels().bf16_gemm_amx(-1);
  // Where a step's bf16 products run: the tiles, VDPBF16PS, or widened to the f32 GEMM (gemm.h).
  j["bf16_products"] = cstorch::cpu::kernels().bf16_gemm_widened(-1) ? "widened to f32"
                       : cstorch::cpu::kernels().bf16_gemm_amx(-1)   ? "amx"
                                                                     : "vdpbf16ps";

  const Bandwidth bw = memory_bandwidth(threads);
  j["memory_read_gbs"] = bw.read_gbs;
  j["memory_triad_gbs"] = bw.triad_gbs;

  if (gemm || !one.empty()) {
    // GPT-2 124M, B=4, T=64: 256 token rows, width 768, MLP 3072, vocab 50304. Forward
    // x @ W^T (Linear), the input gradient dy @ W, the weight gradient dy^T @ x.
    // The total weighs each shape by the FLOPs it has in one step: 12 layers of qkv, proj, fc and
    // fc2 products, one tied vocabulary head.
    const int64_t T = 256, E = 768;
    const int L = 12;
    std::vector<Shape> shapes;
    if (gemm) {
      for (auto [name, N] : {std::pair<const char*, int64_t>{"qkv", 3 * E},
                             {"proj", E},
                             {"fc", 4 * E},
                             {"head", 50304}}) {
        const int64_t K = E;
        const int n = N == 50304 ? 1 : L;
        shapes.push_back({name, T, N, K, false, true, n});   // forward
        shapes.push_back({name, T, K, N, false, false, n});  // input gradient
        shapes.push_back({name, N, K, T, true, false, n});   // weight gradient
      }
      shapes.push_back({"fc2", T, E, 4 * E, false, true, L});
      shapes.push_back({"fc2", T, 4 * E, E, false, false, L});
      shapes.push_back({"fc2", E, 4 * E, T, true, false, L});
    }
    if (!one.empty())
      shapes.push_back({"shape", one[0], one[1], one[2], one[3] != 0, one[4] != 0, 0});
    if (gemm) {
      // Square products, for comparison with published SGEMM figures (not in the GPT-2 total).
      shapes.push_back({"square", 1024, 1024, 1024, false, false, 0});
      shapes.push_back({"square", 2048, 2048, 2048, false, false, 0});
    }
    const cstorch::cpu::KernelVariant& v = cstorch::cpu::kernels();
    auto blas = [&](const Shape& s, const float* A, const float* B, float* C) {
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                  static_cast<int>(s.M), static_cast<int>(s.N), static_cast<int>(s.K), 1.f, A,
                  static_cast<int>(s.ta ? s.M : s.K), B, static_cast<int>(s.tb ? s.K : s.N), 0.f, C,
                  static_cast<int>(s.N));
    };
#if CSTORCH_BENCH_ONEDNN
    // oneDNN (the library PyTorch's CPU build takes its kernels from), row-major like the others;
    // it runs on the OpenMP team set by omp_set_num_threads.
    auto onednn = [&](const Shape& s, const float* A, const float* B, float* C) {
      const dnnl_status_t st = dnnl_sgemm(s.ta ? 'T' : 'N', s.tb ? 'T' : 'N', s.M, s.N, s.K, 1.f, A,
                                          s.ta ? s.M : s.K, B, s.tb ? s.K : s.N, 0.f, C, s.N);
      if (st != dnnl_success) {
        std::fprintf(stderr, "bench_peak: dnnl_sgemm failed (status %d)\n", static_cast<int>(st));
        std::exit(1);
      }
    };
    double onednn_sec = 0;
#endif
    std::vector<float> scratch;
    auto own = [&](const Shape& s, const float* A, const float* B, float* C) {
      const size_t per = v.sgemm_scratch_floats(s.N, s.K, s.ta, s.tb, false);
      const size_t stride = (per + 15) / 16 * 16;
      if (scratch.size() < stride * threads + 16) scratch.resize(stride * threads + 16);
      const cstorch::cpu::Scratch ws{scratch.data(), stride, per, threads};
      v.sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A, s.ta ? s.M : s.K, B, s.tb ? s.K : s.N, 0.f, C, s.N,
              threads, ws, {});
    };
    // The short-side kernels of the OpenBLAS path (gemm.h: sgemm_small), where they take the
    // product: small_ok says whether the last call did.
    bool small_ok = false;
    auto small = [&](const Shape& s, const float* A, const float* B, float* C) {
      small_ok = v.sgemm_small(s.ta, s.tb, s.M, s.N, s.K, A, s.ta ? s.M : s.K, B, s.tb ? s.K : s.N,
                               0.f, C, s.N, threads);
    };
    std::vector<uint16_t> a16, b16;
    auto bf16 = [&](const Shape& s, const float* A, const float* B, float* C) {
      // bf16 operands (truncated bits of the f32 values: the timing does not depend on them).
      const size_t na = static_cast<size_t>(s.M * s.K), nb = static_cast<size_t>(s.K * s.N);
      if (a16.size() != na) {
        a16.resize(na);
        for (size_t i = 0; i < na; ++i)
          a16[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(A[i]) >> 16);
      }
      if (b16.size() != nb) {
        b16.resize(nb);
        for (size_t i = 0; i < nb; ++i)
          b16[i] = static_cast<uint16_t>(std::bit_cast<uint32_t>(B[i]) >> 16);
      }
      const size_t per = v.sgemm_bf16_scratch_floats();
      const size_t stride = (per + 15) / 16 * 16;
      if (scratch.size() < stride * threads + 16) scratch.resize(stride * threads + 16);
      float* base = scratch.data();
      while (reinterpret_cast<uintptr_t>(base) % 64) ++base;
      const cstorch::cpu::Scratch ws{base, stride, per, threads};
      v.sgemm_bf16(s.ta, s.tb, s.M, s.N, s.K, a16.data(), s.ta ? s.M : s.K, b16.data(),
                   s.tb ? s.K : s.N, C, s.N, threads, ws, {});
    };
    double bf16_sec = 0;
    nlohmann::json rows = nlohmann::json::array();
    double total_flops = 0, own_sec = 0, blas_sec = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& s = shapes[i];
      const bool in_model = s.per_step > 0;
      const double f = 2.0 * s.M * s.N * s.K * s.per_step;
      const double b = gemm_rate(s, blas);
      nlohmann::json r{
          {"what", s.what},      {"M", s.M}, {"N", s.N}, {"K", s.K}, {"ta", s.ta}, {"tb", s.tb},
          {"openblas_gflops", b}};
      r["in_gpt2_total"] = in_model;
      r["per_step"] = s.per_step;
      total_flops += f;
      blas_sec += f / (b * 1e9);
#if CSTORCH_BENCH_ONEDNN
      const double d = gemm_rate(s, onednn);
      r["onednn_gflops"] = d;
      onednn_sec += f / (d * 1e9);
#endif
      if (v.own_gemm_applies(64, 64, 64, false)) {  // the variant has an own GEMM
        const double o = gemm_rate(s, own);
        r["own_gflops"] = o;
        own_sec += f / (o * 1e9);
      }
      const double sm = gemm_rate(s, small);  // returns at once where it does not apply
      if (small_ok) r["small_gflops"] = sm;   // not in the GPT-2 total: its products are long
      if (v.bf16_gemm_runs_here()) {
        a16.clear();
        b16.clear();
        const double h = gemm_rate(s, bf16);
        r["own_bf16_gflops"] = h;
        bf16_sec += f / (h * 1e9);
      }
      rows.push_back(r);
    }
    j["gemms"] = rows;
    if (v.own_gemm_applies(64, 64, 64, false))
      j["gemm_own_cache_resident_gflops"] = cache_resident_gemm_rate(threads, v);
    if (total_flops > 0) {  // the GPT-2 total (--gemm): FLOP-weighted over its shapes
      if (bf16_sec > 0) j["gemm_own_bf16_gflops"] = total_flops / bf16_sec / 1e9;
      j["gemm_openblas_gflops"] = total_flops / blas_sec / 1e9;
#if CSTORCH_BENCH_ONEDNN
      j["gemm_onednn_gflops"] = total_flops / onednn_sec / 1e9;
#endif
      if (own_sec > 0) j["gemm_own_gflops"] = total_flops / own_sec / 1e9;
    }
  }
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
