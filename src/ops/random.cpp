// Random draws (uniform, normal, bernoulli) from the global counter-based Philox generator.
// The generator state is one persistent i64 tensor {seed, offset}; each draw reads it as its
// only input and then advances the offset, so a replayed traced step draws fresh numbers.
#include <cstring>

#include "core/internal.h"
#include "ops/vjp.h"
#include "runtime/trace_context.h"

namespace cstorch {
namespace ops {

namespace {
// The shape and dtype of a draw are set by its creator (RandomAttrs carries no shape); this
// only checks the state input and the dtype.
void infer_draw(ir::Node& n, bool float_only) {
  CS_CHECK(n.inputs.size() == 1,
           "{}: expected the generator state as the only input, got {} "
           "inputs",
           n.name(), n.inputs.size());
  const auto& s = *n.inputs[0];
  CS_CHECK(s.dtype == DType::i64 && s.shape == Shape{2},
           "{}: the generator state must be i64 of shape [2], got {} of shape {}", n.name(),
           dtype_name(s.dtype), shape_str(s.shape));
  if (float_only)
    CS_CHECK(is_floating(n.dtype), "{}: dtype {} is not supported (floating-point dtypes only)",
             n.name(), dtype_name(n.dtype));
}
}  // namespace

void infer_RandUniform(ir::Node& n) {
  infer_draw(n, true);
}
void infer_RandNormal(ir::Node& n) {
  infer_draw(n, true);
}
void infer_Bernoulli(ir::Node& n) {
  infer_draw(n, false);
}
CS_NO_VJP(RandUniform)
CS_NO_VJP(RandNormal)
CS_NO_VJP(Bernoulli)

}  // namespace ops

namespace {

// The global generator state. Made directly as a constant node (what from_vector makes outside
// a trace) so that first use inside a trace still creates a persistent eager tensor rather
// than a node of that trace.
Tensor& generator_state() {
  static Tensor state = [] {
    auto buf = ir::Buffer::alloc(2 * sizeof(int64_t));
    std::memset(buf->data, 0, 2 * sizeof(int64_t));
    return make_tensor(detail::make_constant_node(std::move(buf), {2}, DType::i64));
  }();
  return state;
}

// One draw from the generator state (its only input), then the offset advances by one.
Tensor draw(ir::OpCode op, const Shape& s, DType dtype, ir::RandomAttrs attrs, const char* name,
            Device device) {
  if (op != ir::OpCode::Bernoulli)
    CS_CHECK(is_floating(dtype), "{}: dtype {} is not supported (floating-point dtypes only)", name,
             dtype_name(dtype));
  Tensor& state = generator_state();
  if (device.type == DeviceType::CSX) device = Device{};
  Tensor out = detail::dispatch(op, attrs, {state.to(device)}, detail::OutSpec{s, dtype, device});
  {
    NoGradGuard ng;
    detail::assign_inplace(state, add(state, from_vector(std::vector<int64_t>{0, 1}, {2})), "rng");
  }
  return out;
}

}  // namespace

namespace detail {
// A copy of the generator state for a kernel that draws by itself (attention dropout), then
// the offset advances like any draw. A copy, so that a backward pass reading it later sees the
// value the forward pass used, also eagerly (where the state's buffer is updated in place).
Tensor take_rng_state() {
  NoGradGuard ng;
  Tensor& state = generator_state();
  Tensor snapshot = detail::dispatch(ir::OpCode::Copy, ir::NoAttrs{}, {state});
  detail::assign_inplace(state, add(state, from_vector(std::vector<int64_t>{0, 1}, {2})), "rng");
  return snapshot;
}
}  // namespace detail

void manual_seed(uint64_t seed) {
  NoGradGuard ng;
  detail::assign_inplace(generator_state(),
                         from_vector(std::vector<int64_t>{static_cast<int64_t>(seed), 0}, {2}),
                         "manual_seed");
}

Tensor rand(const Shape& s, DType dtype, Device device) {
  return draw(ir::OpCode::RandUniform, s, dtype, ir::RandomAttrs{0.0, 1.0}, "rand", device);
}
Tensor randn(const Shape& s, DType dtype, Device device) {
  return draw(ir::OpCode::RandNormal, s, dtype, ir::RandomAttrs{0.0, 1.0}, "randn", device);
}
Tensor uniform(const Shape& s, double low, double high, DType dtype, Device device) {
  CS_CHECK(low <= high, "uniform: expects low <= high, got low={} high={}", low, high);
  return draw(ir::OpCode::RandUniform, s, dtype, ir::RandomAttrs{low, high}, "uniform", device);
}
Tensor normal(const Shape& s, double mean, double std, DType dtype, Device device) {
  CS_CHECK(std >= 0, "normal: expects std >= 0, got std={}", std);
  return draw(ir::OpCode::RandNormal, s, dtype, ir::RandomAttrs{mean, std}, "normal", device);
}
Tensor bernoulli(const Shape& s, double p, DType dtype, Device device) {
  CS_CHECK(p >= 0 && p <= 1, "bernoulli: expects p in [0, 1], got p={}", p);
  return draw(ir::OpCode::Bernoulli, s, dtype, ir::RandomAttrs{p, 0}, "bernoulli", device);
}

Tensor rng_state() {
  NoGradGuard ng;
  return detail::dispatch(ir::OpCode::Copy, ir::NoAttrs{}, {generator_state()});
}

void set_rng_state(const Tensor& t) {
  CS_CHECK(t.defined(), "set_rng_state: the state tensor is undefined");
  CS_CHECK(t.dtype() == DType::i64 && t.shape() == Shape{2},
           "set_rng_state: the state must be an i64 tensor of shape [2] (seed, offset) as "
           "returned by rng_state(), got {} of shape {}",
           dtype_name(t.dtype()), shape_str(t.shape()));
  NoGradGuard ng;
  // A copy, so later in-place changes of `t` do not move the generator.
  detail::assign_inplace(generator_state(), detail::dispatch(ir::OpCode::Copy, ir::NoAttrs{}, {t}),
                         "set_rng_state");
}

}  // namespace cstorch
