// Standard layers with PyTorch's default initialisations.
#pragma once
#include <string>

#include "cstorch/nn/module.h"

namespace cstorch::nn {

// y = x W^T + b. weight [out, in] and bias [out] ~ U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's
// kaiming_uniform(a=sqrt(5)) default).
class LinearImpl : public Module {
 public:
  LinearImpl(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;
  int64_t in_features, out_features;
};
CSTORCH_MODULE(Linear);

class ReLUImpl : public Module {
 public:
  ReLUImpl() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return relu(x); }
};
CSTORCH_MODULE(ReLU);

class GELUImpl : public Module {
 public:
  explicit GELUImpl(std::string approximate = "none");  // "none" (erf) or "tanh"
  Tensor forward(const Tensor& x) override { return gelu(x, tanh_); }

 private:
  bool tanh_;
};
CSTORCH_MODULE(GELU);

class TanhImpl : public Module {
 public:
  TanhImpl() : Module("Tanh") {}
  Tensor forward(const Tensor& x) override { return tanh(x); }
};
CSTORCH_MODULE(Tanh);

class SigmoidImpl : public Module {
 public:
  SigmoidImpl() : Module("Sigmoid") {}
  Tensor forward(const Tensor& x) override { return sigmoid(x); }
};
CSTORCH_MODULE(Sigmoid);

class DropoutImpl : public Module {
 public:
  explicit DropoutImpl(double p = 0.5);
  Tensor forward(const Tensor& x) override { return dropout(x, p_, is_training()); }

 private:
  double p_;
};
CSTORCH_MODULE(Dropout);

class LogSoftmaxImpl : public Module {
 public:
  explicit LogSoftmaxImpl(int64_t dim) : Module("LogSoftmax"), dim_(dim) {}
  Tensor forward(const Tensor& x) override { return log_softmax(x, dim_); }

 private:
  int64_t dim_;
};
CSTORCH_MODULE(LogSoftmax);

// Normalises over the trailing `normalized_shape` dims; weight ones, bias zeros.
class LayerNormImpl : public Module {
 public:
  explicit LayerNormImpl(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& x) override;
  Tensor weight, bias;

 private:
  Shape shape_;
  double eps_;
};
CSTORCH_MODULE(LayerNorm);

// Lookup table; weight [num, dim] ~ N(0, 1) (PyTorch default).
class EmbeddingImpl : public Module {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override { return embedding(indices, weight); }
  Tensor weight;
};
CSTORCH_MODULE(Embedding);

// Runs modules in order.
class SequentialImpl : public Module {
 public:
  SequentialImpl() : Module("Sequential") {}
  template <class... M>
  explicit SequentialImpl(M&&... mods) : Module("Sequential") {
    (push_back(std::forward<M>(mods).module()), ...);
  }
  void push_back(std::shared_ptr<Module> m);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return mods_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const { return mods_.at(i); }

 private:
  std::vector<std::shared_ptr<Module>> mods_;
};
class Sequential : public ModuleHolder<SequentialImpl> {
 public:
  Sequential() : ModuleHolder<SequentialImpl>() {}
  template <class... M>
  explicit Sequential(M&&... mods)
      : ModuleHolder<SequentialImpl>(std::make_shared<SequentialImpl>(std::forward<M>(mods)...)) {}
};

// A list of modules registered as "0", "1", ... (no forward of its own).
class ModuleListImpl : public Module {
 public:
  ModuleListImpl() : Module("ModuleList") {}
  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return mods_.size(); }
  std::shared_ptr<Module> operator[](size_t i) const { return mods_.at(i); }
  auto begin() const { return mods_.begin(); }
  auto end() const { return mods_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> mods_;
};
CSTORCH_MODULE(ModuleList);

// Initialisers (in place, no grad).
namespace init {
void uniform_(Tensor& t, double low, double high);
void normal_(Tensor& t, double mean, double std);
void zeros_(Tensor& t);
void ones_(Tensor& t);
void kaiming_uniform_(Tensor& t, double a = 0);  // fan_in, leaky_relu gain
void xavier_uniform_(Tensor& t, double gain = 1);
}  // namespace init

}  // namespace cstorch::nn
