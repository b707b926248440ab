// The CUDA kernel table: one `cuda_<Name>` per line of cuda_ops.def. Each reads its node (shapes,
// dtypes, attributes) on the host, queues its kernel(s) on the backend's stream through the plain
// launch functions of ../kernels/launch.h, and checks the launch. Products go through cuBLASLt
// (gemm below). Nothing here allocates device memory: scratch is the planned workspace.
#include <cstdlib>

#include "backend/cuda/runtime/kernel_util.h"

namespace cstorch::cuda {

namespace {

using ir::KernelContext;
using ir::Node;

k::Bcast bcast(const Node& n) {
  k::Bcast b;
  b.rank = static_cast<int>(n.shape.size());
  const int64_t total = n.numel();
  b.small = total <= 0x7fffffff;
  for (int d = 0; d < b.rank; ++d) b.shape[d] = n.shape[d];
  for (size_t i = 0; i < n.inputs.size() && i < 3; ++i) {
    const Shape& s = n.inputs[i]->shape;
    if (n.inputs[i]->numel() != total) b.contiguous = false;
    int64_t stride = 1;
    for (int d = b.rank - 1; d >= 0; --d) {
      const int k = d - (b.rank - static_cast<int>(s.size()));
      const int64_t sz = k >= 0 ? s[k] : 1;
      b.strides[i][d] = sz == 1 ? 0 : stride;
      stride *= sz;
    }
  }
  return b;
}

struct View {
  int64_t outer = 1, r = 1, inner = 1;
};
// x viewed as [outer, r, inner] for a reduction over `dims` (sorted, one contiguous run; empty:
// every dim).
View reduce_view(const Shape& s, const ir::Dims& dims) {
  View v;
  if (dims.empty()) {
    v.r = cstorch::numel(s);
    return v;
  }
  for (int64_t d = 0; d < static_cast<int64_t>(s.size()); ++d) {
    if (d < dims.front())
      v.outer *= s[d];
    else if (d <= dims.back())
      v.r *= s[d];
    else
      v.inner *= s[d];
  }
  return v;
}
View dim_view(const Shape& s, int64_t dim) {
  View v;
  if (s.empty()) return v;
  for (int64_t i = 0; i < dim; ++i) v.outer *= s[i];
  v.r = s[dim];
  for (size_t i = dim + 1; i < s.size(); ++i) v.inner *= s[i];
  return v;
}
View loss_view(const Shape& lp) {
  View v;
  if (lp.size() == 1) {
    v.r = lp[0];
    return v;
  }
  v.outer = lp[0];
  v.r = lp[1];
  for (size_t i = 2; i < lp.size(); ++i) v.inner *= lp[i];
  return v;
}

// A launch function's refusal of an element type: cuda_ops.def and the kernels disagree.
void launched(bool ok, const CudaBackend& b, const Node& n) {
  CS_CHECK(ok, "op '{}' on device GPU:{}: no CUDA kernel instance for dtype {}", n.name(),
           b.index(), dtype_name(n.dtype));
  b.check_launch(n.name());
}

template <k::Unary op>
void unary(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  launched(k::unary(op, ty(n.dtype, n.name()), in[0], out, n.numel(), b.stream()), b, n);
}

template <k::Binary op>
void binary(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const bool scalar_exponent =
      op == k::Binary::Pow && n.inputs[1]->numel() == 1 && n.inputs[0]->numel() == n.numel();
  launched(k::binary(op, ty(n.dtype, n.name()), bcast(n), in[0], in[1], out, n.numel(), b.stream(),
                     scalar_exponent),
           b, n);
}

template <k::Logic op>
void logical(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  k::logical(op, ty(n.inputs[0]->dtype, n.name()), bcast(n), in[0], in[1], static_cast<bool*>(out),
             n.numel(), b.stream());
  b.check_launch(n.name());
}

template <k::Cmp op>
void compare(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  k::compare(op, ty(n.inputs[0]->dtype, n.name()), bcast(n), in[0], in[1], static_cast<bool*>(out),
             n.numel(), b.stream());
  b.check_launch(n.name());
}

template <k::Reduce op>
void reduce(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const View v = reduce_view(n.inputs[0]->shape, n.attr<ir::AxesAttrs>().dims);
  launched(k::reduce(op, ty(n.dtype, n.name()), in[0], out, v.outer, v.r, v.inner, b.stream()), b,
           n);
}

template <class Attrs>
void reduce_stat(const KernelContext& ctx, const Node& n, const void* const* in, void* out,
                 k::Stat op, double param) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const View v = reduce_view(n.inputs[0]->shape, n.attr<Attrs>().dims);
  k::reduce_stat(op, param, f(in[0]), static_cast<float*>(out), v.outer, v.r, v.inner, b.stream());
  b.check_launch(n.name());
}

int reduction_code(ir::Reduction r) {
  return r == ir::Reduction::None ? 0 : r == ir::Reduction::Mean ? 1 : 2;
}

// ---- cuBLASLt ----

size_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return low < 256 ? low : 256;
}

bool tf32_allowed() {
  // Off by default: fp32 products are true fp32 (as the CPU's), so results compare at 1e-5.
  static const bool on = [] {
    const char* e = std::getenv("CSTORCH_CUDA_TF32");
    return e && std::string(e) == "1";
  }();
  return on;
}

// The cuBLASLt element type of a product's operand dtype (f32, bf16, f16).
cudaDataType_t lt_type(DType t) {
  return t == DType::bf16 ? CUDA_R_16BF : t == DType::f16 ? CUDA_R_16F : CUDA_R_32F;
}

// C[batch][m, n] = op(A)[m, k] @ op(B)[k, n], all row-major; stride_a / stride_b are the
// elements between batches (0: one matrix shared by every batch). cuBLASLt is column-major, so
// it computes C^T = op(B)^T @ op(A)^T: the row-major buffers read as their transposes. A and B
// are of ab (f32, bf16 or f16), C of c (ab, or f32 for 16-bit operands); the products are
// summed in fp32 (CUBLAS_COMPUTE_32F, fp32 alpha and beta) and C is rounded once, as the CPU's
// 16-bit products widen to f32, multiply in f32 and narrow the result. No epilogue: a bias is
// added by a separate kernel (fp32 epilogue support varies by version).
void gemm(const CudaBackend& be, const char* opname, const void* A, const void* B, void* C,
          int64_t m, int64_t n, int64_t kk, bool trans_a, bool trans_b, int64_t batch,
          int64_t stride_a, int64_t stride_b, cudaDataType_t ab = CUDA_R_32F,
          cudaDataType_t c = CUDA_R_32F) {
  const int dev = be.index();
  void* const ws = be.gemm_workspace();
  const size_t ws_bytes = be.gemm_workspace_bytes();
  // TF32 applies to f32 operands only: 16-bit operands are always summed in full fp32.
  const bool tf32 = ab == CUDA_R_32F && tf32_allowed();
  // cuBLASLt assumes 256-byte aligned operands unless told otherwise, and planned arena offsets
  // may be less aligned: the alignments are part of the plan's key.
  const CudaBackend::GemmKey key{m,
                                 n,
                                 kk,
                                 batch,
                                 stride_a,
                                 stride_b,
                                 trans_a,
                                 trans_b,
                                 tf32,
                                 static_cast<uint32_t>(alignment(A)),
                                 static_cast<uint32_t>(alignment(B)),
                                 static_cast<uint32_t>(alignment(C)),
                                 static_cast<int>(ab),
                                 static_cast<int>(c)};
  std::lock_guard<std::mutex> l(be.gemm_mu());
  auto& plans = be.gemm_plans();
  auto it = plans.find(key);
  if (it == plans.end()) {
    auto plan = std::make_unique<CudaBackend::GemmPlan>();
    auto& p = *plan;
    check_cublas(cublasLtMatmulDescCreate(
                     &p.op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 dev, "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // lt's A is our B
    const cublasOperation_t tb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // lt's B is our A
    check_cublas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta),
                 dev, "cublasLtMatmulDescSetAttribute(TRANSA)");
    check_cublas(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb),
                 dev, "cublasLtMatmulDescSetAttribute(TRANSB)");
    auto layout = [&](cublasLtMatrixLayout_t* L, cudaDataType_t type, int64_t rows, int64_t cols,
                      int64_t stride) {
      check_cublas(cublasLtMatrixLayoutCreate(L, type, static_cast<uint64_t>(rows),
                                              static_cast<uint64_t>(cols), rows),
                   dev, "cublasLtMatrixLayoutCreate");
      if (batch > 1) {
        const int32_t count = static_cast<int32_t>(batch);
        check_cublas(cublasLtMatrixLayoutSetAttribute(*L, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &count, sizeof count),
                     dev, "cublasLtMatrixLayoutSetAttribute(BATCH_COUNT)");
        check_cublas(cublasLtMatrixLayoutSetAttribute(
                         *L, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
                     dev, "cublasLtMatrixLayoutSetAttribute(STRIDED_BATCH_OFFSET)");
      }
    };
    // Stored (column-major) shapes: our B as [n, k] (or [k, n] when trans_b), our A as [k, m]
    // (or [m, k] when trans_a), C as [n, m].
    layout(&p.a, ab, trans_b ? kk : n, trans_b ? n : kk, stride_b);
    layout(&p.b, ab, trans_a ? m : kk, trans_a ? kk : m, stride_a);
    layout(&p.c, c, n, m, m * n);
    cublasLtMatmulPreference_t pref = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), dev, "cublasLtMatmulPreferenceCreate");
    const uint64_t max_ws = ws_bytes;
    const uint32_t al_a = key.align_b, al_b = key.align_a, al_c = key.align_c;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                         sizeof max_ws);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                         sizeof al_a);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                         sizeof al_b);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                         sizeof al_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                         sizeof al_c);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(be.lt(), p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    check_cublas(st, dev, "cublasLtMatmulAlgoGetHeuristic");
    CS_CHECK(found > 0,
             "op '{}' on device GPU:{}: cuBLASLt has no algorithm for [{}, {}] x [{}, {}] "
             "(batch {}, trans_a {}, trans_b {}, types {} {})",
             opname, dev, m, kk, kk, n, batch, trans_a, trans_b, static_cast<int>(ab),
             static_cast<int>(c));
    p.algo = result.algo;
    it = plans.emplace(key, std::move(plan)).first;
  }
  const auto& plan = *it->second;
  const float alpha = 1.0f, beta = 0.0f;
  check_cublas(cublasLtMatmul(be.lt(), plan.op, &alpha, B, plan.a, A, plan.b, &beta, C, plan.c, C,
                              plan.c, &plan.algo, ws, ws_bytes, be.cuda_stream()),
               dev, "cublasLtMatmul");
}

}  // namespace

// ---- the kernels of cuda_ops.def ----

void cuda_Full(const KernelContext& ctx, const Node& n, const void* const*, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  k::fill(ty(n.dtype, "full"), n.attr<ir::FullAttrs>().value, out, n.numel(), b.stream());
  b.check_launch(n.name());
}

void cuda_Arange(const KernelContext& ctx, const Node& n, const void* const*, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const auto& a = n.attr<ir::ArangeAttrs>();
  k::arange(ty(n.dtype, "arange"), a.start, a.step, out, n.numel(), b.stream());
  b.check_launch(n.name());
}

void cuda_Neg(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Neg>(c, n, in, out);
}
void cuda_Abs(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Abs>(c, n, in, out);
}
void cuda_Exp(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Exp>(c, n, in, out);
}
void cuda_Log(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Log>(c, n, in, out);
}
void cuda_Sqrt(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Sqrt>(c, n, in, out);
}
void cuda_Rsqrt(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Rsqrt>(c, n, in, out);
}
void cuda_Reciprocal(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Reciprocal>(c, n, in, out);
}
void cuda_Tanh(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Tanh>(c, n, in, out);
}
void cuda_Sigmoid(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Sigmoid>(c, n, in, out);
}
void cuda_Relu(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Relu>(c, n, in, out);
}
void cuda_Expm1(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Expm1>(c, n, in, out);
}
void cuda_Gelu(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  if (n.attr<ir::GeluAttrs>().tanh_approx)
    unary<k::Unary::GeluTanh>(c, n, in, out);
  else
    unary<k::Unary::Gelu>(c, n, in, out);
}
void cuda_Silu(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Silu>(c, n, in, out);
}
void cuda_Erf(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Erf>(c, n, in, out);
}
void cuda_Sin(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Sin>(c, n, in, out);
}
void cuda_Cos(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Cos>(c, n, in, out);
}
void cuda_Floor(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Floor>(c, n, in, out);
}
void cuda_Sign(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  unary<k::Unary::Sign>(c, n, in, out);
}
void cuda_IsFinite(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  k::is_finite(f(in[0]), static_cast<bool*>(out), n.numel(), b.stream());
  b.check_launch(n.name());
}
void cuda_LogicalNot(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  k::logical_not(static_cast<const bool*>(in[0]), static_cast<bool*>(out), n.numel(), b.stream());
  b.check_launch(n.name());
}

void cuda_Cast(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  k::cast(ty(n.inputs[0]->dtype, "cast"), ty(n.dtype, "cast"), in[0], out, n.numel(), b.stream());
  b.check_launch(n.name());
}

void cuda_Add(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  binary<k::Binary::Add>(c, n, in, out);
}
void cuda_Sub(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  binary<k::Binary::Sub>(c, n, in, out);
}
void cuda_Mul(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  binary<k::Binary::Mul>(c, n, in, out);
}
void cuda_Div(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  binary<k::Binary::Div>(c, n, in, out);
}
void cuda_Maximum(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  binary<k::Binary::Maximum>(c, n, in, out);
}
void cuda_Minimum(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  binary<k::Binary::Minimum>(c, n, in, out);
}
void cuda_ReluGrad(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  binary<k::Binary::ReluGrad>(c, n, in, out);
}
void cuda_Pow(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  binary<k::Binary::Pow>(c, n, in, out);
}
void cuda_GeluGrad(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  if (n.attr<ir::GeluAttrs>().tanh_approx)
    binary<k::Binary::GeluTanhGrad>(c, n, in, out);
  else
    binary<k::Binary::GeluGrad>(c, n, in, out);
}
void cuda_LogicalAnd(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  logical<k::Logic::And>(c, n, in, out);
}
void cuda_LogicalOr(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  logical<k::Logic::Or>(c, n, in, out);
}
void cuda_LogicalXor(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  logical<k::Logic::Xor>(c, n, in, out);
}
void cuda_Where(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  k::where(bcast(n), static_cast<const bool*>(in[0]), in[1], in[2], out,
           static_cast<int>(itemsize(n.dtype)), n.numel(), b.stream());
  b.check_launch(n.name());
}

void cuda_Eq(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  compare<k::Cmp::Eq>(c, n, in, out);
}
void cuda_Ne(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  compare<k::Cmp::Ne>(c, n, in, out);
}
void cuda_Lt(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  compare<k::Cmp::Lt>(c, n, in, out);
}
void cuda_Le(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  compare<k::Cmp::Le>(c, n, in, out);
}
void cuda_Gt(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  compare<k::Cmp::Gt>(c, n, in, out);
}
void cuda_Ge(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  compare<k::Cmp::Ge>(c, n, in, out);
}

void cuda_Addcmul(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  k::addcmul(bcast(n), f(in[0]), f(in[1]), f(in[2]), static_cast<float*>(out), n.numel(),
             b.stream());
  b.check_launch(n.name());
}

void cuda_Sum(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  reduce<k::Reduce::Sum>(c, n, in, out);
}
void cuda_Mean(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  reduce<k::Reduce::Mean>(c, n, in, out);
}
void cuda_Max(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  reduce<k::Reduce::Max>(c, n, in, out);
}
void cuda_Min(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  reduce<k::Reduce::Min>(c, n, in, out);
}
void cuda_Var(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  reduce_stat<ir::VarAttrs>(c, n, in, out, k::Stat::Var, n.attr<ir::VarAttrs>().correction);
}
void cuda_LogSumExp(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  reduce_stat<ir::AxesAttrs>(c, n, in, out, k::Stat::LogSumExp, 0);
}
void cuda_Norm(const KernelContext& c, const Node& n, const void* const* in, void* out) {
  reduce_stat<ir::NormAttrs>(c, n, in, out, k::Stat::Norm, n.attr<ir::NormAttrs>().p);
}
void cuda_Argmax(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const View v = reduce_view(n.inputs[0]->shape, n.attr<ir::AxesAttrs>().dims);
  k::argmax(f(in[0]), static_cast<int64_t*>(out), v.outer, v.r, v.inner, b.stream());
  b.check_launch(n.name());
}

void cuda_Matmul(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const auto& at = n.attr<ir::MatmulAttrs>();
  const Shape &sa = n.inputs[0]->shape, &sb = n.inputs[1]->shape;
  const size_t ra = sa.size(), rb = sb.size();
  const int64_t m = at.trans_a ? sa[ra - 1] : sa[ra - 2], kk = at.trans_a ? sa[ra - 2] : sa[ra - 1];
  const int64_t nn = at.trans_b ? sb[rb - 2] : sb[rb - 1];
  const int64_t batch_a = n.inputs[0]->numel() / std::max<int64_t>(1, m * kk);
  const int64_t batch_b = n.inputs[1]->numel() / std::max<int64_t>(1, kk * nn);
  const int64_t batch = n.numel() / std::max<int64_t>(1, m * nn);
  if (kk == 0) {  // an empty inner dim: the product is zeros
    b.fill_zero(out, n.nbytes());
    return;
  }
  const cudaDataType_t t = lt_type(n.dtype);
  gemm(b, n.name(), in[0], in[1], out, m, nn, kk, at.trans_a, at.trans_b, batch,
       batch_a == 1 ? 0 : m * kk, batch_b == 1 ? 0 : kk * nn, t, t);
}

void cuda_Linear(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const Shape& w = n.inputs[1]->shape;
  const int64_t nn = w[0], kk = w[1], m = n.numel() / nn;
  if (n.dtype != DType::f32) {
    const cudaDataType_t t = lt_type(n.dtype);
    if (n.inputs.size() == 2) {
      if (kk == 0)
        b.fill_zero(out, n.nbytes());
      else
        gemm(b, n.name(), in[0], in[1], out, m, nn, kk, false, true, 1, 0, 0, t, t);
      return;
    }
    // With a bias, the CPU adds it to the f32 product and rounds once: so the product goes to
    // f32 in the node's workspace (cuda::workspace_bytes), then one kernel adds and rounds.
    const size_t need = workspace_bytes(n);
    CS_CHECK(ctx.workspace_bytes >= need && ctx.workspace,
             "{}: the CUDA kernel needs a workspace of {} bytes, got {}", n.name(), need,
             ctx.workspace_bytes);
    auto* y = static_cast<float*>(ctx.workspace);
    if (kk == 0)
      b.fill_zero(y, need);
    else
      gemm(b, n.name(), in[0], in[1], y, m, nn, kk, false, true, 1, 0, 0, t, CUDA_R_32F);
    k::bias_round(ty(n.dtype, n.name()), y, in[2], out, m, nn, b.stream());
    b.check_launch(n.name());
    return;
  }
  float* y = static_cast<float*>(out);
  if (kk == 0)
    b.fill_zero(out, n.nbytes());
  else
    gemm(b, n.name(), in[0], in[1], y, m, nn, kk, false, true, 1, 0, 0);
  if (n.inputs.size() == 3) {  // y += bias, in place (row broadcast)
    k::Bcast bc;
    bc.rank = 2;
    bc.contiguous = false;
    bc.small = n.numel() <= 0x7fffffff;
    bc.shape[0] = m;
    bc.shape[1] = nn;
    bc.strides[0][0] = nn;
    bc.strides[0][1] = 1;
    bc.strides[1][0] = 0;
    bc.strides[1][1] = 1;
    launched(k::binary(k::Binary::Add, k::Ty::f32, bc, y, in[2], y, n.numel(), b.stream()), b, n);
  }
}

void cuda_Softmax(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const View v = dim_view(n.shape, n.attr<ir::DimAttrs>().dim);
  k::softmax(false, f(in[0]), static_cast<float*>(out), v.outer, v.r, v.inner, b.stream());
  b.check_launch(n.name());
}
void cuda_LogSoftmax(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const View v = dim_view(n.shape, n.attr<ir::DimAttrs>().dim);
  k::softmax(true, f(in[0]), static_cast<float*>(out), v.outer, v.r, v.inner, b.stream());
  b.check_launch(n.name());
}
void cuda_LogSoftmaxGrad(const KernelContext& ctx, const Node& n, const void* const* in,
                         void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const View v = dim_view(n.shape, n.attr<ir::DimAttrs>().dim);
  k::log_softmax_grad(f(in[0]), f(in[1]), static_cast<float*>(out), v.outer, v.r, v.inner,
                      b.stream());
  b.check_launch(n.name());
}

void cuda_NllLoss(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  const auto& at = n.attr<ir::LossAttrs>();
  const View v = loss_view(n.inputs[0]->shape);
  if (at.reduction == ir::Reduction::None && n.numel() == 0) return;
  k::nll_loss(f(in[0]), in[1], n.inputs[1]->dtype == DType::i64, static_cast<float*>(out), v.outer,
              v.r, v.inner, at.ignore_index, reduction_code(at.reduction), b.error_word(),
              b.stream());
  b.check_launch(n.name());
}
void cuda_NllLossGrad(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const auto& at = n.attr<ir::LossAttrs>();
  const View v = loss_view(n.shape);
  k::nll_loss_grad(f(in[0]), in[1], n.inputs[1]->dtype == DType::i64, static_cast<float*>(out),
                   v.outer, v.r, v.inner, at.ignore_index, reduction_code(at.reduction),
                   b.error_word(), b.stream());
  b.check_launch(n.name());
}

void cuda_CrossEntropyGrad(const KernelContext& ctx, const Node& n, const void* const* in,
                           void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const auto& at = n.attr<ir::LossAttrs>();
  const int64_t c = n.shape.back(), rows = n.numel() / c;
  k::cross_entropy_grad(f(in[0]), f(in[1]), in[2], n.inputs[2]->dtype == DType::i64,
                        static_cast<float*>(out), rows, c, at.ignore_index,
                        reduction_code(at.reduction), b.error_word(), b.stream());
  b.check_launch(n.name());
}

void cuda_Copy(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  b.copy_on_device(out, in[0], n.nbytes());
}

// ---- data movement: one strided read each (kernels/shape.cu) ----

// Row-major strides of `s` (a 0-d shape has none).
void contiguous_strides(const Shape& s, int64_t* st) {
  int64_t acc = 1;
  for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= s[d];
  }
}

void gather(const CudaBackend& b, const Node& n, const k::Strided& walk, const void* in,
            void* out) {
  if (n.numel() == 0) return;
  k::Strided s = walk;
  // Offsets stay below the input's size and indices below the output's.
  s.small = n.numel() <= 0x7fffffff && n.inputs[0]->numel() <= 0x7fffffff;
  k::gather_strided(s, static_cast<int>(itemsize(n.dtype)), in, out, n.numel(), b.stream());
  b.check_launch(n.name());
}

k::Strided output_walk(const Node& n) {
  k::Strided s;
  s.rank = static_cast<int>(n.shape.size());
  for (int d = 0; d < s.rank; ++d) s.shape[d] = n.shape[d];
  return s;
}

void cuda_Permute(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  const auto& perm = n.attr<ir::PermuteAttrs>().perm;
  int64_t st[k::kMaxRank] = {};
  contiguous_strides(n.inputs[0]->shape, st);
  k::Strided s = output_walk(n);
  for (int d = 0; d < s.rank; ++d) s.strides[d] = st[perm[d]];
  gather(b, n, s, in[0], out);
}

void cuda_Expand(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  const Shape& is = n.inputs[0]->shape;
  int64_t st[k::kMaxRank] = {};
  contiguous_strides(is, st);
  k::Strided s = output_walk(n);
  const int lead = s.rank - static_cast<int>(is.size());  // new leading dims: stride 0
  for (int d = lead; d < s.rank; ++d) s.strides[d] = is[d - lead] == 1 ? 0 : st[d - lead];
  gather(b, n, s, in[0], out);
}

void cuda_Slice(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  const auto& at = n.attr<ir::SliceAttrs>();
  k::Strided s = output_walk(n);
  contiguous_strides(n.inputs[0]->shape, s.strides);
  s.offset = at.start * s.strides[at.dim];
  s.strides[at.dim] *= at.step;
  gather(b, n, s, in[0], out);
}

void cuda_Tri(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  const auto& a = n.attr<ir::TriAttrs>();
  const size_t r = n.shape.size();
  const int64_t m = n.shape[r - 2], nn = n.shape[r - 1];
  if (n.numel() == 0) return;
  k::tri(a.upper, a.diagonal, static_cast<int>(itemsize(n.dtype)), in[0], out, n.numel() / (m * nn),
         m, nn, b.stream());
  b.check_launch(n.name());
}

// Each input is a block of [outer, dk * row] bytes placed at column dk_offset * row of the
// output's [outer, D * row]: one 2-d copy per input, queued on the stream.
void cuda_Cat(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const int64_t dim = n.attr<ir::DimAttrs>().dim;
  const Shape& os = n.shape;
  const int64_t outer = numel(os, 0, dim), D = os[dim];
  const int64_t row = numel(os, dim + 1, os.size()) * static_cast<int64_t>(itemsize(n.dtype));
  auto* dst = static_cast<char*>(out);
  int64_t off = 0;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const int64_t dk = n.inputs[k]->shape[dim];
    if (dk > 0)
      check_cuda(
          cudaMemcpy2DAsync(dst + off * row, static_cast<size_t>(D * row), in[k],
                            static_cast<size_t>(dk * row), static_cast<size_t>(dk * row),
                            static_cast<size_t>(outer), cudaMemcpyDeviceToDevice, b.cuda_stream()),
          b.index(), "cudaMemcpy2DAsync (cat)");
    off += dk;
  }
}

// ---- indexing (kernels/index.cu) ----

namespace {

// x viewed as [outer, size, inner] around `dim` (a 0-d x is one element).
View index_view(const Shape& s, int64_t dim) {
  View v;
  if (s.empty()) return v;
  v.outer = numel(s, 0, dim);
  v.r = s[dim];
  v.inner = numel(s, dim + 1, s.size());
  return v;
}

bool is_i64(const Node& index) {
  return index.dtype == DType::i64;
}

// The output starts as input 0 (already there when the planner wrote it in place).
void copy_input0(const CudaBackend& b, const Node& n, const void* in0, void* out) {
  if (out != in0) b.copy_on_device(out, in0, n.nbytes());
}

// The walk over the index's positions: its shape, and the contiguous strides of `data` (0 along
// dim) and of `src`.
k::IndexWalk index_walk(const Shape& index, int64_t dim, const Shape& data, const Shape* src) {
  k::IndexWalk w;
  w.rank = static_cast<int>(index.size());
  int64_t ds[k::kMaxRank] = {}, ss[k::kMaxRank] = {};
  contiguous_strides(data, ds);
  if (src) contiguous_strides(*src, ss);
  for (int d = 0; d < w.rank; ++d) {
    w.shape[d] = index[d];
    w.strides[0][d] = d == dim ? 0 : ds[d];
    w.strides[1][d] = ss[d];
  }
  return w;
}

int64_t dim_stride(const Shape& s, int64_t dim) {
  return numel(s, dim + 1, s.size());
}

}  // namespace

void cuda_IndexSelect(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const View v = index_view(n.inputs[0]->shape, n.attr<ir::DimAttrs>().dim);
  k::index_select(in[0], in[1], is_i64(*n.inputs[1]), out, v.outer, v.r, v.inner,
                  n.inputs[1]->numel(), static_cast<int>(itemsize(n.dtype)), b.error_word(),
                  b.stream());
  b.check_launch(n.name());
}

void cuda_IndexAdd(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  copy_input0(b, n, in[0], out);
  const View v = index_view(n.inputs[0]->shape, n.attr<ir::DimAttrs>().dim);
  const int64_t m = n.inputs[1]->numel();
  if (m == 0 || v.outer * v.inner == 0) return;
  k::index_add(ty(n.dtype, n.name()), in[1], is_i64(*n.inputs[1]), in[2], out, v.outer, v.r,
               v.inner, m, b.error_word(), b.stream());
  b.check_launch(n.name());
}

void cuda_Gather(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  if (n.numel() == 0) return;
  const int64_t dim = n.attr<ir::DimAttrs>().dim;
  const Shape& a = n.inputs[0]->shape;
  k::gather(index_walk(n.inputs[1]->shape, dim, a, nullptr), in[0], in[1], is_i64(*n.inputs[1]),
            out, n.numel(), dim_stride(a, dim), a[dim], static_cast<int>(itemsize(n.dtype)),
            b.error_word(), b.stream());
  b.check_launch(n.name());
}

void cuda_ScatterAdd(const KernelContext& ctx, const Node& n, const void* const* in, void* out) {
  const auto& b = enter(ctx, n);
  copy_input0(b, n, in[0], out);
  if (n.inputs[1]->numel() == 0) return;
  const int64_t dim = n.attr<ir::DimAttrs>().dim;
  k::scatter_add(ty(n.dtype, n.name()),
                 index_walk(n.inputs[1]->shape, dim, n.shape, &n.inputs[2]->shape),
                 static_cast<int>(dim), in[1], is_i64(*n.inputs[1]), in[2], out,
                 dim_stride(n.shape, dim), n.shape[dim], b.error_word(), b.stream());
  b.check_launch(n.name());
}

// Kernels defined in their own files (runtime/random_fused_ops.cpp, attention_ops.cpp,
// collective_ops.cpp).
void cuda_RandUniform(const KernelContext&, const Node&, const void* const*, void*);
void cuda_RandNormal(const KernelContext&, const Node&, const void* const*, void*);
void cuda_Bernoulli(const KernelContext&, const Node&, const void* const*, void*);
void cuda_Fused(const KernelContext&, const Node&, const void* const*, void*);
void cuda_Attention(const KernelContext&, const Node&, const void* const*, void*);
void cuda_AttentionGrad(const KernelContext&, const Node&, const void* const*, void*);
void cuda_AllReduceStart(const KernelContext&, const Node&, const void* const*, void*);
void cuda_AllReduceUnpack(const KernelContext&, const Node&, const void* const*, void*);

namespace {
const ir::Kernel* kernel_table() {
  static const auto* t = [] {
    auto* table = new ir::Kernel[ir::kNumOps]();
#define CUDA_OP(Name, mask) table[static_cast<int>(ir::OpCode::Name)] = &cuda_##Name;
#include "backend/cuda/cuda_ops.def"
#undef CUDA_OP
    return table;
  }();
  return t;
}
}  // namespace

ir::Kernel kernel_of(ir::OpCode op) {
  return kernel_table()[static_cast<int>(op)];
}

}  // namespace cstorch::cuda
