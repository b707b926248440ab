// The reference rows: every op of include/cstorch/tensor.h against PyTorch, forward and
// backward, eager and traced. Adding a case is one row; see op_table.h for the fields.
//
// Tolerances: the default is rtol 1e-5, atol 1e-6 against a float64 torch reference (pow, log
// near 0, var, norm, logsumexp and layer_norm all meet it). Looser ones, each stated in its row:
//   - matmul / linear with K >= 64: kNormTol, 1e-5 of max|ref| (an f32 dot product of K terms
//     is accurate to ~sqrt(K) ulps of the output's scale, not of each element; the BLAS
//     kernel, and so the summation order, depends on the CPU).
//   - kLoose (atol 1e-5) for long reductions (sum over 300-1000 terms, layer_norm over 520)
//     and the transformer-block composition (a grad element of 0.06 is off by 7e-6, 1.1e-4
//     relative, after layer_norm -> linear -> gelu -> linear).
//   - bf16 / f16 rows compute in the 16-bit type (kNative) and allow one unit in the last
//     place of that type (1/128, 1/1024 relative); softmax_bf16 two units plus 1e-3.
#include "op_table.h"

#include <algorithm>
#include <cmath>

#include "cstorch/nn/functional.h"
#include "cstorch/recompute.h"
#include "ref_util.h"

namespace cstorch::reftest {

namespace {

using D = DType;
constexpr Tol kLoose{1e-5, 1e-5};   // long reductions and deep compositions
constexpr Tol kMatmul{1e-5, 1e-5};  // with kNormTol: 1e-5 of max|ref|
constexpr Tol kExact{0, 0};
constexpr Tol kBf16{1.0 / 128, 0};  // one bf16 ulp
constexpr Tol kF16{1.0 / 1024, 0};  // one f16 ulp

// clang-format off
std::vector<Row> make_table() {
  return {
      // ---------------------------------------------------------------- creation
      {"zeros", {}, [](const In& x) { return cs::zeros({2, 3}, D::f32, x.device); }, "torch.zeros(2, 3)", kExact, kNoGrad},
      {"zeros_i64", {}, [](const In& x) { return cs::zeros({4}, D::i64, x.device); },
       "torch.zeros(4, dtype=torch.int64)", kExact, kNoGrad},
      {"ones", {}, [](const In& x) { return cs::ones({3, 1, 2}, D::f32, x.device); }, "torch.ones(3, 1, 2)", kExact, kNoGrad},
      {"ones_bool", {}, [](const In& x) { return cs::ones({3}, D::boolean, x.device); },
       "torch.ones(3, dtype=torch.bool)", kExact, kNoGrad},
      {"full", {}, [](const In& x) { return cs::full({2, 2}, 3.5, D::f32, x.device); }, "torch.full((2, 2), 3.5)", kExact, kNoGrad},
      {"full_bf16", {}, [](const In& x) { return cs::full({3}, 0.1, D::bf16, x.device); },
       "torch.full((3,), 0.1, dtype=torch.bfloat16)", kExact, kNoGrad | kNative},
      {"full_0d", {}, [](const In& x) { return cs::full({}, -2.0, D::f32, x.device); }, "torch.full((), -2.0)", kExact, kNoGrad},
      {"zeros_like", {{2, 3}}, [](const In& x) { return cs::zeros_like(x[0]); },
       "torch.zeros_like(x[0])", kExact, kNoGrad},
      {"ones_like_i64", {idx({2, 3}, 0, 5)}, [](const In& x) { return cs::ones_like(x[0]); },
       "torch.ones_like(x[0])", kExact, kNoGrad},
      {"full_like", {{3, 2}}, [](const In& x) { return cs::full_like(x[0], 7.25); },
       "torch.full_like(x[0], 7.25)", kExact, kNoGrad},
      {"arange_end", {}, [](const In& x) { return cs::arange(5).to(x.device); }, "torch.arange(5)", kExact, kNoGrad},
      {"arange_f32_step", {}, [](const In& x) { return cs::arange(1, 2.1, 0.25, D::f32).to(x.device); },
       "torch.arange(1, 2.1, 0.25, dtype=torch.float32)", kExact, kNoGrad},
      {"arange_neg_step", {}, [](const In& x) { return cs::arange(5, 0, -1.5, D::f32).to(x.device); },
       "torch.arange(5, 0, -1.5, dtype=torch.float32)", kExact, kNoGrad},
      {"arange_i64_range", {}, [](const In& x) { return cs::arange(-3, 7, 2).to(x.device); },
       "torch.arange(-3, 7, 2)", kExact, kNoGrad},
      {"scalar_tensor", {}, [](const In& x) { return cs::scalar_tensor(2.5).to(x.device); }, "torch.tensor(2.5)",
       kExact, kNoGrad},
      {"from_vector_f32", {}, [](const In& x) { return cs::from_vector(std::vector<float>{1.5f, -2, 0.25f, 8}, {2, 2}).to(x.device); },
       "torch.tensor([[1.5, -2], [0.25, 8]])", kExact, kNoGrad},
      {"from_vector_i64", {}, [](const In& x) { return cs::from_vector(std::vector<int64_t>{3, -1, 1LL << 40}, {3}).to(x.device); },
       "torch.tensor([3, -1, 1 << 40])", kExact, kNoGrad | kNative},
      {"from_vector_i32", {}, [](const In& x) { return cs::from_vector(std::vector<int32_t>{7, -9}, {2, 1}).to(x.device); },
       "torch.tensor([[7], [-9]], dtype=torch.int32)", kExact, kNoGrad | kNative},
      {"from_vector_bool", {}, [](const In& x) { return cs::from_vector(std::vector<uint8_t>{1, 0, 1}, {3}, D::boolean).to(x.device); },
       "torch.tensor([True, False, True])", kExact, kNoGrad | kNative},
      {"scalar_tensor_i64", {}, [](const In& x) { return cs::scalar_tensor(-4, D::i64).to(x.device); },
       "torch.tensor(-4)", kExact, kNoGrad},

      // ---------------------------------------------------------------- random draws
      // No torch expression (op_table.h): checked eager against traced and on every device
      // against the CPU, the generator seeded alike before each run.
      {"rand", {}, [](const In& x) { return cs::rand({4, 5}, D::f32, x.device); }, "", kExact, kNoGrad},
      {"uniform_range", {}, [](const In& x) { return cs::uniform({3, 7}, -2, 3, D::f32, x.device); }, "",
       kExact, kNoGrad},
      {"randn_bf16", {}, [](const In& x) { return cs::randn({6, 5}, D::bf16, x.device); }, "", kExact, kNoGrad},
      // Normal draws pass uniform bits through log, sqrt and cos: a device's own versions of
      // those are within a few ulps of the CPU's (the GPU's differed by 16 ulps of one element
      // in 9), so f32 normals are held to the default tolerance; bf16 ones round it away.
      {"normal_then_randn", {},
       [](const In& x) { return cs::normal({9}, 1.0, 2.0, D::f32, x.device) - cs::randn({9}, D::f32, x.device); },
       "", {}, kNoGrad},
      {"bernoulli", {}, [](const In& x) { return cs::bernoulli({4, 6}, 0.3, D::f32, x.device); }, "", kExact,
       kNoGrad},
      {"dropout_train", {{4, 6}}, [](const In& x) { return cs::dropout(x[0], 0.4, true); }, ""},
      {"sdpa_dropout", {{1, 2, 5, 4}, {1, 2, 6, 4}, {1, 2, 6, 3}},
       [](const In& x) {
         cs::nn::functional::AttentionOptions o;
         o.dropout_p = 0.3;
         return cs::nn::functional::scaled_dot_product_attention(x[0], x[1], x[2], o);
       },
       ""},

      // ---------------------------------------------------------------- unary elementwise
      {"neg", {{2, 3, 4}}, [](const In& x) { return cs::neg(x[0]); }, "torch.neg(x[0])"},
      {"abs", {{2, 3, 4}}, [](const In& x) { return cs::abs(x[0]); }, "torch.abs(x[0])"},
      {"abs_i64", {idx({5}, -4, 4)}, [](const In& x) { return cs::abs(x[0]); }, "torch.abs(x[0])",
       kExact, kNoGrad},
      {"sign", {{2, 3}}, [](const In& x) { return cs::sign(x[0]); }, "torch.sign(x[0])", kExact, kNoGrad},
      {"sign_zero", {vals({-2, 0, 3, -0.0}, {4})}, [](const In& x) { return cs::sign(x[0]); },
       "torch.sign(x[0])", kExact, kNoGrad},
      {"exp", {{2, 3, 4}}, [](const In& x) { return cs::exp(x[0]); }, "torch.exp(x[0])"},
      {"exp_transposed", {{4, 3}}, [](const In& x) { return cs::exp(x[0].t()); }, "torch.exp(x[0].t())"},
      {"log", {pos({2, 3, 4})}, [](const In& x) { return cs::log(x[0]); }, "torch.log(x[0])"},
      {"log_near_zero", {uni({3, 4}, 1e-4, 1e-2)}, [](const In& x) { return cs::log(x[0]); },
       "torch.log(x[0])"},
      {"sqrt", {pos({2, 3, 4})}, [](const In& x) { return cs::sqrt(x[0]); }, "torch.sqrt(x[0])"},
      {"rsqrt", {pos({2, 3, 4})}, [](const In& x) { return cs::rsqrt(x[0]); }, "torch.rsqrt(x[0])"},
      {"reciprocal", {nz({2, 3, 4})}, [](const In& x) { return cs::reciprocal(x[0]); },
       "torch.reciprocal(x[0])"},
      {"tanh", {{2, 3, 4}}, [](const In& x) { return cs::tanh(x[0]); }, "torch.tanh(x[0])"},
      {"tanh_large", {uni({4, 5}, -12, 12)}, [](const In& x) { return cs::tanh(x[0]); }, "torch.tanh(x[0])"},
      {"sigmoid", {{2, 3, 4}}, [](const In& x) { return cs::sigmoid(x[0]); }, "torch.sigmoid(x[0])"},
      {"sigmoid_large", {uni({4, 5}, -30, 30)}, [](const In& x) { return cs::sigmoid(x[0]); },
       "torch.sigmoid(x[0])"},
      {"relu", {{2, 3, 4}}, [](const In& x) { return cs::relu(x[0]); }, "torch.relu(x[0])"},
      {"relu_permuted", {{2, 3, 4}}, [](const In& x) { return cs::relu(x[0].permute({2, 0, 1})); },
       "torch.relu(x[0].permute(2, 0, 1))"},
      {"gelu", {uni({3, 4, 5}, -5, 5)}, [](const In& x) { return cs::gelu(x[0]); }, "F.gelu(x[0])"},
      {"gelu_tanh", {uni({3, 4, 5}, -5, 5)}, [](const In& x) { return cs::gelu(x[0], true); },
       "F.gelu(x[0], approximate='tanh')"},
      {"silu", {uni({3, 4, 5}, -6, 6)}, [](const In& x) { return cs::silu(x[0]); }, "F.silu(x[0])"},
      {"erf", {{3, 4, 5}}, [](const In& x) { return cs::erf(x[0]); }, "torch.erf(x[0])"},
      {"sin", {uni({3, 4}, -7, 7)}, [](const In& x) { return cs::sin(x[0]); }, "torch.sin(x[0])"},
      {"cos", {uni({3, 4}, -7, 7)}, [](const In& x) { return cs::cos(x[0]); }, "torch.cos(x[0])"},
      {"expm1", {uni({3, 4}, -3, 3)}, [](const In& x) { return cs::expm1(x[0]); }, "torch.expm1(x[0])"},
      {"expm1_tiny", {uni({5}, -1e-6, 1e-6)}, [](const In& x) { return cs::expm1(x[0]); },
       "torch.expm1(x[0])", Tol{1e-6, 0}},
      {"floor", {uni({3, 4}, -5, 5)}, [](const In& x) { return cs::floor(x[0]); }, "torch.floor(x[0])",
       kExact, kNoGrad},
      {"isfinite", {vals({1, INFINITY, -INFINITY, NAN, 0, -3.5}, {2, 3})},
       [](const In& x) { return cs::isfinite(x[0]); }, "torch.isfinite(x[0])", kExact, kNoGrad},
      {"isfinite_i64", {idx({4}, -3, 3)}, [](const In& x) { return cs::isfinite(x[0]); },
       "torch.isfinite(x[0])", kExact, kNoGrad},
      {"logical_not_bool", {mask({3, 4})}, [](const In& x) { return cs::logical_not(x[0]); },
       "torch.logical_not(x[0])", kExact, kNoGrad},
      {"logical_not_f32", {vals({0, 1.5, -0.0, -2}, {4})}, [](const In& x) { return cs::logical_not(x[0]); },
       "torch.logical_not(x[0])", kExact, kNoGrad},
      // cast: forward values (torch rounds to nearest even, truncates toward zero to ints).
      {"cast_f32_bf16", {uni({4, 5}, -100, 100)}, [](const In& x) { return cs::cast(x[0], D::bf16); },
       "x[0].to(torch.bfloat16)", kExact, kNative},
      {"cast_f32_f16", {uni({4, 5}, -100, 100)}, [](const In& x) { return cs::cast(x[0], D::f16); },
       "x[0].to(torch.float16)", kExact, kNative},
      {"cast_f16_tiny", {vals({1e-6, -3e-7, 7e4, 1e5, 6.1e-5, 0.1}, {6})},
       [](const In& x) { return cs::cast(x[0], D::f16); }, "x[0].to(torch.float16)", kExact,
       kNative | kNoGrad},
      {"cast_bf16_f32", {typed(uni({4, 5}, -10, 10), D::bf16)},
       [](const In& x) { return cs::cast(x[0], D::f32); }, "x[0].to(torch.float32)", kExact, kNative},
      {"cast_f16_f32", {typed(uni({4, 5}, -10, 10), D::f16)},
       [](const In& x) { return cs::cast(x[0], D::f32); }, "x[0].to(torch.float32)", kExact, kNative},
      {"cast_bf16_f16", {typed(uni({6}, -10, 10), D::bf16)},
       [](const In& x) { return cs::cast(x[0], D::f16); }, "x[0].to(torch.float16)", kExact, kNative},
      {"cast_f32_i64", {uni({3, 4}, -5, 5)}, [](const In& x) { return cs::cast(x[0], D::i64); },
       "x[0].to(torch.int64)", kExact, kNative | kNoGrad},
      {"cast_f32_i32", {uni({3, 4}, -50, 50)}, [](const In& x) { return cs::cast(x[0], D::i32); },
       "x[0].to(torch.int32)", kExact, kNative | kNoGrad},
      {"cast_i64_f32", {idx({3, 4}, -1000, 1000)}, [](const In& x) { return cs::cast(x[0], D::f32); },
       "x[0].to(torch.float32)", kExact, kNative | kNoGrad},
      {"cast_i64_i32", {idx({5}, -1000, 1000)}, [](const In& x) { return cs::cast(x[0], D::i32); },
       "x[0].to(torch.int32)", kExact, kNative | kNoGrad},
      {"cast_bool_f32", {mask({3, 4})}, [](const In& x) { return cs::cast(x[0], D::f32); },
       "x[0].to(torch.float32)", kExact, kNative | kNoGrad},
      {"cast_f32_bool", {vals({0, 1.5, -0.0, -2, NAN}, {5})}, [](const In& x) { return cs::cast(x[0], D::boolean); },
       "x[0].to(torch.bool)", kExact, kNative | kNoGrad},
      {"cast_i64_bool", {idx({6}, -2, 2)}, [](const In& x) { return cs::cast(x[0], D::boolean); },
       "x[0].to(torch.bool)", kExact, kNative | kNoGrad},
      {"tensor_to_bf16_grad", {{3, 4}}, [](const In& x) { return x[0].to(D::bf16); },
       "x[0].to(torch.bfloat16)", kExact, kNative},

      // ---------------------------------------------------------------- binary elementwise
      {"add", {{2, 3, 4}, {2, 3, 4}}, [](const In& x) { return cs::add(x[0], x[1]); }, "x[0] + x[1]"},
      {"add_bcast_row_col", {{3, 1}, {1, 4}}, [](const In& x) { return cs::add(x[0], x[1]); }, "x[0] + x[1]"},
      {"add_bcast_trailing", {{2, 3, 4}, {4}}, [](const In& x) { return cs::add(x[0], x[1]); }, "x[0] + x[1]"},
      {"add_bcast_middle", {{2, 1, 4}, {3, 1}}, [](const In& x) { return cs::add(x[0], x[1]); }, "x[0] + x[1]"},
      {"add_0d", {{2, 3}, {}}, [](const In& x) { return cs::add(x[0], x[1]); }, "x[0] + x[1]"},
      {"add_transposed", {{4, 3}, {3, 4}}, [](const In& x) { return cs::add(x[0].t(), x[1]); },
       "x[0].t() + x[1]"},
      {"add_both_permuted", {{4, 2, 3}, {3, 4, 2}},
       [](const In& x) { return cs::add(x[0].permute({1, 2, 0}), x[1].permute({2, 0, 1})); },
       "x[0].permute(1, 2, 0) + x[1].permute(2, 0, 1)"},
      {"add_i64", {idx({3, 4}, -50, 50), idx({4}, -50, 50)}, [](const In& x) { return cs::add(x[0], x[1]); },
       "x[0] + x[1]", kExact, kNoGrad | kNative},
      {"add_i64_f32_promote", {idx({3, 4}, -50, 50), {4}}, [](const In& x) { return cs::add(x[0], x[1]); },
       "x[0] + x[1]"},
      {"add_bool_i64_promote", {mask({3, 4}), idx({3, 4}, -5, 5)}, [](const In& x) { return cs::add(x[0], x[1]); },
       "x[0] + x[1]", kExact, kNoGrad | kNative},
      {"add_bf16", {typed({3, 4}, D::bf16), typed({3, 4}, D::bf16)},
       [](const In& x) { return cs::add(x[0], x[1]); }, "x[0] + x[1]", kBf16, kNative},
      {"mul_f16", {typed({3, 4}, D::f16), typed({4}, D::f16)},
       [](const In& x) { return cs::mul(x[0], x[1]); }, "x[0] * x[1]", kF16, kNative},
      {"add_bf16_f16_promote", {typed({5}, D::bf16), typed({5}, D::f16)},
       [](const In& x) { return cs::add(x[0], x[1]); }, "x[0] + x[1]", kExact, kNative},
      {"add_bf16_f32_promote", {typed({5}, D::bf16), {5}},
       [](const In& x) { return cs::add(x[0], x[1]); }, "x[0] + x[1]", kExact, kNative},
      {"sub", {{2, 3, 4}, {2, 3, 4}}, [](const In& x) { return cs::sub(x[0], x[1]); }, "x[0] - x[1]"},
      {"sub_bcast", {{3, 1}, {1, 4}}, [](const In& x) { return cs::sub(x[0], x[1]); }, "x[0] - x[1]"},
      {"mul", {{2, 3, 4}, {2, 3, 4}}, [](const In& x) { return cs::mul(x[0], x[1]); }, "x[0] * x[1]"},
      {"mul_bcast", {{2, 1, 4}, {3, 1}}, [](const In& x) { return cs::mul(x[0], x[1]); }, "x[0] * x[1]"},
      {"mul_0d", {{}, {2, 3}}, [](const In& x) { return cs::mul(x[0], x[1]); }, "x[0] * x[1]"},
      {"mul_transposed", {{3, 4}, {4, 3}}, [](const In& x) { return cs::mul(x[0], x[1].t()); }, "x[0] * x[1].t()"},
      {"mul_i64", {idx({3, 4}, -50, 50), idx({3, 1}, -50, 50)}, [](const In& x) { return cs::mul(x[0], x[1]); },
       "x[0] * x[1]", kExact, kNoGrad | kNative},
      {"div", {{2, 3, 4}, nz({2, 3, 4})}, [](const In& x) { return cs::div(x[0], x[1]); }, "x[0] / x[1]"},
      {"div_bcast", {{3, 1}, nz({1, 4})}, [](const In& x) { return cs::div(x[0], x[1]); }, "x[0] / x[1]"},
      {"div_transposed", {{3, 4}, nz({4, 3})}, [](const In& x) { return cs::div(x[0], x[1].t()); },
       "x[0] / x[1].t()"},
      {"div_i64_true_division", {idx({6}, -20, 20), idx({6}, 1, 7)},
       [](const In& x) { return cs::div(x[0], x[1]); }, "x[0] / x[1]", kExact, kNoGrad | kNative},
      {"pow_tensor", {pos({2, 3, 4}), uni({2, 3, 4}, -2, 2)}, [](const In& x) { return cs::pow(x[0], x[1]); },
       "torch.pow(x[0], x[1])"},
      {"pow_tensor_bcast", {pos({3, 1}), uni({1, 4}, -2, 2)}, [](const In& x) { return cs::pow(x[0], x[1]); },
       "torch.pow(x[0], x[1])"},
      {"pow_scalar_2", {{2, 3, 4}}, [](const In& x) { return cs::pow(x[0], 2.0); }, "torch.pow(x[0], 2.0)"},
      {"pow_scalar_3_neg_base", {{2, 3, 4}}, [](const In& x) { return cs::pow(x[0], 3.0); }, "torch.pow(x[0], 3.0)"},
      {"pow_scalar_half", {pos({2, 3, 4})}, [](const In& x) { return cs::pow(x[0], 0.5); }, "torch.pow(x[0], 0.5)"},
      {"pow_scalar_neg", {pos({2, 3, 4})}, [](const In& x) { return cs::pow(x[0], -1.5); }, "torch.pow(x[0], -1.5)"},
      {"pow_scalar_0", {{2, 3}}, [](const In& x) { return cs::pow(x[0], 0.0); }, "torch.pow(x[0], 0.0)"},
      {"pow_near_zero", {uni({3, 4}, 1e-3, 0.1)}, [](const In& x) { return cs::pow(x[0], 2.5); },
       "torch.pow(x[0], 2.5)"},
      {"pow_base_scalar", {uni({2, 3, 4}, -3, 3)}, [](const In& x) { return cs::pow(2.0, x[0]); },
       "torch.pow(2.0, x[0])"},
      {"pow_zero_base", {vals({0, 0, 1.5, 2}, {4}), vals({2, 3, 1.5, 0.7}, {4})},
       [](const In& x) { return cs::pow(x[0], x[1]); }, "torch.pow(x[0], x[1])"},
      {"pow_scalar_2_at_zero", {vals({0, -1, 1, 0.5}, {4})}, [](const In& x) { return cs::pow(x[0], 2.0); },
       "torch.pow(x[0], 2.0)"},
      {"maximum", {{2, 3, 4}, {2, 3, 4}}, [](const In& x) { return cs::maximum(x[0], x[1]); },
       "torch.maximum(x[0], x[1])"},
      {"maximum_bcast", {{3, 1}, {1, 4}}, [](const In& x) { return cs::maximum(x[0], x[1]); },
       "torch.maximum(x[0], x[1])"},
      {"minimum", {{2, 3, 4}, {2, 3, 4}}, [](const In& x) { return cs::minimum(x[0], x[1]); },
       "torch.minimum(x[0], x[1])"},
      {"minimum_bcast_transposed", {{4, 3}, {4}}, [](const In& x) { return cs::minimum(x[0].t(), x[1]); },
       "torch.minimum(x[0].t(), x[1])"},
      // Comparisons and logical ops: integer-valued inputs so that ties occur.
      {"eq", {idx({3, 4}, 0, 3, D::f32), idx({3, 4}, 0, 3, D::f32)}, [](const In& x) { return cs::eq(x[0], x[1]); },
       "torch.eq(x[0], x[1])", kExact, kNoGrad},
      {"ne_bcast", {idx({3, 1}, 0, 3, D::f32), idx({1, 4}, 0, 3, D::f32)},
       [](const In& x) { return cs::ne(x[0], x[1]); }, "torch.ne(x[0], x[1])", kExact, kNoGrad},
      {"lt", {idx({3, 4}, 0, 3, D::f32), idx({4}, 0, 3, D::f32)}, [](const In& x) { return cs::lt(x[0], x[1]); },
       "torch.lt(x[0], x[1])", kExact, kNoGrad},
      {"le", {idx({3, 4}, 0, 3, D::f32), idx({4}, 0, 3, D::f32)}, [](const In& x) { return cs::le(x[0], x[1]); },
       "torch.le(x[0], x[1])", kExact, kNoGrad},
      {"gt_transposed", {idx({4, 3}, 0, 3, D::f32), idx({3, 4}, 0, 3, D::f32)},
       [](const In& x) { return cs::gt(x[0].t(), x[1]); }, "torch.gt(x[0].t(), x[1])", kExact, kNoGrad},
      {"ge", {idx({3, 4}, 0, 3, D::f32), idx({3, 4}, 0, 3, D::f32)}, [](const In& x) { return cs::ge(x[0], x[1]); },
       "torch.ge(x[0], x[1])", kExact, kNoGrad},
      {"eq_i64_f32_promote", {idx({3, 4}, 0, 3), idx({3, 4}, 0, 3, D::f32)},
       [](const In& x) { return cs::eq(x[0], x[1]); }, "torch.eq(x[0], x[1])", kExact, kNoGrad | kNative},
      {"lt_i64", {idx({3, 4}, 0, 3), idx({4}, 0, 3)}, [](const In& x) { return cs::lt(x[0], x[1]); },
       "torch.lt(x[0], x[1])", kExact, kNoGrad | kNative},
      {"logical_and", {mask({3, 4}), mask({3, 4})}, [](const In& x) { return cs::logical_and(x[0], x[1]); },
       "torch.logical_and(x[0], x[1])", kExact, kNoGrad},
      {"logical_or_bcast", {mask({3, 1}), mask({1, 4})}, [](const In& x) { return cs::logical_or(x[0], x[1]); },
       "torch.logical_or(x[0], x[1])", kExact, kNoGrad},
      {"logical_xor", {mask({3, 4}), mask({4})}, [](const In& x) { return cs::logical_xor(x[0], x[1]); },
       "torch.logical_xor(x[0], x[1])", kExact, kNoGrad},
      {"logical_and_f32", {idx({3, 4}, 0, 2, D::f32), idx({3, 4}, -1, 1, D::f32)},
       [](const In& x) { return cs::logical_and(x[0], x[1]); }, "torch.logical_and(x[0], x[1])", kExact, kNoGrad},
      {"where", {mask({2, 3, 4}), {2, 3, 4}, {2, 3, 4}}, [](const In& x) { return cs::where(x[0], x[1], x[2]); },
       "torch.where(x[0], x[1], x[2])"},
      {"where_bcast", {mask({3, 1}), {1, 4}, {3, 4}}, [](const In& x) { return cs::where(x[0], x[1], x[2]); },
       "torch.where(x[0], x[1], x[2])"},
      {"where_bcast_all", {mask({4}), {3, 1}, {}}, [](const In& x) { return cs::where(x[0], x[1], x[2]); },
       "torch.where(x[0], x[1], x[2])"},
      {"where_scalar_b", {mask({3, 4}), {3, 4}}, [](const In& x) { return cs::where(x[0], x[1], 1.5); },
       "torch.where(x[0], x[1], 1.5)"},
      {"where_scalar_a", {mask({3, 4}), {4, 3}}, [](const In& x) { return cs::where(x[0], -2.0, x[1].t()); },
       "torch.where(x[0], -2.0, x[1].t())"},
      {"addcmul", {{3, 4}, {3, 4}, {3, 4}}, [](const In& x) { return cs::addcmul(x[0], x[1], x[2]); },
       "torch.addcmul(x[0], x[1], x[2])"},
      {"addcmul_scalar_c", {{3, 4}, {3, 4}, {}}, [](const In& x) { return cs::addcmul(x[0], x[1], x[2], -0.5); },
       "torch.addcmul(x[0], x[1], x[2], value=-0.5)"},
      {"addcmul_bcast", {{4}, {3, 1}, {2, 1, 4}}, [](const In& x) { return cs::addcmul(x[0], x[1], x[2]); },
       "torch.addcmul(x[0], x[1], x[2])"},
      {"addcmul_transposed", {{4, 3}, {3, 4}, {1}}, [](const In& x) { return cs::addcmul(x[0].t(), x[1], x[2], 2.0); },
       "torch.addcmul(x[0].t(), x[1], x[2], value=2.0)"},
      {"clamp", {{3, 4, 5}}, [](const In& x) { return cs::clamp(x[0], -0.5, 0.7); }, "torch.clamp(x[0], -0.5, 0.7)"},
      {"clamp_lo", {{3, 4}}, [](const In& x) { return cs::clamp(x[0], 0.1, std::nullopt); }, "torch.clamp(x[0], min=0.1)"},
      {"clamp_hi", {{3, 4}}, [](const In& x) { return cs::clamp(x[0], std::nullopt, -0.2); }, "torch.clamp(x[0], max=-0.2)"},
      {"clamp_i64", {idx({6}, -10, 10)}, [](const In& x) { return cs::clamp(x[0], -3, 4); },
       "torch.clamp(x[0], -3, 4)", kExact, kNoGrad | kNative},

      // ---------------------------------------------------------------- operators
      {"op_add", {{2, 3}, {3}}, [](const In& x) { return x[0] + x[1]; }, "x[0] + x[1]"},
      {"op_sub", {{2, 3}, {2, 1}}, [](const In& x) { return x[0] - x[1]; }, "x[0] - x[1]"},
      {"op_mul", {{2, 3}, {3}}, [](const In& x) { return x[0] * x[1]; }, "x[0] * x[1]"},
      {"op_div", {{2, 3}, nz({3})}, [](const In& x) { return x[0] / x[1]; }, "x[0] / x[1]"},
      {"op_neg", {{2, 3}}, [](const In& x) { return -x[0]; }, "-x[0]"},
      {"op_add_scalar", {{2, 3}}, [](const In& x) { return x[0] + 1.25; }, "x[0] + 1.25"},
      {"op_sub_scalar", {{2, 3}}, [](const In& x) { return x[0] - 1.25; }, "x[0] - 1.25"},
      {"op_mul_scalar", {{2, 3}}, [](const In& x) { return x[0] * -3.0; }, "x[0] * -3.0"},
      {"op_div_scalar", {{2, 3}}, [](const In& x) { return x[0] / 3.0; }, "x[0] / 3.0"},
      {"op_scalar_add", {{2, 3}}, [](const In& x) { return 1.25 + x[0]; }, "1.25 + x[0]"},
      {"op_scalar_sub", {{2, 3}}, [](const In& x) { return 1.25 - x[0]; }, "1.25 - x[0]"},
      {"op_scalar_mul", {{2, 3}}, [](const In& x) { return 0.5 * x[0]; }, "0.5 * x[0]"},
      {"op_scalar_div", {nz({2, 3})}, [](const In& x) { return 2.0 / x[0]; }, "2.0 / x[0]"},
      {"op_scalar_bf16_keeps_dtype", {typed({4}, D::bf16)}, [](const In& x) { return x[0] * 3.0; },
       "x[0] * 3.0", kBf16, kNative},
      {"op_i64_mul_float_scalar", {idx({4}, -5, 5)}, [](const In& x) { return x[0] * 2.5; }, "x[0] * 2.5",
       kExact, kNoGrad | kNative},
      // A whole-valued double scalar acts as a Python int (x + 3), a fractional one as a float.
      {"op_i64_add_int_scalar", {idx({4}, -5, 5)}, [](const In& x) { return x[0] + 3.0; }, "x[0] + 3",
       kExact, kNoGrad | kNative},
      {"op_bool_add_int_scalar", {mask({4})}, [](const In& x) { return x[0] + 2.0; }, "x[0] + 2",
       kExact, kNoGrad | kNative},
      {"op_i64_div_int_scalar", {idx({5}, -9, 9)}, [](const In& x) { return x[0] / 2.0; }, "x[0] / 2",
       kExact, kNoGrad | kNative},
      {"op_f32_sub_int_scalar", {{4}}, [](const In& x) { return 2.0 - x[0]; }, "2 - x[0]"},
      {"op_eq", {idx({3, 4}, 0, 3, D::f32), idx({4}, 0, 3, D::f32)}, [](const In& x) { return x[0] == x[1]; },
       "x[0] == x[1]", kExact, kNoGrad},
      {"op_ne", {idx({3, 4}, 0, 3, D::f32), idx({4}, 0, 3, D::f32)}, [](const In& x) { return x[0] != x[1]; },
       "x[0] != x[1]", kExact, kNoGrad},
      {"op_lt", {idx({3, 4}, 0, 3, D::f32), idx({4}, 0, 3, D::f32)}, [](const In& x) { return x[0] < x[1]; },
       "x[0] < x[1]", kExact, kNoGrad},
      {"op_le", {idx({3, 4}, 0, 3, D::f32), idx({4}, 0, 3, D::f32)}, [](const In& x) { return x[0] <= x[1]; },
       "x[0] <= x[1]", kExact, kNoGrad},
      {"op_gt", {idx({3, 4}, 0, 3, D::f32), idx({4}, 0, 3, D::f32)}, [](const In& x) { return x[0] > x[1]; },
       "x[0] > x[1]", kExact, kNoGrad},
      {"op_ge", {idx({3, 4}, 0, 3, D::f32), idx({4}, 0, 3, D::f32)}, [](const In& x) { return x[0] >= x[1]; },
       "x[0] >= x[1]", kExact, kNoGrad},
      {"op_gt_scalar", {idx({3, 4}, 0, 3, D::f32)}, [](const In& x) { return x[0] > 1.0; }, "x[0] > 1.0", kExact, kNoGrad},
      {"op_lt_scalar", {idx({3, 4}, 0, 3, D::f32)}, [](const In& x) { return x[0] < 1.0; }, "x[0] < 1.0", kExact, kNoGrad},
      {"op_ge_scalar", {idx({3, 4}, 0, 3, D::f32)}, [](const In& x) { return x[0] >= 1.0; }, "x[0] >= 1.0", kExact, kNoGrad},
      {"op_le_scalar", {idx({3, 4}, 0, 3, D::f32)}, [](const In& x) { return x[0] <= 1.0; }, "x[0] <= 1.0", kExact, kNoGrad},
      {"op_eq_scalar", {idx({3, 4}, 0, 3, D::f32)}, [](const In& x) { return x[0] == 1.0; }, "x[0] == 1.0", kExact, kNoGrad},
      {"op_eq_scalar_i64", {idx({3, 4}, 0, 3)}, [](const In& x) { return x[0] == 1.0; }, "x[0] == 1", kExact, kNoGrad},
      {"op_chain", {{3, 4}, {4}, nz({3, 1})}, [](const In& x) { return (x[0] * x[1] - 2.0 * x[0]) / x[2] + 1.0; },
       "(x[0] * x[1] - 2.0 * x[0]) / x[2] + 1.0"},

      // ---------------------------------------------------------------- in-place and detach
      {"inplace_add_alpha", {{3, 4}, {4}},
       [](const In& x) { Tensor t = x[0] * 1.0; t.add_(x[1], 0.5); return t; },
       "x[0].mul(1.0).add_(x[1], alpha=0.5)"},
      {"inplace_sub", {{3, 4}, {3, 4}},
       [](const In& x) { Tensor t = x[0] * 1.0; t.sub_(x[1]); return t; }, "x[0].mul(1.0).sub_(x[1])"},
      {"inplace_sub_alpha", {{3, 4}, {3, 4}},
       [](const In& x) { Tensor t = x[0] * 1.0; t.sub_(x[1], 2.0); return t; },
       "x[0].mul(1.0).sub_(x[1], alpha=2.0)"},
      {"inplace_mul", {{3, 4}, {3, 1}},
       [](const In& x) { Tensor t = x[0] * 1.0; t.mul_(x[1]); return t; }, "x[0].mul(1.0).mul_(x[1])"},
      {"inplace_mul_scalar", {{3, 4}},
       [](const In& x) { Tensor t = x[0] * 1.0; t.mul_(-1.5); return t; }, "x[0].mul(1.0).mul_(-1.5)"},
      {"inplace_div", {{3, 4}, nz({4})},
       [](const In& x) { Tensor t = x[0] * 1.0; t.div_(x[1]); return t; }, "x[0].mul(1.0).div_(x[1])"},
      {"inplace_copy", {{3, 4}, {4}},
       [](const In& x) { Tensor t = x[0] * 2.0; t.copy_(x[1]); return t * x[0]; },
       "x[0].mul(2.0).copy_(x[1].expand(3, 4)) * x[0]"},
      {"inplace_fill", {{3, 4}},
       [](const In& x) { Tensor t = x[0] * 2.0; t.fill_(0.25); return t + x[0]; }, "x[0].mul(2.0).fill_(0.25) + x[0]"},
      {"inplace_zero", {{3, 4}},
       [](const In& x) { Tensor t = x[0] * 2.0; t.zero_(); return t - x[0]; }, "x[0].mul(2.0).zero_() - x[0]"},
      {"detach", {{3, 4}, {3, 4}}, [](const In& x) { return x[0].detach() * x[1]; }, "x[0].detach() * x[1]"},

      // ---------------------------------------------------------------- reductions
      {"sum_all", {{2, 3, 4}}, [](const In& x) { return cs::sum(x[0]); }, "torch.sum(x[0])"},
      {"sum_dim1", {{2, 3, 4}}, [](const In& x) { return cs::sum(x[0], {1}); }, "torch.sum(x[0], (1,))"},
      {"sum_neg_dim_keepdim", {{2, 3, 4}}, [](const In& x) { return cs::sum(x[0], {-1}, true); },
       "torch.sum(x[0], (-1,), keepdim=True)"},
      {"sum_multi_dim", {{2, 3, 4}}, [](const In& x) { return cs::sum(x[0], {0, 2}); }, "torch.sum(x[0], (0, 2))"},
      {"sum_multi_dim_keepdim_unsorted", {{2, 3, 4, 5}}, [](const In& x) { return cs::sum(x[0], {3, -3}, true); },
       "torch.sum(x[0], (3, -3), keepdim=True)"},
      {"sum_transposed", {{4, 3, 2}}, [](const In& x) { return cs::sum(x[0].permute({2, 0, 1}), {1}); },
       "torch.sum(x[0].permute(2, 0, 1), (1,))"},
      {"sum_0d", {{}}, [](const In& x) { return cs::sum(x[0]); }, "torch.sum(x[0])"},
      {"sum_i64", {idx({3, 4}, -100, 100)}, [](const In& x) { return cs::sum(x[0], {1}); }, "torch.sum(x[0], (1,))",
       kExact, kNoGrad | kNative},
      {"sum_bool", {mask({3, 4})}, [](const In& x) { return cs::sum(x[0]); }, "torch.sum(x[0])",
       kExact, kNoGrad | kNative},
      {"sum_long", {{3, 1000}}, [](const In& x) { return cs::sum(x[0], {1}); }, "torch.sum(x[0], (1,))", kLoose},
      {"sum_method", {{2, 3, 4}}, [](const In& x) { return x[0].sum({0}, true); }, "x[0].sum((0,), keepdim=True)"},
      {"mean_all", {{2, 3, 4}}, [](const In& x) { return cs::mean(x[0]); }, "torch.mean(x[0])"},
      {"mean_dim", {{2, 3, 4}}, [](const In& x) { return cs::mean(x[0], {1}); }, "torch.mean(x[0], (1,))"},
      {"mean_multi_keepdim", {{2, 3, 4}}, [](const In& x) { return cs::mean(x[0], {0, -1}, true); },
       "torch.mean(x[0], (0, -1), keepdim=True)"},
      {"mean_transposed", {{3, 4}}, [](const In& x) { return cs::mean(x[0].t(), {0}); }, "torch.mean(x[0].t(), (0,))"},
      {"mean_method", {{2, 3, 4}}, [](const In& x) { return x[0].mean({2}); }, "x[0].mean((2,))"},
      {"amax_all", {{2, 3, 4}}, [](const In& x) { return cs::amax(x[0]); }, "torch.amax(x[0])"},
      {"amax_dim", {{2, 3, 4}}, [](const In& x) { return cs::amax(x[0], {1}); }, "torch.amax(x[0], (1,))"},
      {"amax_multi_keepdim", {{2, 3, 4}}, [](const In& x) { return cs::amax(x[0], {0, 2}, true); },
       "torch.amax(x[0], (0, 2), keepdim=True)"},
      {"amax_transposed", {{3, 4}}, [](const In& x) { return cs::amax(x[0].t(), {-1}); }, "torch.amax(x[0].t(), (-1,))"},
      {"amin_dim", {{2, 3, 4}}, [](const In& x) { return cs::amin(x[0], {-1}); }, "torch.amin(x[0], (-1,))"},
      {"amin_all", {{2, 3, 4}}, [](const In& x) { return cs::amin(x[0]); }, "torch.amin(x[0])"},
      {"amax_i64", {idx({3, 4}, -100, 100)}, [](const In& x) { return cs::amax(x[0], {0}); }, "torch.amax(x[0], (0,))",
       kExact, kNoGrad | kNative},
      {"max_dims", {{2, 3, 4}}, [](const In& x) { return cs::max(x[0], {0, 1}); }, "torch.amax(x[0], (0, 1))"},
      {"min_keepdim", {{2, 3, 4}}, [](const In& x) { return cs::min(x[0], {1}, true); },
       "torch.amin(x[0], (1,), keepdim=True)"},
      {"argmax_flat", {{3, 4, 5}}, [](const In& x) { return cs::argmax(x[0]); }, "torch.argmax(x[0])", kExact, kNoGrad},
      {"argmax_dim", {{3, 4, 5}}, [](const In& x) { return cs::argmax(x[0], 1); }, "torch.argmax(x[0], 1)", kExact, kNoGrad},
      {"argmax_neg_keepdim", {{3, 4, 5}}, [](const In& x) { return cs::argmax(x[0], -1, true); },
       "torch.argmax(x[0], -1, keepdim=True)", kExact, kNoGrad},
      {"argmax_transposed", {{4, 3}}, [](const In& x) { return cs::argmax(x[0].t(), 1); }, "torch.argmax(x[0].t(), 1)",
       kExact, kNoGrad},
      {"argmax_ties_first", {vals({1, 3, 3, 0, 2, 2, 2, 1}, {2, 4})}, [](const In& x) { return cs::argmax(x[0], 1); },
       "torch.argmax(x[0], 1)", kExact, kNoGrad},
      {"var_all", {{2, 3, 4}}, [](const In& x) { return cs::var(x[0]); }, "torch.var(x[0])"},
      {"var_dim_corr0", {{2, 3, 4}}, [](const In& x) { return cs::var(x[0], {1}, 0); },
       "torch.var(x[0], (1,), correction=0)"},
      {"var_multi_keepdim", {{2, 3, 4}}, [](const In& x) { return cs::var(x[0], {0, 2}, 1, true); },
       "torch.var(x[0], (0, 2), correction=1, keepdim=True)"},
      {"var_transposed_offset", {uni({5, 3}, 100, 101)}, [](const In& x) { return cs::var(x[0].t(), {-1}); },
       "torch.var(x[0].t(), (-1,))"},
      {"logsumexp_dim", {{2, 3, 4}}, [](const In& x) { return cs::logsumexp(x[0], {1}); },
       "torch.logsumexp(x[0], (1,))"},
      {"logsumexp_multi_keepdim", {{2, 3, 4}}, [](const In& x) { return cs::logsumexp(x[0], {0, 2}, true); },
       "torch.logsumexp(x[0], (0, 2), keepdim=True)"},
      {"logsumexp_large", {uni({3, 5}, 80, 120)}, [](const In& x) { return cs::logsumexp(x[0], {-1}); },
       "torch.logsumexp(x[0], (-1,))"},
      {"logsumexp_transposed", {{4, 3}}, [](const In& x) { return cs::logsumexp(x[0].t(), {0}); },
       "torch.logsumexp(x[0].t(), (0,))"},
      {"norm_l2_all", {{2, 3, 4}}, [](const In& x) { return cs::norm(x[0]); }, "torch.linalg.vector_norm(x[0])"},
      {"norm_l1_dim", {{2, 3, 4}}, [](const In& x) { return cs::norm(x[0], 1, {1}); },
       "torch.linalg.vector_norm(x[0], 1, (1,))"},
      {"norm_p3_keepdim", {{2, 3, 4}}, [](const In& x) { return cs::norm(x[0], 3, {0, 2}, true); },
       "torch.linalg.vector_norm(x[0], 3, (0, 2), keepdim=True)"},
      {"norm_l2_transposed", {{4, 3}}, [](const In& x) { return cs::norm(x[0].t(), 2, {-1}); },
       "torch.linalg.vector_norm(x[0].t(), 2, (-1,))"},

      // ---------------------------------------------------------------- linear algebra
      {"matmul_2d", {{3, 4}, {4, 5}}, [](const In& x) { return cs::matmul(x[0], x[1]); }, "torch.matmul(x[0], x[1])"},
      {"matmul_batched", {{2, 3, 4}, {2, 4, 5}}, [](const In& x) { return cs::matmul(x[0], x[1]); },
       "torch.matmul(x[0], x[1])"},
      {"matmul_bcast_rhs_2d", {{2, 3, 4}, {4, 5}}, [](const In& x) { return cs::matmul(x[0], x[1]); },
       "torch.matmul(x[0], x[1])"},
      {"matmul_bcast_lhs_2d", {{3, 4}, {2, 4, 5}}, [](const In& x) { return cs::matmul(x[0], x[1]); },
       "torch.matmul(x[0], x[1])"},
      {"matmul_bcast_batch", {{2, 1, 3, 4}, {3, 4, 5}}, [](const In& x) { return cs::matmul(x[0], x[1]); },
       "torch.matmul(x[0], x[1])"},
      {"matmul_dot", {{6}, {6}}, [](const In& x) { return cs::matmul(x[0], x[1]); }, "torch.matmul(x[0], x[1])"},
      {"matmul_vec_mat", {{4}, {4, 5}}, [](const In& x) { return cs::matmul(x[0], x[1]); }, "torch.matmul(x[0], x[1])"},
      {"matmul_mat_vec", {{3, 4}, {4}}, [](const In& x) { return cs::matmul(x[0], x[1]); }, "torch.matmul(x[0], x[1])"},
      {"matmul_batched_vec", {{2, 3, 4}, {4}}, [](const In& x) { return cs::matmul(x[0], x[1]); },
       "torch.matmul(x[0], x[1])"},
      {"matmul_vec_batched", {{4}, {2, 4, 5}}, [](const In& x) { return cs::matmul(x[0], x[1]); },
       "torch.matmul(x[0], x[1])"},
      {"matmul_lhs_transposed", {{4, 3}, {4, 5}}, [](const In& x) { return cs::matmul(x[0].t(), x[1]); },
       "torch.matmul(x[0].t(), x[1])"},
      {"matmul_rhs_transposed", {{3, 4}, {5, 4}}, [](const In& x) { return cs::matmul(x[0], x[1].t()); },
       "torch.matmul(x[0], x[1].t())"},
      {"matmul_both_transposed_batched", {{2, 4, 3}, {2, 5, 4}},
       [](const In& x) { return cs::matmul(x[0].transpose(-1, -2), x[1].transpose(-2, -1)); },
       "torch.matmul(x[0].transpose(-1, -2), x[1].transpose(-2, -1))"},
      {"matmul_permuted_batch", {{3, 2, 4}, {4, 5}}, [](const In& x) { return cs::matmul(x[0].permute({1, 0, 2}), x[1]); },
       "torch.matmul(x[0].permute(1, 0, 2), x[1])"},
      {"matmul_k64", {{8, 64}, {64, 12}}, [](const In& x) { return cs::matmul(x[0], x[1]); },
       "torch.matmul(x[0], x[1])", kMatmul, kNormTol},
      {"matmul_k300", {{6, 300}, {300, 10}}, [](const In& x) { return cs::matmul(x[0], x[1]); },
       "torch.matmul(x[0], x[1])", kMatmul, kNormTol},
      {"matmul_k256_batched_transposed", {{2, 256, 5}, {7, 256}},
       [](const In& x) { return cs::matmul(x[0].transpose(1, 2), x[1].t()); },
       "torch.matmul(x[0].transpose(1, 2), x[1].t())", kMatmul, kNormTol},
      {"matmul_bf16", {typed({3, 8}, D::bf16), typed({8, 4}, D::bf16)},
       // f32 accumulation, one rounding (torch 1.13's CPU bf16 matmul rounds more often).
       [](const In& x) { return cs::matmul(x[0], x[1]); }, "torch.matmul(x[0].float(), x[1].float()).bfloat16()",
       kBf16, kNative | kNoGrad},
      {"linear_bias", {{4, 5}, {3, 5}, {3}}, [](const In& x) { return cs::linear(x[0], x[1], x[2]); },
       "F.linear(x[0], x[1], x[2])"},
      {"linear_no_bias", {{4, 5}, {3, 5}}, [](const In& x) { return cs::linear(x[0], x[1]); }, "F.linear(x[0], x[1])"},
      {"linear_3d_input", {{2, 4, 5}, {3, 5}, {3}}, [](const In& x) { return cs::linear(x[0], x[1], x[2]); },
       "F.linear(x[0], x[1], x[2])"},
      {"linear_1d_input", {{5}, {3, 5}, {3}}, [](const In& x) { return cs::linear(x[0], x[1], x[2]); },
       "F.linear(x[0], x[1], x[2])"},
      {"linear_transposed_weight", {{4, 5}, {5, 3}}, [](const In& x) { return cs::linear(x[0], x[1].t()); },
       "F.linear(x[0], x[1].t())"},
      {"linear_k128", {{16, 128}, {32, 128}, {32}}, [](const In& x) { return cs::linear(x[0], x[1], x[2]); },
       "F.linear(x[0], x[1], x[2])", kMatmul, kNormTol},
      // One output over 512 rows: the weight's gradient is a product of one row of a transposed
      // A (lda = 1) over K = 512, whose copy the own GEMM once read as rows along k.
      {"linear_one_output_512_rows", {{512, 32}, {1, 32}, {1}},
       [](const In& x) { return cs::linear(x[0], x[1], x[2]); }, "F.linear(x[0], x[1], x[2])", kMatmul, kNormTol},

      // ---------------------------------------------------------------- nn functions
      {"softmax_dim0", {{2, 3, 4}}, [](const In& x) { return cs::softmax(x[0], 0); }, "torch.softmax(x[0], 0)"},
      {"softmax_dim1", {{2, 3, 4}}, [](const In& x) { return cs::softmax(x[0], 1); }, "torch.softmax(x[0], 1)"},
      {"softmax_dim2", {{2, 3, 4}}, [](const In& x) { return cs::softmax(x[0], 2); }, "torch.softmax(x[0], 2)"},
      {"softmax_neg_dim", {{2, 3, 4}}, [](const In& x) { return cs::softmax(x[0], -1); }, "torch.softmax(x[0], -1)"},
      {"softmax_large", {uni({3, 5}, -200, 200)}, [](const In& x) { return cs::softmax(x[0], 1); },
       "torch.softmax(x[0], 1)"},
      {"softmax_transposed", {{4, 3}}, [](const In& x) { return cs::softmax(x[0].t(), 1); }, "torch.softmax(x[0].t(), 1)"},
      {"softmax_1d", {{7}}, [](const In& x) { return cs::softmax(x[0], 0); }, "torch.softmax(x[0], 0)"},
      {"log_softmax_dim0", {{2, 3, 4}}, [](const In& x) { return cs::log_softmax(x[0], 0); },
       "torch.log_softmax(x[0], 0)"},
      {"log_softmax_dim1", {{2, 3, 4}}, [](const In& x) { return cs::log_softmax(x[0], 1); },
       "torch.log_softmax(x[0], 1)"},
      {"log_softmax_dim2", {{2, 3, 4}}, [](const In& x) { return cs::log_softmax(x[0], 2); },
       "torch.log_softmax(x[0], 2)"},
      {"log_softmax_neg_dim", {{2, 3, 4}}, [](const In& x) { return cs::log_softmax(x[0], -2); },
       "torch.log_softmax(x[0], -2)"},
      {"log_softmax_large", {uni({3, 5}, -200, 200)}, [](const In& x) { return cs::log_softmax(x[0], 1); },
       "torch.log_softmax(x[0], 1)"},
      {"log_softmax_transposed", {{4, 3}}, [](const In& x) { return cs::log_softmax(x[0].t(), 0); },
       "torch.log_softmax(x[0].t(), 0)"},
      {"nll_loss_mean", {{5, 4}, idx({5}, 0, 4)}, [](const In& x) { return cs::nll_loss(x[0], x[1]); },
       "F.nll_loss(x[0], x[1])"},
      {"nll_loss_sum", {{5, 4}, idx({5}, 0, 4)},
       [](const In& x) { return cs::nll_loss(x[0], x[1], -100, cs::Reduction::Sum); },
       "F.nll_loss(x[0], x[1], reduction='sum')"},
      {"nll_loss_none", {{5, 4}, idx({5}, 0, 4)},
       [](const In& x) { return cs::nll_loss(x[0], x[1], -100, cs::Reduction::None); },
       "F.nll_loss(x[0], x[1], reduction='none')"},
      {"nll_loss_ignore_index", {{8, 3}, idx({8}, 0, 3)}, [](const In& x) { return cs::nll_loss(x[0], x[1], 1); },
       "F.nll_loss(x[0], x[1], ignore_index=1)"},
      {"nll_loss_ignore_default", {{4, 3}, vals({0, -100, 2, 1}, {4}, D::i64)},
       [](const In& x) { return cs::nll_loss(x[0], x[1], -100, cs::Reduction::Sum); },
       "F.nll_loss(x[0], x[1], reduction='sum')"},
      {"nll_loss_1d", {{4}, vals({2}, {}, D::i64)}, [](const In& x) { return cs::nll_loss(x[0], x[1]); },
       "F.nll_loss(x[0], x[1])"},
      {"nll_loss_spatial", {{3, 4, 2}, idx({3, 2}, 0, 4)}, [](const In& x) { return cs::nll_loss(x[0], x[1]); },
       "F.nll_loss(x[0], x[1])"},
      {"nll_loss_i32_target", {{5, 4}, idx({5}, 0, 4, D::i32)}, [](const In& x) { return cs::nll_loss(x[0], x[1]); },
       "F.nll_loss(x[0], x[1].long())"},
      {"cross_entropy_mean", {{5, 4}, idx({5}, 0, 4)}, [](const In& x) { return cs::cross_entropy(x[0], x[1]); },
       "F.cross_entropy(x[0], x[1])"},
      {"cross_entropy_sum", {{5, 4}, idx({5}, 0, 4)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1], -100, 0.0, cs::Reduction::Sum); },
       "F.cross_entropy(x[0], x[1], reduction='sum')"},
      {"cross_entropy_none", {{5, 4}, idx({5}, 0, 4)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1], -100, 0.0, cs::Reduction::None); },
       "F.cross_entropy(x[0], x[1], reduction='none')"},
      {"cross_entropy_ignore_index", {{8, 3}, idx({8}, 0, 3)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1], 2); }, "F.cross_entropy(x[0], x[1], ignore_index=2)"},
      {"cross_entropy_ignore_none", {{8, 3}, idx({8}, 0, 3)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1], 2, 0.0, cs::Reduction::None); },
       "F.cross_entropy(x[0], x[1], ignore_index=2, reduction='none')"},
      {"cross_entropy_smoothing_mean", {{5, 4}, idx({5}, 0, 4)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1], -100, 0.1); },
       "F.cross_entropy(x[0], x[1], label_smoothing=0.1)"},
      {"cross_entropy_smoothing_sum", {{5, 4}, idx({5}, 0, 4)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1], -100, 0.2, cs::Reduction::Sum); },
       "F.cross_entropy(x[0], x[1], label_smoothing=0.2, reduction='sum')"},
      {"cross_entropy_smoothing_none", {{5, 4}, idx({5}, 0, 4)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1], -100, 0.3, cs::Reduction::None); },
       "F.cross_entropy(x[0], x[1], label_smoothing=0.3, reduction='none')"},
      {"cross_entropy_smoothing_ignore", {{8, 3}, idx({8}, 0, 3)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1], 0, 0.1); },
       "F.cross_entropy(x[0], x[1], ignore_index=0, label_smoothing=0.1)"},
      {"cross_entropy_smoothing_ignore_sum", {{8, 3}, idx({8}, 0, 3)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1], 0, 0.1, cs::Reduction::Sum); },
       "F.cross_entropy(x[0], x[1], ignore_index=0, label_smoothing=0.1, reduction='sum')"},
      {"cross_entropy_spatial", {{3, 4, 2}, idx({3, 2}, 0, 4)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1]); }, "F.cross_entropy(x[0], x[1])"},
      {"cross_entropy_1d", {{4}, vals({3}, {}, D::i64)}, [](const In& x) { return cs::cross_entropy(x[0], x[1]); },
       "F.cross_entropy(x[0], x[1])"},
      {"cross_entropy_large_logits", {uni({4, 6}, -100, 100), idx({4}, 0, 6)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1]); }, "F.cross_entropy(x[0], x[1])"},
      {"cross_entropy_transposed", {{4, 5}, idx({5}, 0, 4)},
       [](const In& x) { return cs::cross_entropy(x[0].t(), x[1]); }, "F.cross_entropy(x[0].t(), x[1])"},
      {"mse_loss_mean", {{3, 4}, {3, 4}}, [](const In& x) { return cs::mse_loss(x[0], x[1]); }, "F.mse_loss(x[0], x[1])"},
      {"mse_loss_sum", {{3, 4}, {3, 4}}, [](const In& x) { return cs::mse_loss(x[0], x[1], cs::Reduction::Sum); },
       "F.mse_loss(x[0], x[1], reduction='sum')"},
      {"mse_loss_none", {{3, 4}, {3, 4}}, [](const In& x) { return cs::mse_loss(x[0], x[1], cs::Reduction::None); },
       "F.mse_loss(x[0], x[1], reduction='none')"},
      {"mse_loss_transposed", {{4, 3}, {3, 4}}, [](const In& x) { return cs::mse_loss(x[0].t(), x[1]); },
       "F.mse_loss(x[0].t(), x[1])"},
      {"mse_loss_target_nograd", {{3, 4}, nograd({3, 4})}, [](const In& x) { return cs::mse_loss(x[0], x[1]); },
       "F.mse_loss(x[0], x[1])"},
      {"layer_norm_affine", {{2, 3, 4}, {4}, {4}},
       [](const In& x) { return cs::layer_norm(x[0], {4}, x[1], x[2]); },
       "F.layer_norm(x[0], (4,), x[1], x[2])"},
      {"layer_norm_2d_shape", {{2, 3, 4}, {3, 4}, {3, 4}},
       [](const In& x) { return cs::layer_norm(x[0], {3, 4}, x[1], x[2]); },
       "F.layer_norm(x[0], (3, 4), x[1], x[2])"},
      {"layer_norm_no_affine", {{2, 3, 5}}, [](const In& x) { return cs::layer_norm(x[0], {5}); },
       "F.layer_norm(x[0], (5,))"},
      {"layer_norm_weight_only", {{4, 6}, {6}}, [](const In& x) { return cs::layer_norm(x[0], {6}, x[1]); },
       "F.layer_norm(x[0], (6,), x[1])"},
      {"layer_norm_eps", {{4, 6}, {6}, {6}}, [](const In& x) { return cs::layer_norm(x[0], {6}, x[1], x[2], 0.1); },
       "F.layer_norm(x[0], (6,), x[1], x[2], eps=0.1)"},
      {"layer_norm_transposed", {{4, 6}, {4}, {4}},
       [](const In& x) { return cs::layer_norm(x[0].t(), {4}, x[1], x[2]); },
       "F.layer_norm(x[0].t(), (4,), x[1], x[2])"},
      {"embedding", {idx({2, 3}, 0, 5), {5, 4}}, [](const In& x) { return cs::embedding(x[0], x[1]); },
       "F.embedding(x[0], x[1])"},
      {"embedding_repeats", {vals({1, 1, 3, 1, 0}, {5}, D::i64), {4, 3}},
       [](const In& x) { return cs::embedding(x[0], x[1]); }, "F.embedding(x[0], x[1])"},
      {"embedding_i32", {idx({4}, 0, 6, D::i32), {6, 2}}, [](const In& x) { return cs::embedding(x[0], x[1]); },
       "F.embedding(x[0].long(), x[1])"},
      {"dropout_eval", {{3, 4}}, [](const In& x) { return cs::dropout(x[0], 0.5, false); },
       "F.dropout(x[0], 0.5, training=False)"},
      {"dropout_p0", {{3, 4}}, [](const In& x) { return cs::dropout(x[0], 0.0, true); },
       "F.dropout(x[0], 0.0, training=True)"},

      // ---------------------------------------------------------------- fused attention
      // The reference is the explicit formula softmax(q k^T * scale + bias, masked) @ v.
      {"sdpa_basic", {{2, 3, 5, 4}, {2, 3, 7, 4}, {2, 3, 7, 6}},
       [](const In& x) { return cs::nn::functional::scaled_dot_product_attention(x[0], x[1], x[2]); },
       "torch.softmax(x[0] @ x[1].transpose(-1, -2) * 0.5, -1) @ x[2]"},
      {"sdpa_causal_odd", {{1, 2, 9, 5}, {1, 2, 9, 5}, {1, 2, 9, 3}},
       [](const In& x) {
         return cs::nn::functional::scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), 0, true);
       },
       "torch.softmax((x[0] @ x[1].transpose(-1, -2) * 5 ** -0.5).masked_fill("
       "~torch.ones(9, 9, dtype=torch.bool).tril(), float('-inf')), -1) @ x[2]"},
      {"sdpa_causal_tq_ne_tk", {{2, 1, 5, 4}, {2, 1, 7, 4}, {2, 1, 7, 4}},
       [](const In& x) {
         return cs::nn::functional::scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), 0, true);
       },
       "torch.softmax((x[0] @ x[1].transpose(-1, -2) * 0.5).masked_fill("
       "~torch.ones(5, 7, dtype=torch.bool).tril(), float('-inf')), -1) @ x[2]"},
      {"sdpa_key_padding_mask",
       {{2, 2, 3, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, vals({1, 1, 0, 1, 0, 1, 0, 1, 1, 1}, {2, 1, 1, 5}, D::boolean)},
       [](const In& x) { return cs::nn::functional::scaled_dot_product_attention(x[0], x[1], x[2], x[3]); },
       "torch.softmax((x[0] @ x[1].transpose(-1, -2) * 0.5).masked_fill(~x[3], float('-inf')), -1) @ x[2]"},
      {"sdpa_float_mask_grad", {{2, 3, 4, 4}, {2, 3, 6, 4}, {2, 3, 6, 5}, {1, 3, 4, 6}},
       [](const In& x) { return cs::nn::functional::scaled_dot_product_attention(x[0], x[1], x[2], x[3]); },
       "torch.softmax(x[0] @ x[1].transpose(-1, -2) * 0.5 + x[3], -1) @ x[2]"},
      {"sdpa_bias_mask_causal_scale",
       {{2, 2, 4, 3}, {2, 2, 6, 3}, {2, 2, 6, 2}, {2, 1, 4, 6},
        vals({1, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0}, {2, 1, 1, 6}, D::boolean)},
       [](const In& x) {
         cs::nn::functional::AttentionOptions o;
         o.bias = x[3];
         o.attn_mask = x[4];
         o.is_causal = true;
         o.causal_offset = 2;
         o.scale = 0.7;
         return cs::nn::functional::scaled_dot_product_attention(x[0], x[1], x[2], o);
       },
       "torch.softmax((x[0] @ x[1].transpose(-1, -2) * 0.7 + x[3]).masked_fill(~x[4], float('-inf'))"
       ".masked_fill(~torch.ones(4, 6, dtype=torch.bool).tril(2), float('-inf')), -1) @ x[2]"},
      // Several query blocks (64 rows) and key tiles (512 keys): online softmax and recomputed
      // statistics; sums over 520 keys (kLoose).
      {"sdpa_multi_tile_bias_causal", {{1, 2, 67, 8}, {1, 2, 520, 8}, {1, 2, 520, 3}, {1, 2, 67, 520}},
       [](const In& x) {
         cs::nn::functional::AttentionOptions o;
         o.bias = x[3];
         o.is_causal = true;
         o.causal_offset = 520 - 67;
         return cs::nn::functional::scaled_dot_product_attention(x[0], x[1], x[2], o);
       },
       "torch.softmax((x[0] @ x[1].transpose(-1, -2) * 8 ** -0.5 + x[3]).masked_fill("
       "~torch.ones(67, 520, dtype=torch.bool).tril(453), float('-inf')), -1) @ x[2]", kLoose},
      {"sdpa_heads_last", {{2, 5, 3, 4}, {2, 7, 3, 4}, {2, 7, 3, 6}},
       [](const In& x) {
         cs::nn::functional::AttentionOptions o;
         o.heads_last = true;
         return cs::nn::functional::scaled_dot_product_attention(x[0], x[1], x[2], o);
       },
       "(torch.softmax(x[0].transpose(1, 2) @ x[1].transpose(1, 2).transpose(-1, -2) * 0.5, -1) "
       "@ x[2].transpose(1, 2)).transpose(1, 2)"},

      // ---------------------------------------------------------------- shape and indexing
      {"reshape", {{2, 3, 4}}, [](const In& x) { return cs::reshape(x[0], {6, 4}); }, "x[0].reshape(6, 4)"},
      {"reshape_infer", {{2, 3, 4}}, [](const In& x) { return cs::reshape(x[0], {4, -1}); }, "x[0].reshape(4, -1)"},
      {"reshape_transposed", {{3, 4}}, [](const In& x) { return cs::reshape(x[0].t(), {2, 6}); },
       "x[0].t().reshape(2, 6)"},
      {"reshape_to_0d", {{1, 1}}, [](const In& x) { return cs::reshape(x[0], {}); }, "x[0].reshape(())"},
      {"reshape_i64", {idx({2, 3}, 0, 9)}, [](const In& x) { return x[0].reshape({3, 2}); }, "x[0].reshape(3, 2)",
       kExact, kNoGrad | kNative},
      {"view", {{2, 3, 4}}, [](const In& x) { return x[0].view({2, 12}); }, "x[0].view(2, 12)"},
      {"flatten_all", {{2, 3, 4}}, [](const In& x) { return cs::flatten(x[0]); }, "torch.flatten(x[0])"},
      {"flatten_from1", {{2, 3, 4, 2}}, [](const In& x) { return cs::flatten(x[0], 1); }, "torch.flatten(x[0], 1)"},
      {"flatten_range", {{2, 3, 4, 2}}, [](const In& x) { return x[0].flatten(1, 2); }, "x[0].flatten(1, 2)"},
      {"flatten_transposed", {{3, 4}}, [](const In& x) { return cs::flatten(x[0].t()); }, "torch.flatten(x[0].t())"},
      {"transpose", {{2, 3, 4}}, [](const In& x) { return cs::transpose(x[0], 0, 2); }, "torch.transpose(x[0], 0, 2)"},
      {"transpose_neg", {{2, 3, 4}}, [](const In& x) { return x[0].transpose(-1, -2); }, "x[0].transpose(-1, -2)"},
      {"t_method", {{3, 5}}, [](const In& x) { return x[0].t() * 1.0; }, "x[0].t() * 1.0"},
      {"permute", {{2, 3, 4}}, [](const In& x) { return cs::permute(x[0], {1, 2, 0}); }, "x[0].permute(1, 2, 0)"},
      {"permute_4d_neg", {{2, 3, 4, 2}}, [](const In& x) { return x[0].permute({-1, 0, 2, 1}); },
       "x[0].permute(-1, 0, 2, 1)"},
      {"permute_twice", {{2, 3, 4}}, [](const In& x) { return x[0].permute({2, 0, 1}).permute({0, 2, 1}); },
       "x[0].permute(2, 0, 1).permute(0, 2, 1)"},
      {"expand", {{3, 1}}, [](const In& x) { return cs::expand(x[0], {3, 4}); }, "x[0].expand(3, 4)"},
      {"expand_keep_new_dims", {{3, 1}}, [](const In& x) { return x[0].expand({2, -1, 5}); }, "x[0].expand(2, -1, 5)"},
      {"expand_0d", {{}}, [](const In& x) { return x[0].expand({2, 3}); }, "x[0].expand(2, 3)"},
      {"broadcast_to", {{1, 4}}, [](const In& x) { return cs::broadcast_to(x[0], {2, 3, 4}); },
       "torch.broadcast_to(x[0], (2, 3, 4))"},
      {"squeeze_all", {{2, 1, 3, 1}}, [](const In& x) { return cs::squeeze(x[0]); }, "torch.squeeze(x[0])"},
      {"squeeze_dim", {{2, 1, 3, 1}}, [](const In& x) { return cs::squeeze(x[0], 1); }, "torch.squeeze(x[0], 1)"},
      {"squeeze_neg_dim", {{2, 1, 3, 1}}, [](const In& x) { return x[0].squeeze(-1); }, "x[0].squeeze(-1)"},
      {"squeeze_non1_dim", {{2, 1, 3}}, [](const In& x) { return cs::squeeze(x[0], 0) * 1.0; },
       "torch.squeeze(x[0], 0) * 1.0"},
      {"unsqueeze_front", {{2, 3}}, [](const In& x) { return cs::unsqueeze(x[0], 0); }, "torch.unsqueeze(x[0], 0)"},
      {"unsqueeze_back", {{2, 3}}, [](const In& x) { return x[0].unsqueeze(-1); }, "x[0].unsqueeze(-1)"},
      {"unsqueeze_mid", {{2, 3}}, [](const In& x) { return x[0].unsqueeze(1); }, "x[0].unsqueeze(1)"},
      {"slice", {{5, 4}}, [](const In& x) { return cs::slice(x[0], 0, 1, 4); }, "x[0][1:4]"},
      {"slice_step", {{7, 4}}, [](const In& x) { return cs::slice(x[0], 0, 0, 7, 2); }, "x[0][0:7:2]"},
      {"slice_step3_dim1", {{3, 8}}, [](const In& x) { return cs::slice(x[0], 1, 1, 8, 3); }, "x[0][:, 1:8:3]"},
      {"slice_negative", {{3, 6}}, [](const In& x) { return cs::slice(x[0], -1, -4, -1); }, "x[0][:, -4:-1]"},
      {"slice_clamp", {{3, 6}}, [](const In& x) { return cs::slice(x[0], 1, 2, 100); }, "x[0][:, 2:100]"},
      {"slice_empty", {{3, 6}}, [](const In& x) { return cs::slice(x[0], 1, 4, 2); }, "x[0][:, 4:2]"},
      {"slice_transposed", {{6, 3}}, [](const In& x) { return cs::slice(x[0].t(), 1, 1, 6, 2); }, "x[0].t()[:, 1:6:2]"},
      {"split_equal", {{7, 3}}, [](const In& x) { return cs::split(x[0], 3, 0); }, "torch.split(x[0], 3, 0)"},
      {"split_sizes", {{2, 6}}, [](const In& x) { return cs::split(x[0], std::vector<int64_t>{1, 3, 2}, 1); },
       "torch.split(x[0], [1, 3, 2], 1)"},
      {"split_neg_dim", {{2, 3, 4}}, [](const In& x) { return cs::split(x[0], 2, -1); }, "torch.split(x[0], 2, -1)"},
      {"cat_dim0", {{2, 3}, {4, 3}}, [](const In& x) { return cs::cat({x[0], x[1]}, 0); }, "torch.cat([x[0], x[1]], 0)"},
      {"cat_neg_dim_three", {{2, 3}, {2, 1}, {2, 4}}, [](const In& x) { return cs::cat({x[0], x[1], x[2]}, -1); },
       "torch.cat([x[0], x[1], x[2]], -1)"},
      {"cat_transposed", {{3, 2}, {2, 4}}, [](const In& x) { return cs::cat({x[0].t(), x[1]}, 1); },
       "torch.cat([x[0].t(), x[1]], 1)"},
      {"cat_3d_mid", {{2, 1, 4}, {2, 3, 4}}, [](const In& x) { return cs::cat({x[0], x[1]}, 1); },
       "torch.cat([x[0], x[1]], 1)"},
      {"cat_i64", {idx({2}, 0, 9), idx({3}, 0, 9)}, [](const In& x) { return cs::cat({x[0], x[1]}); },
       "torch.cat([x[0], x[1]])", kExact, kNoGrad | kNative},
      {"stack_dim0", {{2, 3}, {2, 3}}, [](const In& x) { return cs::stack({x[0], x[1]}, 0); },
       "torch.stack([x[0], x[1]], 0)"},
      {"stack_dim1", {{2, 3}, {2, 3}, {2, 3}}, [](const In& x) { return cs::stack({x[0], x[1], x[2]}, 1); },
       "torch.stack([x[0], x[1], x[2]], 1)"},
      {"stack_neg_dim", {{2, 3}, {3, 2}}, [](const In& x) { return cs::stack({x[0], x[1].t()}, -1); },
       "torch.stack([x[0], x[1].t()], -1)"},
      {"index_select_dim0", {{5, 3}, idx({4}, 0, 5)}, [](const In& x) { return cs::index_select(x[0], 0, x[1]); },
       "torch.index_select(x[0], 0, x[1])"},
      {"index_select_dim1_repeats", {{3, 4}, vals({3, 0, 3, 3, 1}, {5}, D::i64)},
       [](const In& x) { return cs::index_select(x[0], 1, x[1]); }, "torch.index_select(x[0], 1, x[1])"},
      {"index_select_transposed", {{4, 3}, idx({5}, 0, 4)},
       [](const In& x) { return cs::index_select(x[0].t(), 1, x[1]); }, "torch.index_select(x[0].t(), 1, x[1])"},
      {"index_select_i32", {{5, 3}, idx({4}, 0, 5, D::i32)}, [](const In& x) { return cs::index_select(x[0], 0, x[1]); },
       "torch.index_select(x[0], 0, x[1])"},
      {"gather_dim0", {{4, 3}, idx({5, 3}, 0, 4)}, [](const In& x) { return cs::gather(x[0], 0, x[1]); },
       "torch.gather(x[0], 0, x[1])"},
      {"gather_dim1", {{3, 5}, idx({3, 4}, 0, 5)}, [](const In& x) { return cs::gather(x[0], 1, x[1]); },
       "torch.gather(x[0], 1, x[1])"},
      {"gather_3d_neg_dim", {{2, 3, 4}, idx({2, 3, 2}, 0, 4)}, [](const In& x) { return cs::gather(x[0], -1, x[1]); },
       "torch.gather(x[0], -1, x[1])"},
      {"scatter_add_dim0", {{3, 4}, idx({5, 4}, 0, 3), {5, 4}},
       [](const In& x) { return cs::scatter_add(x[0], 0, x[1], x[2]); }, "torch.scatter_add(x[0], 0, x[1], x[2])"},
      // torch 1.13 cannot differentiate src when index is smaller than src; src is no-grad here.
      {"scatter_add_dim1_smaller_index", {{3, 4}, idx({2, 3}, 0, 4), nograd({3, 5})},
       [](const In& x) { return cs::scatter_add(x[0], 1, x[1], x[2]); }, "torch.scatter_add(x[0], 1, x[1], x[2])"},
      {"index_add_dim0", {{4, 3}, vals({0, 2, 0, 3, 0}, {5}, D::i64), {5, 3}},
       [](const In& x) { return cs::index_add(x[0], 0, x[1], x[2]); }, "torch.index_add(x[0], 0, x[1], x[2])"},
      {"index_add_dim1", {{3, 4}, idx({6}, 0, 4), {3, 6}},
       [](const In& x) { return cs::index_add(x[0], 1, x[1], x[2]); }, "torch.index_add(x[0], 1, x[1], x[2])"},
      {"masked_fill", {{3, 4}, mask({3, 4})}, [](const In& x) { return cs::masked_fill(x[0], x[1], -1.5); },
       "torch.masked_fill(x[0], x[1], -1.5)"},
      {"masked_fill_bcast_mask", {{2, 3, 4}, mask({3, 1})}, [](const In& x) { return cs::masked_fill(x[0], x[1], 2.0); },
       "torch.masked_fill(x[0], x[1], 2.0)"},
      {"masked_fill_neg_inf_softmax", {{3, 4}, vals({0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1}, {3, 4}, D::boolean)},
       [](const In& x) { return cs::softmax(cs::masked_fill(x[0], x[1], -INFINITY), -1); },
       "torch.softmax(torch.masked_fill(x[0], x[1], float('-inf')), -1)"},
      {"triu", {{4, 5}}, [](const In& x) { return cs::triu(x[0]); }, "torch.triu(x[0])"},
      {"triu_diag1_batched", {{2, 4, 4}}, [](const In& x) { return cs::triu(x[0], 1); }, "torch.triu(x[0], 1)"},
      {"triu_neg_diag", {{5, 3}}, [](const In& x) { return cs::triu(x[0], -2); }, "torch.triu(x[0], -2)"},
      {"tril", {{4, 5}}, [](const In& x) { return cs::tril(x[0]); }, "torch.tril(x[0])"},
      {"tril_neg_diag_batched", {{2, 3, 4}}, [](const In& x) { return cs::tril(x[0], -1); }, "torch.tril(x[0], -1)"},
      {"tril_transposed", {{5, 4}}, [](const In& x) { return cs::tril(x[0].t(), 2); }, "torch.tril(x[0].t(), 2)"},
      {"sum_to", {{2, 3, 4}}, [](const In& x) { return cs::sum_to(x[0], {3, 1}); }, "x[0].sum_to_size(3, 1)"},
      {"sum_to_leading", {{2, 3, 4}}, [](const In& x) { return cs::sum_to(x[0], {4}); }, "x[0].sum(dim=(0, 1))"},

      // ---------------------------------------------------------------- edge cases
      {"exp_overflow", {vals({100, -100, 0, 88.7}, {4})}, [](const In& x) { return cs::exp(x[0]); }, "torch.exp(x[0])"},
      {"log_zero_neg", {vals({0, 1, -1, 2}, {4})}, [](const In& x) { return cs::log(x[0]); }, "torch.log(x[0])"},
      {"sqrt_zero", {vals({0, 4, 0.25}, {3})}, [](const In& x) { return cs::sqrt(x[0]); }, "torch.sqrt(x[0])"},
      {"div_by_zero", {vals({1, -1, 0, 2}, {4}), vals({0, 0, 0, -0.0}, {4})},
       [](const In& x) { return cs::div(x[0], x[1]); }, "x[0] / x[1]", kExact, kNoGrad},
      {"relu_at_zero", {vals({0, -0.0, 1, -1}, {4})}, [](const In& x) { return cs::relu(x[0]); }, "torch.relu(x[0])"},
      {"abs_at_zero", {vals({0, -0.0, 1, -1}, {4})}, [](const In& x) { return cs::abs(x[0]); }, "torch.abs(x[0])"},
      {"maximum_ties", {vals({1, 2, 3, -1}, {4}), vals({1, 0, 3, -1}, {4})},
       [](const In& x) { return cs::maximum(x[0], x[1]); }, "torch.maximum(x[0], x[1])"},
      {"minimum_ties", {vals({1, 2, 3, -1}, {4}), vals({1, 0, 3, -1}, {4})},
       [](const In& x) { return cs::minimum(x[0], x[1]); }, "torch.minimum(x[0], x[1])"},
      {"clamp_at_bounds", {vals({-0.5, 0.5, 0.7, -1, 1, 0.6}, {6})},
       [](const In& x) { return cs::clamp(x[0], -0.5, 0.5); }, "torch.clamp(x[0], -0.5, 0.5)"},
      {"amax_ties", {vals({1, 3, 3, 0, 2, 2, 2, 1}, {2, 4})}, [](const In& x) { return cs::amax(x[0], {1}); },
       "torch.amax(x[0], (1,))"},
      {"amin_ties_all", {vals({1, 0, 3, 0, 2, 0}, {2, 3})}, [](const In& x) { return cs::amin(x[0]); },
       "torch.amin(x[0])"},
      {"norm_zero_vector", {vals({0, 0, 0, 1, 2, 2}, {2, 3})}, [](const In& x) { return cs::norm(x[0], 2, {1}); },
       "torch.linalg.vector_norm(x[0], 2, (1,))"},
      {"cross_entropy_all_ignored", {{3, 4}, vals({1, 1, 1}, {3}, D::i64)},
       [](const In& x) { return cs::cross_entropy(x[0], x[1], 1); }, "F.cross_entropy(x[0], x[1], ignore_index=1)"},
      {"var_single_element", {{3, 1}}, [](const In& x) { return cs::var(x[0], {1}); }, "torch.var(x[0], (1,))",
       kExact, kNoGrad},
      {"add_empty", {{0, 3}, {3}}, [](const In& x) { return cs::add(x[0], x[1]); }, "x[0] + x[1]"},
      {"sum_empty", {{0, 3}}, [](const In& x) { return cs::sum(x[0], {0}); }, "torch.sum(x[0], (0,))"},
      {"cat_empty", {{0, 3}, {2, 3}}, [](const In& x) { return cs::cat({x[0], x[1]}, 0); }, "torch.cat([x[0], x[1]], 0)"},
      {"matmul_empty_k", {{2, 0}, {0, 3}}, [](const In& x) { return cs::matmul(x[0], x[1]); }, "torch.matmul(x[0], x[1])"},
      {"exp_0d", {{}}, [](const In& x) { return cs::exp(x[0]); }, "torch.exp(x[0])"},
      {"softmax_0d", {{}}, [](const In& x) { return cs::softmax(x[0], 0); }, "torch.softmax(x[0], 0)"},

      // ---------------------------------------------------------------- 16-bit floats with grads
      {"mul_bf16_grad", {typed({3, 4}, D::bf16), typed({4}, D::bf16)}, [](const In& x) { return cs::mul(x[0], x[1]); },
       "x[0] * x[1]", kBf16, kNative},
      {"relu_bf16_grad", {typed({3, 4}, D::bf16)}, [](const In& x) { return cs::relu(x[0]); }, "torch.relu(x[0])",
       kExact, kNative},
      {"sum_bf16", {typed(uni({4, 8}, 0, 1), D::bf16)}, [](const In& x) { return cs::sum(x[0], {1}); },
       "torch.sum(x[0], (1,))", kBf16, kNative},
      {"softmax_bf16", {typed({3, 5}, D::bf16)}, [](const In& x) { return cs::softmax(x[0], -1); },
       "torch.softmax(x[0], -1)", {2.0 / 128, 1e-3}, kNative},
      {"exp_f16", {typed(uni({3, 4}, -3, 3), D::f16)}, [](const In& x) { return cs::exp(x[0]); }, "torch.exp(x[0].float()).half()",  // torch has no f16 exp on CPU
       kF16, kNative},

      // ---------------------------------------------------------------- large (parallel kernel paths)
      {"add_bcast_large", {{70, 1031}, {1031}}, [](const In& x) { return cs::add(x[0], x[1]); }, "x[0] + x[1]"},
      {"gelu_large", {{70001}}, [](const In& x) { return cs::gelu(x[0]); }, "F.gelu(x[0])"},
      {"mul_transposed_large", {{300, 257}, {257, 300}}, [](const In& x) { return cs::mul(x[0], x[1].t()); },
       "x[0] * x[1].t()"},
      {"sum_dim0_large", {{301, 299}}, [](const In& x) { return cs::sum(x[0], {0}); }, "torch.sum(x[0], (0,))", kLoose},
      {"mean_dim1_large", {{299, 301}}, [](const In& x) { return cs::mean(x[0], {1}); }, "torch.mean(x[0], (1,))"},
      {"amax_large", {{257, 301}}, [](const In& x) { return cs::amax(x[0], {0}); }, "torch.amax(x[0], (0,))"},
      {"softmax_large_rows", {{257, 300}}, [](const In& x) { return cs::softmax(x[0], -1); }, "torch.softmax(x[0], -1)"},
      {"log_softmax_large_cols", {{300, 257}}, [](const In& x) { return cs::log_softmax(x[0], 0); },
       "torch.log_softmax(x[0], 0)"},
      {"layer_norm_large", {{128, 520}, {520}, {520}},
       [](const In& x) { return cs::layer_norm(x[0], {520}, x[1], x[2]); }, "F.layer_norm(x[0], (520,), x[1], x[2])",
       kLoose},
      // The fused LayerNorm kernels' other paths: no weight (dx from dy alone) over rows longer
      // than one f32 block of the row sums; gradients of the parameters alone; a bias alone.
      {"layer_norm_no_affine_large", {{96, 300}}, [](const In& x) { return cs::layer_norm(x[0], {300}); },
       "F.layer_norm(x[0], (300,))", kLoose},
      {"layer_norm_params_only", {nograd({5, 3, 8}), {8}, {8}},
       [](const In& x) { return cs::layer_norm(x[0], {8}, x[1], x[2]); }, "F.layer_norm(x[0], (8,), x[1], x[2])"},
      {"layer_norm_bias_only", {{4, 6}, {6}},
       [](const In& x) { return cs::layer_norm(x[0], {6}, Tensor(), x[1]); },
       "F.layer_norm(x[0], (6,), None, x[1])"},

      // ---------------------------------------------------------------- compositions
      {"attention_like", {{2, 3, 4}, {2, 5, 4}, {2, 5, 4}},
       [](const In& x) {
         Tensor s = cs::matmul(x[0], x[1].transpose(1, 2)) / 2.0;
         return cs::matmul(cs::softmax(s, -1), x[2]);
       },
       "torch.matmul(torch.softmax(torch.matmul(x[0], x[1].transpose(1, 2)) / 2.0, -1), x[2])"},
      {"mlp_like", {{4, 5}, {6, 5}, {6}, {3, 6}, idx({4}, 0, 3)},
       [](const In& x) { return cs::cross_entropy(cs::linear(cs::relu(cs::linear(x[0], x[1], x[2])), x[3]), x[4]); },
       "F.cross_entropy(F.linear(torch.relu(F.linear(x[0], x[1], x[2])), x[3]), x[4])"},
      // Shapes at which the CPU's own GEMM applies epilogues (AVX-512 builds): traced, relu(linear)
      // becomes a gemm node (the compiler's fuse_gemm_epilogue).
      {"mlp_gemm_epilogues", {{16, 12}, {20, 12}, {20}, {8, 20}},
       [](const In& x) { return cs::linear(cs::relu(cs::linear(x[0], x[1], x[2])), x[3]); },
       "F.linear(torch.relu(F.linear(x[0], x[1], x[2])), x[3])"},
      {"reuse_input", {{3, 4}}, [](const In& x) { return x[0] * x[0] + cs::exp(x[0]) - x[0].t().t(); },
       "x[0] * x[0] + torch.exp(x[0]) - x[0].t().t()"},
      {"cat_same_twice", {{2, 3}}, [](const In& x) { return cs::cat({x[0], x[0].t().t(), x[0]}, 1); },
       "torch.cat([x[0], x[0], x[0]], 1)"},
      {"slice_reshape_permute", {{4, 6, 2}},
       [](const In& x) { return cs::exp(cs::slice(x[0], 1, 0, 6, 2).reshape({4, 6}).t()); },
       "torch.exp(x[0][:, 0:6:2].reshape(4, 6).t())"},
      {"expand_then_mul_reduce", {{3, 1}, {1, 4}}, [](const In& x) { return cs::sum(x[0].expand({3, 4}) * x[1], {0}); },
       "torch.sum(x[0].expand(3, 4) * x[1], (0,))"},
      {"log_softmax_nll_eq_ce", {{5, 4}, idx({5}, 0, 4)},
       [](const In& x) { return cs::nll_loss(cs::log_softmax(x[0], 1), x[1]) - cs::cross_entropy(x[0], x[1]) + cs::mean(x[0]); },
       "F.nll_loss(torch.log_softmax(x[0], 1), x[1]) - F.cross_entropy(x[0], x[1]) + torch.mean(x[0])"},
      {"transformer_block_like", {{2, 3, 8}, {8}, {8}, {16, 8}, {16}, {8, 16}},
       [](const In& x) {
         Tensor h = cs::layer_norm(x[0], {8}, x[1], x[2]);
         h = cs::linear(cs::gelu(cs::linear(h, x[3], x[4]), true), x[5]);
         return x[0] + h;
       },
       "x[0] + F.linear(F.gelu(F.linear(F.layer_norm(x[0], (8,), x[1], x[2]), x[3], x[4]), approximate='tanh'), x[5])",
       kLoose},
      {"causal_attention_like", {{2, 4, 3}, {2, 4, 3}, {2, 4, 3}},
       [](const In& x) {
         Tensor s = cs::matmul(x[0], x[1].transpose(-1, -2)) * 0.5;
         Tensor m = cs::triu(cs::ones({4, 4}, D::f32, x.device), 1) > 0.5;
         return cs::matmul(cs::softmax(cs::masked_fill(s, m, -INFINITY), -1), x[2]);
       },
       "torch.matmul(torch.softmax(torch.masked_fill(torch.matmul(x[0], x[1].transpose(-1, -2)) * 0.5, "
       "torch.triu(torch.ones(4, 4), 1) > 0.5, float('-inf')), -1), x[2])"},
      // Activation recomputation: the gradient re-runs the function (Recompute, RecomputeBarrier).
      {"checkpoint_reads_outside_weight", {{3, 4}, {5, 4}},
       [](const In& x) {
         Tensor w = x[1];
         return cs::checkpoint([w](const Tensor& t) { return cs::gelu(cs::linear(t, w)) * 0.5; }, x[0]);
       },
       "F.gelu(F.linear(x[0], x[1])) * 0.5"},
      {"softmax_dim_size1", {{3, 1}}, [](const In& x) { return cs::softmax(x[0], 1) * x[0]; },
       "torch.softmax(x[0], 1) * x[0]"},
      {"var_mean_norm_chain", {{4, 5}},
       [](const In& x) { return (x[0] - cs::mean(x[0], {1}, true)) * cs::rsqrt(cs::var(x[0], {1}, 0, true) + 1e-5); },
       "(x[0] - torch.mean(x[0], (1,), keepdim=True)) * torch.rsqrt(torch.var(x[0], (1,), correction=0, keepdim=True) + 1e-5)"},
  };
}
// clang-format on

// ------------------------------------------------------------------------------------------
// Random-shape rows (fixed seed, so they are the same every run): broadcasting binary ops,
// reductions over random dim subsets, softmax over a random dim and broadcast batched matmul,
// each with its first input permuted (stored in another layout and permuted back before the op).

std::string tuple_str(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i)
    s += std::to_string(v[i]) + (i + 1 < v.size() || v.size() == 1 ? ", " : "");
  return s + ")";
}

Shape random_shape(Rng& rng, int64_t min_rank, int64_t max_rank, int64_t max_dim) {
  Shape s(static_cast<size_t>(rng.integer(min_rank, max_rank + 1)));
  for (auto& d : s) d = rng.integer(2, max_dim + 1);  // broadcasting rows set some to 1
  return s;
}

// A random permutation `perm` and the stored shape whose permute(perm) is `s`.
std::pair<std::vector<int64_t>, Shape> random_layout(Rng& rng, const Shape& s) {
  std::vector<int64_t> perm(s.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  for (size_t i = perm.size(); i > 1; --i)
    std::swap(perm[i - 1], perm[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(i)))]);
  Shape stored(s.size());
  for (size_t i = 0; i < s.size(); ++i) stored[static_cast<size_t>(perm[i])] = s[i];
  return {perm, stored};
}

void add_random_shape_rows(std::vector<Row>& t) {
  Rng rng(0x5eed);
  using Bin = Tensor (*)(const Tensor&, const Tensor&);
  const std::vector<std::tuple<std::string, Bin, std::string>> bins = {
      {"add", &cs::add, "torch.add"},
      {"sub", &cs::sub, "torch.sub"},
      {"mul", &cs::mul, "torch.mul"},
      {"div", &cs::div, "torch.div"},
      {"maximum", &cs::maximum, "torch.maximum"},
      {"minimum", &cs::minimum, "torch.minimum"}};
  for (int k = 0; k < 18; ++k) {
    auto& [name, fn, py] = bins[static_cast<size_t>(k) % bins.size()];
    Shape out = random_shape(rng, 1, 4, 5);
    Shape a = out, b(out.begin() + rng.integer(0, static_cast<int64_t>(out.size())), out.end());
    for (auto& d : a)
      if (rng.uniform() < 0.25) d = 1;
    for (auto& d : b)
      if (rng.uniform() < 0.25) d = 1;
    if (k % 2) std::swap(a, b);  // the broadcast operand on either side
    auto [perm, stored] = random_layout(rng, a);
    Arg rhs = name == "div" ? nz(b) : Arg(b);
    Bin f = fn;
    t.push_back({"rand_" + name + "_" + std::to_string(k),
                 {Arg(stored), rhs},
                 [f, perm = perm](const In& x) { return f(x[0].permute(perm), x[1]); },
                 py + "(x[0].permute" + tuple_str(perm) + ", x[1])"});
  }
  const std::vector<std::string> reds = {"sum", "mean", "amax", "var", "logsumexp", "norm"};
  for (int k = 0; k < 18; ++k) {
    const std::string& op = reds[static_cast<size_t>(k) % reds.size()];
    Shape s = random_shape(rng, 1, 4, 5);
    auto [perm, stored] = random_layout(rng, s);
    int64_t r = static_cast<int64_t>(s.size());
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < r; ++d)
      if (rng.uniform() < 0.5) dims.push_back(rng.uniform() < 0.5 ? d - r : d);
    if (dims.empty()) dims.push_back(rng.integer(-r, r));
    bool keep = rng.uniform() < 0.5;
    int64_t reduced = 1;
    for (auto d : dims) reduced *= s[static_cast<size_t>((d + r) % r)];
    double corr = reduced > 1 ? 1 : 0;
    std::string kd = keep ? "True" : "False", ds = tuple_str(dims);
    std::string x0 = "x[0].permute" + tuple_str(perm);
    std::string py =
        op == "var" ? "torch.var(" + x0 + ", " + ds + ", correction=" + std::to_string(int(corr)) +
                          ", keepdim=" + kd + ")"
        : op == "norm" ? "torch.linalg.vector_norm(" + x0 + ", 2, " + ds + ", keepdim=" + kd + ")"
                       : "torch." + op + "(" + x0 + ", " + ds + ", keepdim=" + kd + ")";
    t.push_back({"rand_" + op + "_" + std::to_string(k),
                 {Arg(stored)},
                 [op, perm = perm, dims, keep, corr](const In& x) {
                   Tensor a = x[0].permute(perm);
                   if (op == "sum") return cs::sum(a, dims, keep);
                   if (op == "mean") return cs::mean(a, dims, keep);
                   if (op == "amax") return cs::amax(a, dims, keep);
                   if (op == "var") return cs::var(a, dims, corr, keep);
                   if (op == "logsumexp") return cs::logsumexp(a, dims, keep);
                   return cs::norm(a, 2, dims, keep);
                 },
                 py});
  }
  for (int k = 0; k < 6; ++k) {
    Shape s = random_shape(rng, 1, 4, 5);
    auto [perm, stored] = random_layout(rng, s);
    int64_t r = static_cast<int64_t>(s.size()), dim = rng.integer(-r, r);
    bool log = k % 2;
    t.push_back({std::string(log ? "rand_log_softmax_" : "rand_softmax_") + std::to_string(k),
                 {Arg(stored)},
                 [perm = perm, dim, log](const In& x) {
                   Tensor a = x[0].permute(perm);
                   return log ? cs::log_softmax(a, dim) : cs::softmax(a, dim);
                 },
                 std::string(log ? "torch.log_softmax(" : "torch.softmax(") + "x[0].permute" +
                     tuple_str(perm) + ", " + std::to_string(dim) + ")"});
  }
  for (int k = 0; k < 8; ++k) {
    int64_t m = rng.integer(1, 6), kk = rng.integer(1, 7), n = rng.integer(1, 6);
    Shape batch = random_shape(rng, 0, 2, 3);
    Shape ba = batch,
          bb(batch.begin() + rng.integer(0, static_cast<int64_t>(batch.size()) + 1), batch.end());
    for (auto& d : ba)
      if (rng.uniform() < 0.25) d = 1;
    Shape a = ba, b = bb;
    a.push_back(m), a.push_back(kk);
    b.push_back(kk), b.push_back(n);
    if (k == 6) a = {kk};  // 1-d operands
    if (k == 7) b = {kk};
    auto [perm, stored] = random_layout(rng, a);
    t.push_back({"rand_matmul_" + std::to_string(k),
                 {Arg(stored), Arg(b)},
                 [perm = perm](const In& x) { return cs::matmul(x[0].permute(perm), x[1]); },
                 "torch.matmul(x[0].permute" + tuple_str(perm) + ", x[1])"});
  }
}

}  // namespace

const std::vector<Row>& op_table() {
  static const std::vector<Row> table = [] {
    auto t = make_table();
    add_random_shape_rows(t);
    return t;
  }();
  return table;
}

}  // namespace cstorch::reftest
