// cstorch's own f32 GEMM (gemm.cpp), used by linalg.cpp ahead of OpenBLAS where it applies.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cstorch::cpu {

// Per-thread scratch memory handed down to the GEMMs from a kernel's planned workspace (kernels
// never allocate): `slots` areas of `floats` floats each, area t at base + t * stride. A GEMM
// that starts its own team gives team thread t area t and runs on at most `slots` threads; one
// that runs on the calling thread alone uses area omp_get_thread_num() (the caller's slot inside
// a parallel loop that the kernel capped at `slots` threads).
struct Scratch {
  float* base = nullptr;
  size_t stride = 0;  // floats between consecutive areas
  size_t floats = 0;  // usable floats of each area
  int slots = 0;
  const char* op = "gemm";  // the kernel's op, for errors
  // Area t, of at least `need` floats; an error naming the op and the sizes when the workspace
  // has no such area or a smaller one.
  float* slot(int t, size_t need) const;
};

// Whether sgemm_avx512 runs this product (else OpenBLAS): AVX-512 built into this variant of
// the kernels, and M, K >= 1. No upper size: with B blocks sized for L2 the own GEMM runs every
// product shape of a GPT-2 124M step faster than OpenBLAS (`bench_peak --gemm`, AMD EPYC Zen 5,
// 2 threads: 432 against 245 GFLOP/s weighted by the step's FLOPs, OpenBLAS on the AVX2 kernels
// OPENBLAS_CORETYPE=Haswell selects there), so the speed of products does not depend on which
// kernels OpenBLAS picks. No lower size either (measured on one core, Zen 5): a few rows with a
// transposed B take the dot path (4 x 50 x 784: 2.8 us against OpenBLAS's 8.9), 4 x 50 x 50
// takes 0.34 us against 0.61; a weight gradient over a batch of 4 (50 x 784 x 4) is slower bare
// (5.6 us against 4.3) but carries the optimizer's momentum and parameter updates in its
// epilogue (7.3 us against 4.3 + 3.9 for OpenBLAS and the two separate passes). The choice
// depends on the shape alone, so that a fused product is computed exactly as the unfused one.
// The compiler asks it before fusing an epilogue (only this path applies one for free).
bool own_gemm_applies(int64_t M, int64_t N, int64_t K, bool tb);

// Whether sgemm_avx512 computes a product of inner size K in one K block (K <= 384): then an
// addend epilogue is bitwise the separate addcmul on the stored product. With more blocks the
// plain product stores partial sums between blocks, while a product with an addend does not
// (C may be the addend's storage), so the two round differently in the last bits.
bool own_gemm_one_k_block(int64_t K);

// What the GEMM applies to each result before storing it, in this order.
struct GemmEpilogue {
  const float* bias = nullptr;    // + bias[j] on every row
  const float* addend = nullptr;  // + addend[i * ld_addend + j] * addend_scale (one FMA)
  int64_t ld_addend = 0;
  float addend_scale = 0.f;
  bool relu = false;            // x < 0 ? 0 : x (NaN kept)
  const float* gate = nullptr;  // relu's gradient: gate[i * ld_gate + j] <= 0 ? 0 : x
  int64_t ld_gate = 0;
  // After storing x: update[i * ld_update + j] += x * update_scale (one FMA, in place).
  float* update = nullptr;
  int64_t ld_update = 0;
  float update_scale = 0.f;
  // gelu's gradient at gelu_x[i * ld_gelu_x + j] with x as the incoming gradient (the tanh form
  // when gelu_tanh): gelu_grad_n (elementwise_math.h), applied to each finished tile while it is
  // in L1. Not with addend, relu, gate or update.
  const float* gelu_x = nullptr;
  int64_t ld_gelu_x = 0;
  bool gelu_tanh = false;
};

// Floats of the scratch area one thread of sgemm_avx512 needs for a product of N columns and
// inner size K, with an addend epilogue or not: its packed B panels when tb (B^T), K spans more
// than one K block, N >= 1024 (a wide B, packed when M has enough rows), or ta with K >= 256
// (A^T: packed when M has enough rows and N more than 32 columns), and after them a copy of one
// A micro-panel (used when A's rows are a multiple of 1024 floats apart, where they would evict
// each other in L1, and for A^T); 0 when B is always read in place or the variant has no
// AVX-512. Enough for any M and for any N' <= N. A product given less (sized with ta false)
// reads a B it would pack for A^T in place.
size_t sgemm_avx512_scratch_floats(int64_t N, int64_t K, bool ta, bool tb, bool addend);

// C[M, N] = epilogue(alpha * op(A)[M, K] @ op(B)[K, N] + beta * C), row-major (op = transpose
// when ta / tb), on a team of `threads` OpenMP threads (1: the calling thread only; inside a
// parallel region always 1), capped at ws.slots when B is packed, each thread packing into its
// own area of `ws` (sgemm_avx512_scratch_floats). Results do not depend on the team size. beta
// == 0 never reads C. Each result equals, bitwise, the plain product followed by separate bias,
// addcmul and relu passes. Returns false, doing nothing, in a variant without AVX-512 (callers
// then use OpenBLAS; an AVX2 version measured slower than OpenBLAS's Haswell kernels: see
// bench/README.md).
bool sgemm_avx512(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                  int threads, const Scratch& ws, const GemmEpilogue& ep = {});

// Whether sgemm_avx512 computes this product as its transpose, C^T = B A^T: an A B^T product (a
// linear layer's forward: A the activations [M, K], B the weight [N, K]) with more columns than
// rows, at least 64 rows (fewer would fill few of a vector's lanes), and an epilogue of at most a
// bias and relu (the others are not applied to transposed tiles; those products keep the direct
// form, as does one whose scratch was sized for a smaller N). The weight, the larger operand, is
// then read in place as the broadcast operand (its rows run along K) and only the activations are
// transposed into panels, instead of every weight element; each tile is transposed once in L1 on
// its way to C. Each result is the same sum in the same order (an FMA is symmetric in its
// factors), so the same bits as the direct form (tested). Measured on Zen 4 (bench_peak-style
// runs alternated with the direct form, operands cold as in a training step), GPT-2 124M's
// forward products: 256 x 2304 x 768 86-92 -> 91-97 GFLOP/s on one core, 156-177 -> 177-186 on
// two; 256 x 3072 x 768 87-98 -> 93-97 and 163-178 -> 184-187.
inline bool own_gemm_swaps(bool ta, bool tb, int64_t M, int64_t N) {
  return !ta && tb && M >= 64 && N > M;
}

// C[M, N] = op(A)[M, K] @ op(B)[K, N] + beta * C (row-major; beta == 0 never reads C) when one
// side is short and the product small (gemm_small.cpp): up to 2^22 multiply-adds, and K or M at
// most 16 with B not transposed, or N or M at most 16 with B transposed and A not (K >= 8). Each
// element is a sum of its K products in an order fixed by K alone, so the bits do not depend on
// `threads` (the team splitting the tiles; 1 inside a parallel region). Returns false, doing
// nothing, for other products and in variants without AVX2 and FMA (callers then use OpenBLAS,
// which packs both operands whatever their shape: with 10 rows, columns or inner steps, the
// packing costs more than the arithmetic).
bool sgemm_small(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc, int threads);

// Whether sgemm_bf16 runs here: the AVX-512 variant of the kernels on a CPU with avx512_bf16.
bool bf16_gemm_runs_here();
// Floats of the scratch area one thread of sgemm_bf16 needs (0 where it does not run).
size_t sgemm_bf16_scratch_floats();
// Whether sgemm_bf16 runs on AMX tiles (TDPBF16PS) rather than VDPBF16PS: the CPU has AMX-BF16,
// the OS granted this process the tile state, and neither CSTORCH_AMX=0 in the environment (read
// once) nor an earlier bf16_gemm_amx(0) turned them off. mode 0 turns them off, 1 back on (where
// available), -1 only asks. The two paths round differently in the last bits of a sum; each
// gives results that do not depend on the thread count.
bool bf16_gemm_amx(int mode);
// Whether bf16 products are widened to f32 (exactly) for the f32 GEMM, the result rounded to
// bf16, instead of taking sgemm_bf16: always where sgemm_bf16 does not run; else as `mode` sets
// it (0: sgemm_bf16, 1: widened; -1 only asks) or CSTORCH_BF16_GEMM=bf16 / widen in the
// environment (read once); by default on Intel CPUs whose products are not on AMX tiles, whose
// VDPBF16PS runs at half the rate of the f32 FMA. Measured on an Intel Xeon (model 207, KVM, no
// tiles): VDPBF16PS peak 81 against FMA 168 GFLOP/s on one core; GPT-2 124M's bf16 step at 2
// threads 1.39 s on sgemm_bf16, 0.98 s widened (the f32 step 0.84-0.88 s). The planner asks when it
// sizes a product's workspace, so a mode is set before programs are compiled. Both paths sum
// exact bf16 products in f32 (in different orders: their last bits differ); neither depends on
// the thread count. Errors: CSTORCH_BF16_GEMM holds another value.
bool bf16_gemm_widened(int mode);
// Whether sgemm_bf16 computes this product as its transpose, C^T = op(B)^T op(A)^T: an A B^T
// product (a linear layer's forward) with more columns than rows, at least 64 rows and an even K.
inline bool bf16_gemm_swaps(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  return !ta && tb && K % 2 == 0 && M >= 64 && N > M;
}
// C[M, N] = op(A)[M, K] @ op(B)[K, N] in f32 from bf16 operands (their bits, row-major, op =
// transpose when ta / tb): exact bf16 products summed in f32 (VDPBF16PS: pairs along K, then
// equal blocks of at most 768 along K, in order; input and output denormals flushed to zero; on
// AMX tiles, bf16_gemm_amx, the tile unit's own order within each block, the blocks rounded up
// to multiples of 32 and added in order; a final f32 C of 8 MiB or more in one block is written
// with streaming stores). On a
// team of `threads` threads (capped at ws.slots and at one per panel of the split dimension),
// each packing into its own area of ws (sgemm_bf16_scratch_floats). Results do not depend on the
// team size, nor on whether an A B^T product is computed as its transpose B A^T (which it is
// when N > M >= 64 and K is even: the larger operand then needs no packing). Returns false,
// doing nothing, where bf16_gemm_runs_here() is false.
//
// With out.c16, the result is stored as bf16 there instead (leading dim ldc; rounded to nearest
// even, as bf16_t rounds), after adding out.bias (f32, one per column) if given: bitwise the f32
// result plus the bias, rounded. C is then only scratch for the partial sums of earlier K blocks:
// with K <= 768 it is neither read nor written.
//
// With out.round_c (and no c16), C itself receives the result rounded to bf16 and widened back
// to f32 (exact): a bf16 product and its cast to f32 in one store (a MatmulAttrs::f32_out node).
struct Bf16Result {
  uint16_t* c16 = nullptr;
  const float* bias = nullptr;
  bool round_c = false;
};
bool sgemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t* A, int64_t lda,
                const uint16_t* B, int64_t ldb, float* C, int64_t ldc, int threads,
                const Scratch& ws, const Bf16Result& out = {});

}  // namespace cstorch::cpu
