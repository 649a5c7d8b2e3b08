// Internal (CUDA): pooling, f32. See loom/kernels/pool2d.hpp.
// Declarations only, so host-compiled dispatch code can include it.
#pragma once

#include <cstdint>

#include "kernels/pool2d_problem.hpp"
#include "loom/core/stream.hpp"

namespace loom::kernels::cuda {

void max_pool2d_forward(const detail::Pool2dProblem& p, const float* x, float* y, int32_t* argmax,
                        const Stream& stream);
void max_pool2d_backward(const detail::Pool2dProblem& p, const float* dy, const int32_t* argmax,
                         float* dx, const Stream& stream);
void avg_pool2d_forward(const detail::Pool2dProblem& p, const float* x, float* y,
                        const Stream& stream);
void avg_pool2d_backward(const detail::Pool2dProblem& p, const float* dy, float* dx,
                         const Stream& stream);
void global_avg_pool_forward(int64_t planes, int64_t plane, const float* x, float* y,
                             const Stream& stream);
void global_avg_pool_backward(int64_t planes, int64_t plane, const float* dy, float* dx,
                              const Stream& stream);

}  // namespace loom::kernels::cuda
