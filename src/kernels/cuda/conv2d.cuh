// Internal (CUDA): 2-D convolution through cuDNN. See kernels/conv2d_problem.hpp.
// Declarations only, so host-compiled dispatch code can include it.
#pragma once

#include "kernels/conv2d_problem.hpp"
#include "loom/core/stream.hpp"

namespace loom::kernels::cuda {

// Each queues its pass on `stream`, whose device must be current. bias / db may be null.
void conv2d_forward(const detail::Conv2dProblem& p, const void* x, const void* w, const void* bias,
                    void* y, const Stream& stream);
void conv2d_backward_input(const detail::Conv2dProblem& p, const void* dy, const void* w, void* dx,
                           const Stream& stream);
void conv2d_backward_weight(const detail::Conv2dProblem& p, const void* x, const void* dy, void* dw,
                            void* db, bool accumulate, const Stream& stream);

}  // namespace loom::kernels::cuda
