// TEMPORARY development scaffold: weak definitions of the public ops so each op family can
// be built and tested while the others are written. Removed before the first commit that
// lands; strong definitions in src/ops/ override these.
#include "cstorch/tensor.h"
namespace cstorch {
__attribute__((weak)) void manual_seed(uint64_t) { fail("manual_seed: not built yet"); }
__attribute__((weak)) Tensor rand(const Shape&, DType) { fail("rand: not built yet"); }
__attribute__((weak)) Tensor randn(const Shape&, DType) { fail("randn: not built yet"); }
__attribute__((weak)) Tensor uniform(const Shape&, double, double, DType) { fail("uniform: not built yet"); }
__attribute__((weak)) Tensor normal(const Shape&, double, double, DType) { fail("normal: not built yet"); }
__attribute__((weak)) Tensor bernoulli(const Shape&, double, DType) { fail("bernoulli: not built yet"); }
__attribute__((weak)) Tensor rng_state() { fail("rng_state: not built yet"); }
__attribute__((weak)) void set_rng_state(const Tensor&) { fail("set_rng_state: not built yet"); }
__attribute__((weak)) Tensor neg(const Tensor&) { fail("neg: not built yet"); }
__attribute__((weak)) Tensor abs(const Tensor&) { fail("abs: not built yet"); }
__attribute__((weak)) Tensor sign(const Tensor&) { fail("sign: not built yet"); }
__attribute__((weak)) Tensor exp(const Tensor&) { fail("exp: not built yet"); }
__attribute__((weak)) Tensor log(const Tensor&) { fail("log: not built yet"); }
__attribute__((weak)) Tensor sqrt(const Tensor&) { fail("sqrt: not built yet"); }
__attribute__((weak)) Tensor rsqrt(const Tensor&) { fail("rsqrt: not built yet"); }
__attribute__((weak)) Tensor reciprocal(const Tensor&) { fail("reciprocal: not built yet"); }
__attribute__((weak)) Tensor tanh(const Tensor&) { fail("tanh: not built yet"); }
__attribute__((weak)) Tensor sigmoid(const Tensor&) { fail("sigmoid: not built yet"); }
__attribute__((weak)) Tensor relu(const Tensor&) { fail("relu: not built yet"); }
__attribute__((weak)) Tensor gelu(const Tensor&, bool) { fail("gelu: not built yet"); }
__attribute__((weak)) Tensor silu(const Tensor&) { fail("silu: not built yet"); }
__attribute__((weak)) Tensor erf(const Tensor&) { fail("erf: not built yet"); }
__attribute__((weak)) Tensor isfinite(const Tensor&) { fail("isfinite: not built yet"); }
__attribute__((weak)) Tensor logical_not(const Tensor&) { fail("logical_not: not built yet"); }
__attribute__((weak)) Tensor cast(const Tensor&, DType) { fail("cast: not built yet"); }
__attribute__((weak)) Tensor add(const Tensor&, const Tensor&) { fail("add: not built yet"); }
__attribute__((weak)) Tensor sub(const Tensor&, const Tensor&) { fail("sub: not built yet"); }
__attribute__((weak)) Tensor mul(const Tensor&, const Tensor&) { fail("mul: not built yet"); }
__attribute__((weak)) Tensor div(const Tensor&, const Tensor&) { fail("div: not built yet"); }
__attribute__((weak)) Tensor pow(const Tensor&, const Tensor&) { fail("pow: not built yet"); }
__attribute__((weak)) Tensor pow(const Tensor&, double) { fail("pow: not built yet"); }
__attribute__((weak)) Tensor pow(double, const Tensor&) { fail("pow: not built yet"); }
__attribute__((weak)) Tensor maximum(const Tensor&, const Tensor&) { fail("maximum: not built yet"); }
__attribute__((weak)) Tensor minimum(const Tensor&, const Tensor&) { fail("minimum: not built yet"); }
__attribute__((weak)) Tensor eq(const Tensor&, const Tensor&) { fail("eq: not built yet"); }
__attribute__((weak)) Tensor ne(const Tensor&, const Tensor&) { fail("ne: not built yet"); }
__attribute__((weak)) Tensor lt(const Tensor&, const Tensor&) { fail("lt: not built yet"); }
__attribute__((weak)) Tensor le(const Tensor&, const Tensor&) { fail("le: not built yet"); }
__attribute__((weak)) Tensor gt(const Tensor&, const Tensor&) { fail("gt: not built yet"); }
__attribute__((weak)) Tensor ge(const Tensor&, const Tensor&) { fail("ge: not built yet"); }
__attribute__((weak)) Tensor logical_and(const Tensor&, const Tensor&) { fail("logical_and: not built yet"); }
__attribute__((weak)) Tensor logical_or(const Tensor&, const Tensor&) { fail("logical_or: not built yet"); }
__attribute__((weak)) Tensor logical_xor(const Tensor&, const Tensor&) { fail("logical_xor: not built yet"); }
__attribute__((weak)) Tensor where(const Tensor&, const Tensor&, const Tensor&) { fail("where: not built yet"); }
__attribute__((weak)) Tensor where(const Tensor&, const Tensor&, double) { fail("where: not built yet"); }
__attribute__((weak)) Tensor where(const Tensor&, double, const Tensor&) { fail("where: not built yet"); }
__attribute__((weak)) Tensor clamp(const Tensor&, std::optional<double>, std::optional<double>) { fail("clamp: not built yet"); }
__attribute__((weak)) Tensor operator+(const Tensor&, const Tensor&) { fail("operator+: not built yet"); }
__attribute__((weak)) Tensor operator-(const Tensor&, const Tensor&) { fail("operator-: not built yet"); }
__attribute__((weak)) Tensor operator*(const Tensor&, const Tensor&) { fail("operator*: not built yet"); }
__attribute__((weak)) Tensor operator/(const Tensor&, const Tensor&) { fail("operator/: not built yet"); }
__attribute__((weak)) Tensor operator-(const Tensor&) { fail("operator-: not built yet"); }
__attribute__((weak)) Tensor operator+(const Tensor&, double) { fail("operator+: not built yet"); }
__attribute__((weak)) Tensor operator-(const Tensor&, double) { fail("operator-: not built yet"); }
__attribute__((weak)) Tensor operator*(const Tensor&, double) { fail("operator*: not built yet"); }
__attribute__((weak)) Tensor operator/(const Tensor&, double) { fail("operator/: not built yet"); }
__attribute__((weak)) Tensor operator+(double, const Tensor&) { fail("operator+: not built yet"); }
__attribute__((weak)) Tensor operator-(double, const Tensor&) { fail("operator-: not built yet"); }
__attribute__((weak)) Tensor operator*(double, const Tensor&) { fail("operator*: not built yet"); }
__attribute__((weak)) Tensor operator/(double, const Tensor&) { fail("operator/: not built yet"); }
__attribute__((weak)) Tensor operator==(const Tensor&, const Tensor&) { fail("operator==: not built yet"); }
__attribute__((weak)) Tensor operator!=(const Tensor&, const Tensor&) { fail("operator!=: not built yet"); }
__attribute__((weak)) Tensor operator<(const Tensor&, const Tensor&) { fail("operator<: not built yet"); }
__attribute__((weak)) Tensor operator<=(const Tensor&, const Tensor&) { fail("operator<=: not built yet"); }
__attribute__((weak)) Tensor operator>(const Tensor&, const Tensor&) { fail("operator>: not built yet"); }
__attribute__((weak)) Tensor operator>=(const Tensor&, const Tensor&) { fail("operator>=: not built yet"); }
__attribute__((weak)) Tensor operator>(const Tensor&, double) { fail("operator>: not built yet"); }
__attribute__((weak)) Tensor operator<(const Tensor&, double) { fail("operator<: not built yet"); }
__attribute__((weak)) Tensor operator>=(const Tensor&, double) { fail("operator>=: not built yet"); }
__attribute__((weak)) Tensor operator<=(const Tensor&, double) { fail("operator<=: not built yet"); }
__attribute__((weak)) Tensor operator==(const Tensor&, double) { fail("operator==: not built yet"); }
__attribute__((weak)) Tensor sum(const Tensor&, std::vector<int64_t>, bool) { fail("sum: not built yet"); }
__attribute__((weak)) Tensor mean(const Tensor&, std::vector<int64_t>, bool) { fail("mean: not built yet"); }
__attribute__((weak)) Tensor amax(const Tensor&, std::vector<int64_t>, bool) { fail("amax: not built yet"); }
__attribute__((weak)) Tensor amin(const Tensor&, std::vector<int64_t>, bool) { fail("amin: not built yet"); }
__attribute__((weak)) Tensor max(const Tensor&, std::vector<int64_t>, bool) { fail("max: not built yet"); }
__attribute__((weak)) Tensor min(const Tensor&, std::vector<int64_t>, bool) { fail("min: not built yet"); }
__attribute__((weak)) Tensor argmax(const Tensor&, std::optional<int64_t>, bool) { fail("argmax: not built yet"); }
__attribute__((weak)) Tensor var(const Tensor&, std::vector<int64_t>, double, bool) { fail("var: not built yet"); }
__attribute__((weak)) Tensor logsumexp(const Tensor&, std::vector<int64_t>, bool) { fail("logsumexp: not built yet"); }
__attribute__((weak)) Tensor norm(const Tensor&, double, std::vector<int64_t>, bool) { fail("norm: not built yet"); }
__attribute__((weak)) Tensor matmul(const Tensor&, const Tensor&) { fail("matmul: not built yet"); }
__attribute__((weak)) Tensor linear(const Tensor&, const Tensor&, const Tensor&) { fail("linear: not built yet"); }
__attribute__((weak)) Tensor softmax(const Tensor&, int64_t) { fail("softmax: not built yet"); }
__attribute__((weak)) Tensor log_softmax(const Tensor&, int64_t) { fail("log_softmax: not built yet"); }
__attribute__((weak)) Tensor nll_loss(const Tensor&, const Tensor&, int64_t, Reduction) { fail("nll_loss: not built yet"); }
__attribute__((weak)) Tensor cross_entropy(const Tensor&, const Tensor&, int64_t, double, Reduction) { fail("cross_entropy: not built yet"); }
__attribute__((weak)) Tensor mse_loss(const Tensor&, const Tensor&, Reduction) { fail("mse_loss: not built yet"); }
__attribute__((weak)) Tensor layer_norm(const Tensor&, const Shape&, const Tensor&, const Tensor&, double) { fail("layer_norm: not built yet"); }
__attribute__((weak)) Tensor embedding(const Tensor&, const Tensor&) { fail("embedding: not built yet"); }
__attribute__((weak)) Tensor dropout(const Tensor&, double, bool) { fail("dropout: not built yet"); }
__attribute__((weak)) Tensor reshape(const Tensor&, const Shape&) { fail("reshape: not built yet"); }
__attribute__((weak)) Tensor transpose(const Tensor&, int64_t, int64_t) { fail("transpose: not built yet"); }
__attribute__((weak)) Tensor permute(const Tensor&, const std::vector<int64_t>&) { fail("permute: not built yet"); }
__attribute__((weak)) Tensor expand(const Tensor&, const Shape&) { fail("expand: not built yet"); }
__attribute__((weak)) Tensor broadcast_to(const Tensor&, const Shape&) { fail("broadcast_to: not built yet"); }
__attribute__((weak)) Tensor squeeze(const Tensor&, std::optional<int64_t>) { fail("squeeze: not built yet"); }
__attribute__((weak)) Tensor unsqueeze(const Tensor&, int64_t) { fail("unsqueeze: not built yet"); }
__attribute__((weak)) Tensor flatten(const Tensor&, int64_t, int64_t) { fail("flatten: not built yet"); }
__attribute__((weak)) Tensor slice(const Tensor&, int64_t, int64_t, int64_t, int64_t) { fail("slice: not built yet"); }
__attribute__((weak)) std::vector<Tensor> split(const Tensor&, int64_t, int64_t) { fail("split: not built yet"); }
__attribute__((weak)) std::vector<Tensor> split(const Tensor&, const std::vector<int64_t>&, int64_t) { fail("split: not built yet"); }
__attribute__((weak)) Tensor cat(const std::vector<Tensor>&, int64_t) { fail("cat: not built yet"); }
__attribute__((weak)) Tensor stack(const std::vector<Tensor>&, int64_t) { fail("stack: not built yet"); }
__attribute__((weak)) Tensor index_select(const Tensor&, int64_t, const Tensor&) { fail("index_select: not built yet"); }
__attribute__((weak)) Tensor index_add(const Tensor&, int64_t, const Tensor&, const Tensor&) { fail("index_add: not built yet"); }
__attribute__((weak)) Tensor gather(const Tensor&, int64_t, const Tensor&) { fail("gather: not built yet"); }
__attribute__((weak)) Tensor scatter_add(const Tensor&, int64_t, const Tensor&, const Tensor&) { fail("scatter_add: not built yet"); }
__attribute__((weak)) Tensor masked_fill(const Tensor&, const Tensor&, double) { fail("masked_fill: not built yet"); }
__attribute__((weak)) Tensor triu(const Tensor&, int64_t) { fail("triu: not built yet"); }
__attribute__((weak)) Tensor tril(const Tensor&, int64_t) { fail("tril: not built yet"); }
__attribute__((weak)) Tensor sum_to(const Tensor&, const Shape&) { fail("sum_to: not built yet"); }
}
