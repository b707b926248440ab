// cstorch::nn::functional: the functional forms of the layers (the same ops as cstorch::).
#pragma once
#include <optional>

#include "cstorch/tensor.h"

namespace cstorch::nn::functional {
using cstorch::cross_entropy;
using cstorch::dropout;
using cstorch::embedding;
using cstorch::gelu;
using cstorch::layer_norm;
using cstorch::linear;
using cstorch::log_softmax;
using cstorch::mse_loss;
using cstorch::nll_loss;
using cstorch::Reduction;
using cstorch::relu;
using cstorch::sigmoid;
using cstorch::silu;
using cstorch::softmax;
using cstorch::tanh;

// Options of scaled_dot_product_attention (all optional).
struct AttentionOptions {
  // bool (true = attend) or f32 (added to the scores), broadcastable to [B, H, Tq, Tk].
  Tensor attn_mask;
  // An additive f32 bias broadcastable to [B, H, Tq, Tk] (e.g. T5's relative position bias,
  // [1, H, Tq, Tk]); it receives a gradient when it requires one. A float attn_mask and a bias
  // together are added.
  Tensor bias;
  // Dropout on the attention probabilities (applied whenever > 0, as torch's function does:
  // callers pass 0 in eval). Keep decisions come from the global counter-based generator,
  // element (b, h, i, j) from counter b*H*Tq*Tk + h*Tq*Tk + i*Tk + j of one fresh offset, so
  // eager and traced runs agree and the backward pass reuses the forward's mask.
  double dropout_p = 0;
  // Causal masking: query i sees key j iff j <= i + causal_offset. Offset 0 is torch's
  // is_causal (top-left aligned); Tk - Tq aligns the last query with the last key (queries that
  // continue a cached prefix).
  bool is_causal = false;
  int64_t causal_offset = 0;
  std::optional<double> scale;  // default 1 / sqrt(D)
  // Layout: false = q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv], out [B, H, Tq, Dv];
  // true = [B, T, H, D] for all four (what a [B, T, H*D] projection reshapes to: no transposes).
  bool heads_last = false;
};

// softmax(q k^T * scale + bias + mask) v, fused: never materialises the [Tq, Tk] score matrix
// of a head (query blocks of 64 rows, key tiles of up to 512 with an online softmax), forward
// and backward kernels parallel over batch x heads x query blocks, no heap allocation per call.
// f32 only (16-bit inputs are cast under autocast, otherwise an error). A query row whose keys
// are all masked gives zeros (torch's explicit formula gives NaN there) and zero gradients.
// Errors: ranks, dtypes, mismatched B / H / T / D, masks that do not broadcast, dropout_p
// outside [0, 1), scale <= 0.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options);
// torch.nn.functional.scaled_dot_product_attention's signature.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0,
                                    bool is_causal = false,
                                    std::optional<double> scale = std::nullopt);
}  // namespace cstorch::nn::functional
