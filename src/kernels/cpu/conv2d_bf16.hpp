// Internal: host 2-D convolution on operands rounded to bf16, f32 tensors in
// and out (Conv2dParams::operands = bf16; see conv2d_bf16.cpp).
#pragma once

#include "kernels/conv2d_problem.hpp"

namespace loom::kernels::cpu {

// bias may be null.
void conv2d_forward_bf16(const detail::Conv2dProblem& p, const float* x, const float* w,
                         const float* bias, float* y);
void conv2d_backward_input_bf16(const detail::Conv2dProblem& p, const float* dy, const float* w,
                                float* dx);
// db may be null. accumulate: add to dw/db instead of overwriting.
void conv2d_backward_weight_bf16(const detail::Conv2dProblem& p, const float* x, const float* dy,
                                 float* dw, float* db, bool accumulate);

}  // namespace loom::kernels::cpu
