// ToDevice: a tensor's value on another device (Tensor::to(Device)). Its kernel is the core's
// transfer kernel (ir::kernel_for), which reads the source device and writes the destination.
#include "ops/vjp.h"

namespace cstorch::ops {

void infer_ToDevice(ir::Node& n) {
  CS_CHECK(n.inputs.size() == 1, "to_device: takes one input");
  n.shape = n.inputs[0]->shape;
  n.dtype = n.inputs[0]->dtype;
  n.device = n.attr<ir::DeviceAttrs>().device;
}

// The gradient flows back across the transfer, to the input's device.
std::vector<Tensor> vjp_ToDevice(const VjpArgs& a) {
  return {a.grad.to(a.inputs[0].device())};
}

}  // namespace cstorch::ops
