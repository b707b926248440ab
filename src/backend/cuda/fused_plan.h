// Which Fused programs the CUDA backend's interpreter (kernels/fused.cu) runs, and the
// translation of a Fused node into the kernel's plain program struct. Plain C++ without CUDA
// headers, built in every configuration, so the answers are tested on machines without a GPU.
#pragma once
#include <string>

#include "backend/cuda/kernels/random_fused_launch.h"
#include "ir/attrs.h"
#include "ir/node.h"

namespace cstorch::cuda {

// Whether the GPU interpreter runs `op` as an instruction: every kFusable op of ops.def (the
// CPU interpreter's instruction set).
bool cuda_fuses(ir::OpCode op);

// Whether the interpreter runs this program: instructions it has, 1 to 3 arguments each,
// reading only registers already written, within kFusedRegs registers for `ninputs` inputs.
// False with the reason in *why (when not null).
bool fused_program_supported(const ir::FusedAttrs& a, int ninputs, std::string* why);

// The number of arguments instruction `f` reads (the CPU interpreter's contract): 1 to 3.
int fused_arity(k::FOp f);

// Empty when the Fused kernel runs node `n` (its program, an f32 or bf16 result as the program
// says, f32, bf16 or bool inputs each in the (i / div) % mod broadcast form); otherwise why not.
// For cuda::unsupported.
std::string fused_unsupported(const ir::Node& n);

// The kernel's program for node `n` (which fused_unsupported accepts), input pointers left null
// for the caller to fill.
k::FusedProgram fused_program(const ir::Node& n);

}  // namespace cstorch::cuda
