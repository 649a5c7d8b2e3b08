// Internal: host 2-D convolution on operands rounded to bf16 with f32
// accumulation (Conv2dParams::operands = bf16; see conv2d_bf16.cpp). The
// weight, the bias and their gradients are f32; the input and the output
// gradient are f32 (rounded here) or bf16 (taken as they are); the output and
// the input gradient are f32 or bf16 (rounded once from the f32 sums).
#pragma once

#include "kernels/conv2d_problem.hpp"
#include "kernels/cpu/conv2d_bf16_operands.hpp"

namespace loom::kernels::cpu {

// Where a pass writes its output or input gradient: f32 values, or bf16 bits
// rounded once from the f32 results.
struct Conv2dResults {
  void* data;
  bool bf16;
};

// bias may be null.
void conv2d_forward_bf16(const detail::Conv2dProblem& p, bf16_operands::Activations x,
                         const float* w, const float* bias, Conv2dResults y);
void conv2d_backward_input_bf16(const detail::Conv2dProblem& p, bf16_operands::Activations dy,
                                const float* w, Conv2dResults dx);
// db may be null. accumulate: add to dw/db instead of overwriting.
void conv2d_backward_weight_bf16(const detail::Conv2dProblem& p, bf16_operands::Activations x,
                                 bf16_operands::Activations dy, float* dw, float* db,
                                 bool accumulate);

}  // namespace loom::kernels::cpu
