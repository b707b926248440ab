// Standard layers and initialisers (PyTorch defaults).
#include "cstorch/nn/layers.h"

#include <cmath>

#include "core/internal.h"

namespace cstorch::nn {

namespace init {
static void fill_from(Tensor& t, const Tensor& v) {
  NoGradGuard ng;
  t.copy_(v);
}
void uniform_(Tensor& t, double lo, double hi) {
  fill_from(t, uniform(t.shape(), lo, hi, t.dtype()));
}
void normal_(Tensor& t, double mean, double std) {
  fill_from(t, normal(t.shape(), mean, std, t.dtype()));
}
void zeros_(Tensor& t) {
  fill_from(t, zeros(t.shape(), t.dtype()));
}
void ones_(Tensor& t) {
  fill_from(t, ones(t.shape(), t.dtype()));
}
static std::pair<int64_t, int64_t> fans(const Tensor& t) {
  CS_CHECK(t.dim() >= 2, "init: fan in/out need a tensor with at least 2 dims, got shape {}",
           shape_str(t.shape()));
  int64_t rf = 1;
  for (int64_t i = 2; i < t.dim(); ++i) rf *= t.size(i);
  return {t.size(1) * rf, t.size(0) * rf};
}
void kaiming_uniform_(Tensor& t, double a) {
  auto [fan_in, fan_out] = fans(t);
  double gain = std::sqrt(2.0 / (1 + a * a));
  double bound = gain * std::sqrt(3.0 / static_cast<double>(fan_in));
  uniform_(t, -bound, bound);
}
void xavier_uniform_(Tensor& t, double gain) {
  auto [fan_in, fan_out] = fans(t);
  double bound = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  uniform_(t, -bound, bound);
}
}  // namespace init

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias)
    : Module("Linear"), in_features(in), out_features(out) {
  CS_CHECK(in > 0 && out > 0, "Linear: features must be positive, got in={} out={}", in, out);
  Tensor w = zeros({out, in});
  init::kaiming_uniform_(w, std::sqrt(5.0));
  weight = register_parameter("weight", w);
  if (with_bias) {
    Tensor b = zeros({out});
    double bound = 1.0 / std::sqrt(static_cast<double>(in));
    init::uniform_(b, -bound, bound);
    bias = register_parameter("bias", b);
  }
}
Tensor LinearImpl::forward(const Tensor& x) {
  CS_CHECK(x.dim() >= 1 && x.size(-1) == in_features,
           "Linear({}, {}): input has shape {}; its last dim must be {}", in_features, out_features,
           shape_str(x.shape()), in_features);
  return linear(x, weight, bias);
}

GELUImpl::GELUImpl(std::string approximate) : Module("GELU") {
  CS_CHECK(approximate == "none" || approximate == "tanh",
           "GELU: approximate must be 'none' or 'tanh', got '{}'", approximate);
  tanh_ = approximate == "tanh";
}

DropoutImpl::DropoutImpl(double p) : Module("Dropout"), p_(p) {
  CS_CHECK(p >= 0 && p <= 1, "Dropout: p must be in [0, 1], got {}", p);
}

LayerNormImpl::LayerNormImpl(Shape shape, double eps, bool affine)
    : Module("LayerNorm"), shape_(std::move(shape)), eps_(eps) {
  if (affine) {
    weight = register_parameter("weight", ones(shape_));
    bias = register_parameter("bias", zeros(shape_));
  }
}
Tensor LayerNormImpl::forward(const Tensor& x) {
  return layer_norm(x, shape_, weight, bias, eps_);
}

EmbeddingImpl::EmbeddingImpl(int64_t num, int64_t dim) : Module("Embedding") {
  CS_CHECK(num > 0 && dim > 0, "Embedding: sizes must be positive, got {} x {}", num, dim);
  Tensor w = zeros({num, dim});
  init::normal_(w, 0, 1);
  weight = register_parameter("weight", w);
}

void SequentialImpl::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(mods_.size()), m);
  mods_.push_back(std::move(m));
}
Tensor SequentialImpl::forward(const Tensor& x) {
  Tensor h = x;
  for (auto& m : mods_) h = m->forward(h);
  return h;
}
void ModuleListImpl::push_back(std::shared_ptr<Module> m) {
  register_module(std::to_string(mods_.size()), m);
  mods_.push_back(std::move(m));
}

}  // namespace cstorch::nn
