// cstorch::nn::functional: the functional forms of the layers (the same ops as cstorch::).
#pragma once
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
}  // namespace cstorch::nn::functional
