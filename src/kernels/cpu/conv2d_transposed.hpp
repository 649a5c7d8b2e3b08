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

// At stride 1 with a square kernel and padding <= k - 1, dx is the forward
// convolution of dy with the kernel turned by 180 degrees and its channels
// swapped, padded by k - 1 - padding: that convolution's problem.
bool stride_one_transposable(const detail::Conv2dProblem& p);
detail::Conv2dProblem stride_one_transposed(const detail::Conv2dProblem& p);

}  // namespace loom::kernels::cpu
