// What the CUDA attention kernels (kernels/attention.cu) need and take, answered in plain C++ so
// that it is built and testable in every configuration, CUDA toolkit or not: the planned
// workspace of a node, and why a node cannot run (for the capability check).
#pragma once
#include <cstddef>
#include <string>

#include "ir/node.h"

namespace cstorch::cuda {

// Bytes of planned scratch an Attention / AttentionGrad node needs: 0 for the forward; for the
// backward the row max, row sum and rowsum(dO * O) of every query row (3 floats per (b, h, i)).
// 0 for any other op.
size_t attention_workspace_bytes(const ir::Node& n);

// "" when the CUDA kernels run this Attention / AttentionGrad node; otherwise why not, starting
// with the op's name (dtypes other than f32 for q, k, v, bias, O and dO, a mask that is not
// bool, head sizes beyond the kernels' limit).
std::string attention_unsupported(const ir::Node& n);

}  // namespace cstorch::cuda
