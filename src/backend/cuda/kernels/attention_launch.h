// Launch functions of the CUDA attention kernels (kernels/attention.cu): plain types only, like
// launch.h, so the kernels compile as C++17 while the host code that reads nodes
// (runtime/attention_ops.cpp) and the capability check (attention_plan.cpp, built without CUDA)
// are C++20. Every function queues its work on `stream` (a cudaStream_t) and returns at once;
// pointers are device memory.
#pragma once
#include <cstdint>

namespace cstorch::cuda::k {

// The largest head size (D of q and k, Dv of v) the kernels take: their per-thread accumulators
// are registers sized at compile time, and the tiles of q, k, v and dO fit shared memory on
// every supported GPU (sm_80 and later) up to this size.
constexpr int64_t kAttentionMaxHeadDim = 128;
// Query rows and keys per tile: the kernels run one thread block per (b, h, tile).
constexpr int64_t kAttentionTile = 32;

// One attention node's operands. q [B, H, Tq, D], k [B, H, Tk, D], v [B, H, Tk, Dv] (or
// [B, T, H, *] when bthd). bias (f32) and mask (one byte, nonzero = attend) broadcast to
// [B, H, Tq, Tk]: element (b, h, i, j) is at b * s[0] + h * s[1] + i * s[2] + j * s[3], a stride
// 0 where the dim is 1. rng_state: the generator state {seed, offset} (two int64), null without
// dropout; a score is kept iff its 24-bit uniform is below keep_p, and kept probabilities are
// scaled by inv_keep.
struct Attention {
  int64_t B = 0, H = 0, Tq = 0, Tk = 0, D = 0, Dv = 0;
  bool bthd = false;
  float scale = 1;
  bool causal = false;
  int64_t causal_offset = 0;  // key j is visible to query i iff j <= i + causal_offset
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* bias = nullptr;
  int64_t bias_strides[4] = {};
  const uint8_t* mask = nullptr;
  int64_t mask_strides[4] = {};
  const int64_t* rng_state = nullptr;
  float keep_p = 1, inv_keep = 1;
};

// Floats of the backward's scratch: the row max, row sum and rowsum(dO * O) of every query row.
inline int64_t attention_stats_floats(int64_t B, int64_t H, int64_t Tq) {
  return 3 * B * H * Tq;
}

// out (O, q's layout with Dv) = softmax(scale * q k^T + bias, masked) v, with dropout.
void attention_forward(const Attention& a, float* out, void* stream);

// Gradients of q, k, v (each in its input's layout) and, when dbias is not null, of the bias
// (the bias's shape: summed over its broadcast dims). o and dout: the forward output and its
// gradient. stats: attention_stats_floats(B, H, Tq) floats of scratch. Deterministic: no
// atomics, every sum in a fixed order.
void attention_backward(const Attention& a, const float* o, const float* dout, float* dq, float* dk,
                        float* dv, float* dbias, float* stats, void* stream);

}  // namespace cstorch::cuda::k
