// The variants of the CPU kernels (src/backend/cpu/variant.h): which are built, which one runs,
// and that every variant this CPU can run computes what the running one does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/device.h"
#include "backend/cpu/variant.h"
#include "backend/cpu/vec_math.h"
#include "cstorch/version.h"
#include "ir/node.h"
#include "unit/device/avx2_math_ref.h"
#include "unit/ir_nodes.h"

namespace {

namespace ir = cstorch::ir;
namespace cpu = cstorch::cpu;

TEST(CpuVariants, TheBestVariantThisCpuRunsIsChosen) {
  const auto all = cpu::built_variants();
  ASSERT_FALSE(all.empty());
  const cpu::KernelVariant& running = cpu::kernels();
  EXPECT_EQ(std::string(cstorch::cpu_kernels()), running.name);
  EXPECT_TRUE(cpu::runs_here(running));
  // The last built variant runs here (in a default build it is the baseline, which every CPU
  // of the architecture runs).
  EXPECT_TRUE(cpu::runs_here(*all.back())) << all.back()->name;
  const char* env = std::getenv("CSTORCH_CPU_KERNELS");
  if (env && *env) {
    const std::string want(env);
    EXPECT_EQ(want == "generic" ? std::string(all.back()->name) : want, running.name);
  } else {
    for (const cpu::KernelVariant* v : all) {
      if (!cpu::runs_here(*v)) continue;
      EXPECT_EQ(v, &running) << "first runnable: " << v->name << ", running: " << running.name;
      break;
    }
  }
  std::vector<std::string> names;
  for (const cpu::KernelVariant* v : all) names.push_back(v->name);
  if (names.size() == 1 && (names[0] == "native" || names[0] == "generic")) {
    // A native build (CSTORCH_NATIVE=ON) or a portable build off x86-64: one variant.
  } else if (std::string(CSTORCH_TEST_CPU_VARIANT_SUBSET).empty()) {
    EXPECT_EQ(names, (std::vector<std::string>{"avx512", "avx2", "x86-64"}));
  } else {
    // A tree that only this machine runs (CSTORCH_CPU_VARIANT_SUBSET): what it chose, best first.
    std::vector<std::string> in_order;
    for (const char* n : {"avx512", "avx2", "x86-64"})
      if (std::find(names.begin(), names.end(), n) != names.end()) in_order.push_back(n);
    EXPECT_EQ(names, in_order);
  }
  // The backend object hands out the running variant's kernels.
  EXPECT_EQ(cpu::backend().kernel(ir::OpCode::Linear),
            running.kernels[static_cast<int>(ir::OpCode::Linear)]);
}

using cstorch::testing::leaf;
using cstorch::testing::op;

// Runs node n with variant v's kernel on inputs `in`, with the workspace v plans for it.
void run_kernel(const cpu::KernelVariant& v, const ir::Node& n, const void* const* in, void* out) {
  const ir::Kernel k = v.kernels[static_cast<int>(n.op)];
  ASSERT_NE(k, nullptr) << v.name << " has no kernel for " << n.name();
  const size_t bytes = v.workspace_bytes(n, cpu::workspace_threads());
  std::vector<float> ws(bytes / sizeof(float) + 16);
  ir::KernelContext ctx;
  auto p = reinterpret_cast<uintptr_t>(ws.data());
  ctx.workspace = bytes ? reinterpret_cast<void*>((p + 63) & ~uintptr_t{63}) : nullptr;
  ctx.workspace_bytes = bytes;
  k(ctx, n, in, out);
}

// run_kernel on f32 inputs, returning the f32 output.
std::vector<float> run(const cpu::KernelVariant& v, const ir::Node& n,
                       const std::vector<const std::vector<float>*>& inputs) {
  std::vector<float> out(static_cast<size_t>(n.numel()));
  std::vector<const void*> in;
  for (const auto* x : inputs) in.push_back(x->data());
  run_kernel(v, n, in.data(), out.data());
  return out;
}

// A bf16 product stored as f32 (MatmulAttrs::f32_out, the compiler's fold of a bf16 product's
// cast): in every variant this CPU runs, bitwise the variant's bf16 product widened to f32. The
// AVX-512 variant rounds in the bf16 GEMM's store; the others widen, multiply in f32 and round.
TEST(CpuVariants, Bf16ProductsStoredAsF32AreTheBf16ProductsWidened) {
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0.f, 1.f);
  auto bf16_vec = [&](int64_t n) {
    std::vector<uint16_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = cstorch::bf16_t(d(rng)).bits;
    return v;
  };
  auto bf16_leaf = [](cstorch::Shape s) {
    auto n = leaf(s);
    n->dtype = cstorch::DType::bf16;
    return n;
  };
  struct Case {
    bool ta, tb;
    int64_t M, N, K;
  };
  // K over one 256-long block (partial sums carried); A^T B (a weight gradient's layout); A B^T
  // (a head's logits) computed as its transpose (N > M >= 64, even K) and not (odd K, few rows).
  const Case cases[] = {{true, false, 37, 45, 300},
                        {false, true, 70, 130, 300},
                        {false, true, 70, 130, 301},
                        {false, true, 37, 45, 300}};
  for (const Case& c : cases) {
    const auto a = bf16_vec(c.K * c.M), b = bf16_vec(c.K * c.N);
    const cstorch::Shape sa = c.ta ? cstorch::Shape{c.K, c.M} : cstorch::Shape{c.M, c.K};
    const cstorch::Shape sb = c.tb ? cstorch::Shape{c.N, c.K} : cstorch::Shape{c.K, c.N};
    auto product = [&](bool f32_out) {
      return op(ir::OpCode::Matmul,
                ir::MatmulAttrs{.trans_a = c.ta, .trans_b = c.tb, .f32_out = f32_out},
                {bf16_leaf(sa), bf16_leaf(sb)});
    };
    const ir::NodePtr rounded = product(false), stored = product(true);
    ASSERT_EQ(rounded->dtype, cstorch::DType::bf16);
    ASSERT_EQ(stored->dtype, cstorch::DType::f32);
    const void* in[2] = {a.data(), b.data()};
    int variants = 0;
    for (const cpu::KernelVariant* v : cpu::built_variants()) {
      if (!cpu::runs_here(*v)) continue;
      std::vector<uint16_t> r(static_cast<size_t>(c.M * c.N));
      std::vector<uint32_t> f(static_cast<size_t>(c.M * c.N));
      run_kernel(*v, *rounded, in, r.data());
      run_kernel(*v, *stored, in, f.data());
      for (size_t i = 0; i < r.size(); ++i)
        ASSERT_EQ(f[i], static_cast<uint32_t>(r[i]) << 16)
            << v->name << " element " << i << " of " << c.M << " x " << c.N << " x " << c.K
            << (c.tb ? " (B^T)" : " (A^T)");
      ++variants;
    }
    EXPECT_GE(variants, 1);
  }
}

// The Fused kernel's straight-line loops (fused.cpp: AdamW's first and second moments, its
// parameter update, a copy stored as bf16) against its interpreter, in every variant this CPU
// runs: the same program with one more instruction (a trailing copy, which changes no value)
// is interpreted. Bitwise, on 70001 elements (ragged last block, several chunks and threads)
// holding normal values and special ones (NaN, infinities, signed zeros, denormals, huge and
// negative values: sqrt of a negative, 0 / 0, inf - inf); scalars as one-element registers.
TEST(CpuVariants, FusedStraightLinesAreBitwiseTheInterpreter) {
  const int64_t n = 70001;
  std::mt19937 rng(11);
  std::normal_distribution<float> d(0.f, 1.f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            0.0f,
                            -0.0f,
                            1e-40f,
                            -3e-39f,
                            3e38f,
                            -1.0f};
  auto vec = [&](int64_t k) {
    std::vector<float> v(static_cast<size_t>(k));
    for (auto& x : v) x = d(rng) * std::exp2(static_cast<float>(static_cast<int>(d(rng) * 8)));
    for (size_t i = 0; i + 97 < v.size(); i += 97) v[i + rng() % 97] = specials[rng() % 9];
    return v;
  };
  struct Program {
    const char* line;
    std::vector<bool> scalar;                 // per input
    std::vector<std::vector<uint16_t>> code;  // op, then args
    bool bf16 = false;
  };
  const auto Mul = static_cast<uint16_t>(ir::OpCode::Mul);
  const auto Add = static_cast<uint16_t>(ir::OpCode::Add);
  const auto Div = static_cast<uint16_t>(ir::OpCode::Div);
  const auto Sqrt = static_cast<uint16_t>(ir::OpCode::Sqrt);
  const auto Addcmul = static_cast<uint16_t>(ir::OpCode::Addcmul);
  const auto Copy = static_cast<uint16_t>(ir::OpCode::Copy);
  // AdamW's programs as the optimizer emits them (state, gradient and scalars), and the same
  // shapes with other argument positions.
  const std::vector<Program> programs = {
      {"moment1", {false, true, false, true}, {{Mul, 0, 1}, {Addcmul, 4, 2, 3}}},
      {"moment1", {false, false, false, false}, {{Mul, 2, 0}, {Addcmul, 4, 1, 3}}},
      {"moment2", {false, true, false, true}, {{Mul, 0, 1}, {Mul, 2, 3}, {Addcmul, 5, 0, 4}}},
      {"adam_param",
       {false, true, false, true, true, true, false},
       {{Mul, 0, 1}, {Sqrt, 2}, {Div, 8, 3}, {Add, 9, 4}, {Div, 5, 10}, {Addcmul, 7, 11, 6}}},
      {"adam_param",
       {false, false, false, false, false, false, false},
       {{Mul, 6, 1}, {Sqrt, 2}, {Div, 8, 0}, {Add, 9, 4}, {Div, 5, 10}, {Addcmul, 7, 11, 3}}},
      {"copy_to_bf16", {false}, {{Copy, 0}}, true},
  };
  int compared = 0;
  for (const Program& pr : programs) {
    std::vector<ir::NodePtr> in;
    std::vector<std::vector<float>> data;
    for (bool sc : pr.scalar) {
      in.push_back(leaf(sc ? cstorch::Shape{} : cstorch::Shape{n}));
      data.push_back(vec(sc ? 1 : n));
    }
    auto fused = [&](bool plus_copy) {
      ir::FusedAttrs a;
      a.shape = {n};
      a.out = pr.bf16 ? cstorch::DType::bf16 : cstorch::DType::f32;
      for (const auto& c : pr.code) {
        ir::FusedInstr ins;
        ins.op = c[0];
        ins.nargs = static_cast<uint8_t>(c.size() - 1);
        for (size_t k = 1; k < c.size(); ++k) ins.args[k - 1] = c[k];
        a.code.push_back(ins);
      }
      if (plus_copy) {
        ir::FusedInstr ins;
        ins.op = Copy;
        ins.nargs = 1;
        ins.args[0] = static_cast<uint16_t>(in.size() + a.code.size() - 1);
        a.code.push_back(ins);
      }
      auto f = op(ir::OpCode::Fused, a, in);
      f->device = cstorch::Device{};
      return f;
    };
    const ir::NodePtr line = fused(false), interpreted = fused(true);
    std::vector<const void*> ptrs;
    for (const auto& v : data) ptrs.push_back(v.data());
    const size_t bytes = static_cast<size_t>(n) * (pr.bf16 ? 2 : 4);
    for (const cpu::KernelVariant* v : cpu::built_variants()) {
      if (!cpu::runs_here(*v)) continue;
      const char* name = v->fused_line(*line);
      // The AVX-512 variant runs every line; the others only the bf16 copy.
      const bool has_line = std::string(v->name) == "avx512" || pr.bf16;
      EXPECT_STREQ(name, has_line ? pr.line : nullptr) << v->name;
      EXPECT_EQ(v->fused_line(*interpreted), nullptr) << v->name << " " << pr.line;
      std::vector<char> a(bytes), b(bytes);
      run_kernel(*v, *line, ptrs.data(), a.data());
      run_kernel(*v, *interpreted, ptrs.data(), b.data());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), bytes), 0) << v->name << " " << pr.line;
      if (name) ++compared;
    }
  }
  EXPECT_GE(compared, 1);
}

// The AVX-512 and AVX2 variants where this CPU runs both (either null where it does not): the
// vector code of the one against the scalar loops of the other.
std::pair<const cpu::KernelVariant*, const cpu::KernelVariant*> avx512_and_avx2() {
  const cpu::KernelVariant *avx512 = nullptr, *avx2 = nullptr;
  for (const cpu::KernelVariant* v : cpu::built_variants()) {
    if (!cpu::runs_here(*v)) continue;
    if (std::string(v->name) == "avx512") avx512 = v;
    if (std::string(v->name) == "avx2") avx2 = v;
  }
  return {avx512, avx2};
}

// The GELU tests' inputs: 2^20 + 9 values x spread over every float bit pattern (all
// exponents, both signs, NaNs, infinities, denormals; a ragged last vector; 0, -0 and a quiet NaN
// first), and gradients dy of three magnitudes.
std::pair<std::vector<float>, std::vector<float>> gelu_inputs() {
  const size_t n = (size_t{1} << 20) + 9;
  std::vector<float> x(n), dy(n);
  for (size_t i = 0; i < n; ++i) {
    const auto u = static_cast<uint32_t>(static_cast<uint64_t>(i) * 4093u + 17u);
    std::memcpy(&x[i], &u, 4);
    dy[i] = (i % 3 == 0 ? 0.7f : i % 3 == 1 ? 1.0f : -3.25e-3f);
  }
  x[0] = 0.0f;
  x[1] = -0.0f;
  x[2] = std::numeric_limits<float>::quiet_NaN();
  return {x, dy};
}

// The tanh-form gelu and its gradient (the Gelu and GeluGrad kernels, f32 and bf16, and a Fused
// program's gelu instructions): the AVX-512 variant's vector code (elementwise_math.h) bitwise
// the AVX2 variant's scalar loops, which GCC compiles with the same fused multiply-adds. On
// 2^20 + 9 inputs spread over every float bit pattern (all exponents, both signs, NaNs,
// infinities, denormals; a ragged last vector), the gradient at dy of several magnitudes.
TEST(CpuVariants, GeluIsBitwiseTheSameInEveryVariant) {
  const auto [avx512, avx2] = avx512_and_avx2();
  if (!avx512 || !avx2)
    GTEST_SKIP() << "the vector gelu is in the AVX-512 variant, which this CPU (or build) lacks";
  const auto [x, dy] = gelu_inputs();
  const auto n = static_cast<int64_t>(x.size());
  const ir::GeluAttrs tanh_form{.tanh_approx = true};
  const auto gelu = op(ir::OpCode::Gelu, tanh_form, {leaf({n})});
  const auto grad = op(ir::OpCode::GeluGrad, tanh_form, {leaf({n}), leaf({n})});
  auto same = [&](const ir::Node& node, const std::vector<const std::vector<float>*>& in) {
    const auto a = run(*avx512, node, in), b = run(*avx2, node, in);
    for (size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(&a[i], &b[i], 4) != 0) {
        ADD_FAILURE() << node.name() << " at x = " << x[i] << " (element " << i << "): avx512 "
                      << a[i] << ", avx2 " << b[i];
        return;
      }
  };
  same(*gelu, {&x});
  same(*grad, {&dy, &x});
  // A Fused program of the two (the fused kernel's gelu instructions): gelu_grad(dy, gelu(x)).
  ir::FusedAttrs fa;
  fa.shape = {n};
  fa.out = cstorch::DType::f32;
  ir::FusedInstr g1;
  g1.op = static_cast<uint16_t>(ir::OpCode::Gelu);
  g1.nargs = 1;
  g1.flag = true;
  g1.args[0] = 1;
  ir::FusedInstr g2;
  g2.op = static_cast<uint16_t>(ir::OpCode::GeluGrad);
  g2.nargs = 2;
  g2.flag = true;
  g2.args[0] = 0;
  g2.args[1] = 2;
  fa.code = {g1, g2};
  auto fused = op(ir::OpCode::Fused, fa, {leaf({n}), leaf({n})});
  fused->device = cstorch::Device{};
  same(*fused, {&dy, &x});
  // bf16 (the chunked path through f32): x and dy rounded to bf16.
  auto bf16_leaf = [&](cstorch::Shape s) {
    auto l = leaf(std::move(s));
    l->dtype = cstorch::DType::bf16;
    return l;
  };
  std::vector<uint16_t> xb(static_cast<size_t>(n)), db(static_cast<size_t>(n));
  for (size_t i = 0; i < xb.size(); ++i) {
    xb[i] = cstorch::bf16_t(x[i]).bits;
    db[i] = cstorch::bf16_t(dy[i]).bits;
  }
  const auto gelu16 = op(ir::OpCode::Gelu, tanh_form, {bf16_leaf({n})});
  const auto grad16 = op(ir::OpCode::GeluGrad, tanh_form, {bf16_leaf({n}), bf16_leaf({n})});
  ASSERT_EQ(gelu16->dtype, cstorch::DType::bf16);
  for (const ir::NodePtr& node : {gelu16, grad16}) {
    const void* in1[1] = {xb.data()};
    const void* in2[2] = {db.data(), xb.data()};
    std::vector<uint16_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    run_kernel(*avx512, *node, node == gelu16 ? in1 : in2, a.data());
    run_kernel(*avx2, *node, node == gelu16 ? in1 : in2, b.data());
    EXPECT_EQ(a, b) << node->name() << " (bf16)";
  }
}

// The rows' exps of log_softmax's gradient (and of cross_entropy_grad and the softmax rows, which
// take them the same way): the AVX-512 variant's vector exp (vexp_n) bitwise the AVX2 variant's
// loop of the scalar vexp, on 2^20 - 1 values spread over every float bit pattern (NaNs,
// infinities, denormals; rows of 1023, a masked tail after two 512-element chunks). The gradient
// is all ones, so each row's sum is exact whatever the order of its additions.
TEST(CpuVariants, VectorExpIsBitwiseTheScalarOneInEveryVariant) {
  const auto [avx512, avx2] = avx512_and_avx2();
  if (!avx512 || !avx2)
    GTEST_SKIP() << "the vector exp is in the AVX-512 variant, which this CPU (or build) lacks";
  const int64_t R = 1025, C = 1023, n = R * C;
  std::vector<float> y(static_cast<size_t>(n)), g(static_cast<size_t>(n), 1.0f);
  for (int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<uint32_t>(static_cast<uint64_t>(i) * 4093u + 17u);
    std::memcpy(&y[static_cast<size_t>(i)], &u, 4);
  }
  y[0] = 0.0f;
  y[1] = -0.0f;
  y[2] = std::numeric_limits<float>::quiet_NaN();
  y[3] = std::numeric_limits<float>::infinity();
  y[4] = -std::numeric_limits<float>::infinity();
  const auto grad = op(ir::OpCode::LogSoftmaxGrad, ir::DimAttrs{1}, {leaf({R, C}), leaf({R, C})});
  const auto a = run(*avx512, *grad, {&g, &y}), b = run(*avx2, *grad, {&g, &y});
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0)
        << "at y = " << y[i] << " (element " << i << "): avx512 " << a[i] << ", avx2 " << b[i];
}

// The AVX2 variant's vector exp, gelu and gelu gradient (written out on 8 lanes) bitwise the
// scalar forms as GCC compiles them with that variant's flags (both compiled in
// avx2_math_ref.cpp): on 2^20 + 9 inputs spread over every float bit pattern (all exponents,
// both signs, NaNs, infinities, denormals; a ragged last vector), the gradient at dy of three
// magnitudes, the exp with and without a shift. On CPUs with AVX-512 too, the two tests above
// also compare the AVX2 variant's kernels with the AVX-512 variant's.
TEST(CpuVariants, Avx2VectorMathIsBitwiseTheScalarForms) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
    GTEST_SKIP() << "this CPU has no AVX2 with FMA, which the AVX2 variant's vector math needs";
  ASSERT_TRUE(avx2_ref::vector_code());
  const auto [x, dy] = gelu_inputs();
  const auto n = static_cast<int64_t>(x.size());
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  auto same = [&](const char* what) {
    for (size_t i = 0; i < a.size(); ++i)
      if (std::memcmp(&a[i], &b[i], 4) != 0) {
        ADD_FAILURE() << what << " at x = " << x[i] << " (element " << i << "): vector " << a[i]
                      << ", scalar " << b[i];
        return;
      }
  };
  avx2_ref::vector_gelu(x.data(), a.data(), n);
  avx2_ref::scalar_gelu(x.data(), b.data(), n);
  same("gelu");
  avx2_ref::vector_gelu_grad(dy.data(), x.data(), a.data(), n);
  avx2_ref::scalar_gelu_grad(dy.data(), x.data(), b.data(), n);
  same("gelu_grad");
  for (float shift : {0.0f, 3.5f}) {
    avx2_ref::vector_exp(x.data(), a.data(), n, shift);
    avx2_ref::scalar_exp(x.data(), b.data(), n, shift);
    same(shift == 0.0f ? "exp" : "exp(x - 3.5)");
  }
  // Every tail length of a short array (masked loads and stores).
  for (int64_t len = 1; len <= 17; ++len) {
    std::fill(a.begin(), a.begin() + 24, -1.0f);
    std::fill(b.begin(), b.begin() + 24, -1.0f);
    avx2_ref::vector_gelu(x.data() + 100, a.data(), len);
    avx2_ref::scalar_gelu(x.data() + 100, b.data(), len);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), 24 * sizeof(float)), 0) << "gelu of " << len;
  }
#else
  GTEST_SKIP() << "not an x86-64 build: no AVX2 variant";
#endif
}

// The scalar exp against std::exp around the ends of the float range: exactly 0 below it (where
// the polynomial runs on 0 rather than on the lowest argument, to keep its product normal), inf
// above, NaN kept, and within 2e-7 relative (the polynomial's error plus rounding) inside,
// including arguments whose results are the smallest normal floats.
TEST(CpuVariants, ScalarExpIsExactAtTheEndsOfTheRange) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {-inf, -1e30f, -100.0f, -87.34f}) EXPECT_EQ(cstorch::cpu::vexp(x), 0.0f) << x;
  for (float x : {89.0f, 1e30f, inf}) EXPECT_EQ(cstorch::cpu::vexp(x), inf) << x;
  EXPECT_TRUE(std::isnan(cstorch::cpu::vexp(std::numeric_limits<float>::quiet_NaN())));
  for (float x : {-87.33f, -87.3f, -87.0f, -80.0f, -10.0f, -1.0f, 0.0f, 1.0f, 10.0f, 88.0f}) {
    const double want = std::exp(static_cast<double>(x));
    EXPECT_NEAR(cstorch::cpu::vexp(x), want, 2e-7 * want) << x;
    EXPECT_GE(std::fabs(cstorch::cpu::vexp(x)), std::numeric_limits<float>::min()) << x;
  }
}

// Every variant this CPU runs against the running one, on kernels whose code differs between
// instruction sets: the own AVX-512 GEMM against OpenBLAS (products of K = 784 and 96), the
// AVX-512 short-row softmax against the generic rows, and vectorised elementwise maths and
// reductions. Elementwise results agree to 2e-6 relative (the variants round the same formulas,
// with and without fused multiply-adds: a few ulps); sums and products to 1e-5 of the sum of
// the absolute terms (their summation orders differ: blocked panels against OpenBLAS's).
TEST(CpuVariants, EveryVariantThisCpuRunsAgreesWithTheRunningOne) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 1.f);
  auto vec = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng);
    return v;
  };
  auto x784 = vec(128 * 784), w784 = vec(256 * 784), b256 = vec(256);
  auto a96 = vec(64 * 96), b96 = vec(96 * 80);
  auto s10 = vec(300 * 10), s200 = vec(40 * 200), b10 = vec(10);
  struct Case {
    std::string what;
    ir::NodePtr node;
    std::vector<const std::vector<float>*> in;
    std::vector<float> scale;  // per output element: the tolerance's scale
  };
  std::vector<Case> cases;
  auto abs_product = [](const std::vector<float>& a, const std::vector<float>& b, int64_t M,
                        int64_t N, int64_t K, bool tb, const std::vector<float>* bias) {
    std::vector<float> s(static_cast<size_t>(M * N));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = bias ? std::fabs((*bias)[j]) : 0.0;
        for (int64_t k = 0; k < K; ++k)
          acc += std::fabs(a[i * K + k]) * std::fabs(tb ? b[j * K + k] : b[k * N + j]);
        s[i * N + j] = static_cast<float>(acc);
      }
    return s;
  };
  cases.push_back(
      {"linear 128x784 @ 256x784^T + b",
       op(ir::OpCode::Linear, ir::NoAttrs{}, {leaf({128, 784}), leaf({256, 784}), leaf({256})}),
       {&x784, &w784, &b256},
       abs_product(x784, w784, 128, 256, 784, true, &b256)});
  // A batch of 4 through a linear layer (the own GEMM's dot path) and a weight gradient over it
  // with a momentum addend (K = 4), against OpenBLAS and its epilogue pass.
  auto x4 = vec(4 * 784), w50 = vec(50 * 784), b50 = vec(50), g4 = vec(4 * 50), mom = vec(50 * 784),
       sc = std::vector<float>{0.9f};
  cases.push_back(
      {"linear 4x784 @ 50x784^T + b",
       op(ir::OpCode::Linear, ir::NoAttrs{}, {leaf({4, 784}), leaf({50, 784}), leaf({50})}),
       {&x4, &w50, &b50},
       abs_product(x4, w50, 4, 50, 784, true, &b50)});
  {
    std::vector<float> gt(50 * 4);  // g^T, so that abs_product sees the untransposed A
    for (int64_t i = 0; i < 50; ++i)
      for (int64_t k = 0; k < 4; ++k) gt[i * 4 + k] = g4[k * 50 + i];
    auto scale = abs_product(gt, x4, 50, 784, 4, false, nullptr);
    for (size_t i = 0; i < scale.size(); ++i) scale[i] += 0.9f * std::fabs(mom[i]);
    cases.push_back({"gemm 4x50^T @ 4x784 + 0.9 * momentum",
                     op(ir::OpCode::Gemm, ir::GemmAttrs{.trans_a = true, .addend = true},
                        {leaf({4, 50}), leaf({4, 784}), leaf({50, 784}), leaf({})}),
                     {&g4, &x4, &mom, &sc},
                     scale});
  }
  cases.push_back({"matmul 64x96 @ 96x80",
                   op(ir::OpCode::Matmul, ir::MatmulAttrs{}, {leaf({64, 96}), leaf({96, 80})}),
                   {&a96, &b96},
                   abs_product(a96, b96, 64, 80, 96, false, nullptr)});
  auto ones = [](size_t n) { return std::vector<float>(n, 1.f); };
  cases.push_back({"softmax [300, 10]",
                   op(ir::OpCode::Softmax, ir::DimAttrs{1}, {leaf({300, 10})}),
                   {&s10},
                   ones(3000)});
  cases.push_back({"log_softmax [300, 10]",
                   op(ir::OpCode::LogSoftmax, ir::DimAttrs{1}, {leaf({300, 10})}),
                   {&s10},
                   {}});
  cases.push_back({"softmax [40, 200]",
                   op(ir::OpCode::Softmax, ir::DimAttrs{1}, {leaf({40, 200})}),
                   {&s200},
                   ones(8000)});
  cases.push_back(
      {"exp [40, 200]", op(ir::OpCode::Exp, ir::NoAttrs{}, {leaf({40, 200})}), {&s200}, {}});
  cases.push_back(
      {"gelu [40, 200]", op(ir::OpCode::Gelu, ir::GeluAttrs{}, {leaf({40, 200})}), {&s200}, {}});
  cases.push_back({"add [300, 10] + [10]",
                   op(ir::OpCode::Add, ir::NoAttrs{}, {leaf({300, 10}), leaf({10})}),
                   {&s10, &b10},
                   {}});
  std::vector<float> row_abs(40);
  for (int64_t i = 0; i < 40; ++i)
    for (int64_t j = 0; j < 200; ++j) row_abs[i] += std::fabs(s200[i * 200 + j]);
  cases.push_back({"sum [40, 200] over dim 1",
                   op(ir::OpCode::Sum, ir::AxesAttrs{.dims = {1}}, {leaf({40, 200})}),
                   {&s200},
                   row_abs});

  const cpu::KernelVariant& running = cpu::kernels();
  int compared = 0;
  for (const cpu::KernelVariant* v : cpu::built_variants()) {
    if (!cpu::runs_here(*v) || v == &running) continue;
    for (const Case& c : cases) {
      const auto want = run(running, *c.node, c.in);
      const auto got = run(*v, *c.node, c.in);
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        const double tol = c.scale.empty() ? 2e-6 * std::max(1.0, std::fabs(double{want[i]}))
                                           : 1e-5 * double{c.scale[i]} + 1e-30;
        ASSERT_LE(std::fabs(double{got[i]} - double{want[i]}), tol)
            << c.what << ": variant " << v->name << " against " << running.name << " at " << i
            << ": " << got[i] << " vs " << want[i];
      }
      ++compared;
    }
  }
  // Which variants this CPU runs is the machine's; on an x86-64 CPU with AVX2 a portable build
  // compares at least two.
  if (cpu::built_variants().size() > 1 && cpu::runs_here(*cpu::built_variants()[1])) {
    EXPECT_GE(compared, static_cast<int>(cases.size()));
  }
}

}  // namespace
