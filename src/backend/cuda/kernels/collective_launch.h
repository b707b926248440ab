// Launch functions of the collectives' device kernels (collective.cu). Plain types, as launch.h.
#pragma once
#include <cstdint>

namespace cstorch::cuda::k {

// y[i] = x[i] * w (the bucket's weighted copy of a gradient), i < n.
void scale(const float* x, float* y, float w, int64_t n, void* stream);
// y[i] = y[i] / d in place (a mean's division by the replicas' summed weight), i < n.
void divide(float* y, float d, int64_t n, void* stream);

}  // namespace cstorch::cuda::k
