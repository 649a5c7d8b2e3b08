// Internal: the input gradient of a convolution computed as forward
// convolutions of dy on the implicit GEMM (see conv2d_transposed.cpp), with no
// dcol matrix and no col2im.
#pragma once

#include "kernels/conv2d_problem.hpp"

namespace loom::kernels::cpu {

// Writes dx for `p` and returns true, or returns false without touching dx
// where this way does not apply (the caller then runs im2col's adjoint).
bool conv2d_backward_input_as_forward(const detail::Conv2dProblem& p, const float* dy,
                                      const float* w, float* dx);

}  // namespace loom::kernels::cpu
