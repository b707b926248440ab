// Activation recomputation (gradient checkpointing), like torch.utils.checkpoint.
#pragma once
#include <functional>
#include <vector>

#include "cstorch/tensor.h"

namespace cstorch {

using CheckpointFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& inputs)>;

// Runs `fn(inputs)` without keeping its intermediate values for the backward pass: only
// `inputs`, the tensors requiring grad that `fn` reads from outside (its parameters) and the
// generator state are kept. The gradient rule of each output re-runs `fn` on the saved inputs
// (with grad on, the same autocast mode and the generator restored to where the first run
// started, so dropout draws the same numbers; afterwards the generator is put back) and
// back-propagates through the re-run. The results and gradients are bitwise those of
// `fn(inputs)` without checkpointing. Works eagerly and inside cstorch::trace: there the
// re-run is recorded in the backward part of the step's graph, behind a barrier op that keeps
// CSE from merging it with the first run, so the memory planner can free the first run's
// intermediates after the forward pass.
//
// `fn` must compute the same thing on every call: the same ops, reading the same tensors
// (captured by value or through objects that outlive the backward pass; module parameters
// are fine). In-place updates of state inside `fn` (batch-norm running statistics) happen
// again on the re-run. Under no-grad `fn` simply runs. Several outputs are differentiated
// together when the backward pass has all their gradients: one re-run, one pass through it.
// Errors: an empty `fn` or an undefined input; in the backward pass, a re-run that reads a
// tensor requiring grad which the first run did not read, or returns outputs of another number,
// shape or dtype.
std::vector<Tensor> checkpoint(const CheckpointFn& fn, const std::vector<Tensor>& inputs);

// One input, one output.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

}  // namespace cstorch
