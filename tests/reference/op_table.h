// The table of reference rows checked against PyTorch by test_ops_reference.cpp: one row per
// case. A row names its inputs (shape, dtype, value generator, whether it requires grad), the
// cstorch computation, the same computation as a Python expression over `x` (the list of
// input tensors; `torch` and `F` = torch.nn.functional are in scope), a tolerance and flags.
//
//   {"gelu_tanh", {{2, 3, 4}}, [](const In& x) { return cs::gelu(x[0], true); },
//    "F.gelu(x[0], approximate='tanh')"},
//
// Float inputs are rebuilt in float64 on the Python side (so the reference is computed in
// float64) unless the row has kNative; the cstorch result is then compared elementwise:
// |got - ref| <= atol + rtol * |ref| (atol scaled by max|ref| of that tensor with kNormTol).
// Integer and bool outputs must match exactly, and every output's dtype must match torch's.
// The lambda runs eagerly and inside cs::trace (grad inputs are then captured leaves, the
// others step inputs), so it must not read tensor values. Inputs: a bare shape, or normal(),
// uni(), pos(), nz(), idx(), mask(), vals(), typed(), nograd() below.
//
// Every row also runs on every other registered device (the tests' checking device) and must
// give the CPU's outputs and gradients there: the harness moves the inputs with .to(device), so
// a row is written once for all devices; a tensor the row creates itself is made on x.device
// (creation functions take it; arange, scalar_tensor and from_vector are moved with .to).
// Random rows (rand, dropout) have no torch expression (py empty: torch cannot reproduce the
// Philox draws; test_random_ops.cpp checks their distributions): the harness seeds the
// generator before each run, so they are checked eager against traced and against the CPU on
// every device.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "cstorch/tensor.h"

namespace cstorch::reftest {

namespace cs = ::cstorch;

// A row's inputs, already on the device the row runs on (`device`; the CPU is Device{}).
struct In : std::vector<Tensor> {
  using std::vector<Tensor>::vector;
  Device device;
};

enum class Gen {
  normal,    // N(0, 1)
  uniform,   // U[lo, hi)
  nonzero,   // magnitude U[0.5, 2), random sign (denominators)
  integer,   // integers in [lo, hi) (i64 unless dtype says otherwise)
  mask,      // bool, true with probability 1/2
  explicit_  // the values in `data`
};

// One input of a row. A bare shape `{2, 3}` is an f32 N(0, 1) input that requires grad.
struct Arg {
  Shape shape;
  DType dtype = DType::f32;
  Gen gen = Gen::normal;
  double lo = 0, hi = 1;
  bool grad = true;          // only meaningful for floating inputs of differentiable rows
  std::vector<double> data;  // Gen::explicit_

  Arg() = default;
  Arg(std::initializer_list<int64_t> s) : shape(s) {}
  explicit Arg(Shape s) : shape(std::move(s)) {}
};

// Input constructors for the table.
inline Arg normal(Shape s) {
  return Arg(std::move(s));
}
inline Arg uni(Shape s, double lo, double hi) {
  Arg a(std::move(s));
  a.gen = Gen::uniform;
  a.lo = lo;
  a.hi = hi;
  return a;
}
inline Arg pos(Shape s) {
  return uni(std::move(s), 0.5, 2.0);
}  // for log, sqrt, pow bases
inline Arg nz(Shape s) {
  Arg a(std::move(s));
  a.gen = Gen::nonzero;
  return a;
}
inline Arg idx(Shape s, int64_t lo, int64_t hi, DType t = DType::i64) {
  Arg a(std::move(s));
  a.gen = Gen::integer;
  a.lo = static_cast<double>(lo);
  a.hi = static_cast<double>(hi);
  a.dtype = t;
  a.grad = false;
  return a;
}
inline Arg mask(Shape s) {
  Arg a(std::move(s));
  a.gen = Gen::mask;
  a.dtype = DType::boolean;
  a.grad = false;
  return a;
}
inline Arg vals(std::vector<double> v, Shape s, DType t = DType::f32) {
  Arg a(std::move(s));
  a.gen = Gen::explicit_;
  a.data = std::move(v);
  a.dtype = t;
  a.grad = is_floating(t);
  return a;
}
inline Arg typed(Arg a, DType t) {
  a.dtype = t;
  if (!is_floating(t)) a.grad = false;
  return a;
}
inline Arg nograd(Arg a) {
  a.grad = false;
  return a;
}

// A row's outputs: one tensor or several (split).
struct Outs {
  std::vector<Tensor> v;
  Outs(Tensor t) : v{std::move(t)} {}
  Outs(std::vector<Tensor> ts) : v(std::move(ts)) {}
};

struct Tol {
  double rtol = 1e-5;
  double atol = 1e-6;
};

enum Flags : unsigned {
  kNoGrad = 1u << 0,   // forward only (not differentiable, or integer/bool outputs)
  kNative = 1u << 1,   // torch computes in the row's own dtypes, not float64
  kNormTol = 1u << 2,  // atol is relative to max|ref| of each output (long dot products)
};

struct Row {
  std::string name;  // unique; letters, digits and '_' (it names the gtest)
  std::vector<Arg> inputs;
  std::function<Outs(const In&)> fn;
  std::string py;  // Python expression over x (a tensor, or a tuple/list of tensors); "": none
  Tol tol = {};
  unsigned flags = 0;
};

const std::vector<Row>& op_table();

}  // namespace cstorch::reftest
