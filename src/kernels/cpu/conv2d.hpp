// Internal: host 2-D convolution, f32 (implicit GEMM on the packed AVX-512 GEMM,
// else im2col + GEMM; see conv2d.cpp). See kernels/conv2d_problem.hpp.
#pragma once

#include <cstdint>

#include "kernels/conv2d_problem.hpp"

namespace loom::kernels::cpu {

// bias may be null.
void conv2d_forward(const detail::Conv2dProblem& p, const float* x, const float* w,
                    const float* bias, float* y);
void conv2d_backward_input(const detail::Conv2dProblem& p, const float* dy, const float* w,
                           float* dx);
// db may be null. accumulate: add to dw/db instead of overwriting.
void conv2d_backward_weight(const detail::Conv2dProblem& p, const float* x, const float* dy,
                            float* dw, float* db, bool accumulate);

// The bias of p added to `images` NCHW outputs y, and the bias gradient db
// (+)= the sums of dy over images and positions: the f32 and the bf16-operand
// convolutions (conv2d_bf16.cpp) share them.
void add_conv2d_bias(const detail::Conv2dProblem& p, const float* bias, int64_t images, float* y);
void conv2d_bias_gradient(const detail::Conv2dProblem& p, const float* dy, float* db,
                          bool accumulate);

}  // namespace loom::kernels::cpu
