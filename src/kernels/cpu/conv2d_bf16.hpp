// Internal: host 2-D convolution on operands rounded to bf16 with f32
// accumulation (Conv2dParams::operands = bf16; see conv2d_bf16.cpp). The
// weight, the bias and their gradients are f32; the input and the output
// gradient are f32 (rounded here) or bf16 (taken as they are); the output and
// the input gradient are written in f32 (kernels/conv2d.cpp rounds them for
// a bf16 tensor).
#pragma once

#include "kernels/conv2d_problem.hpp"
#include "kernels/cpu/conv2d_bf16_operands.hpp"

namespace loom::kernels::cpu {

// bias may be null.
void conv2d_forward_bf16(const detail::Conv2dProblem& p, bf16_operands::Activations x,
                         const float* w, const float* bias, float* y);
void conv2d_backward_input_bf16(const detail::Conv2dProblem& p, bf16_operands::Activations dy,
                                const float* w, float* dx);
// db may be null. accumulate: add to dw/db instead of overwriting.
void conv2d_backward_weight_bf16(const detail::Conv2dProblem& p, bf16_operands::Activations x,
                                 bf16_operands::Activations dy, float* dw, float* db,
                                 bool accumulate);

}  // namespace loom::kernels::cpu
