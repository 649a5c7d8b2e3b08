// Internal: host pooling, f32. See loom/kernels/pool2d.hpp.
#pragma once

#include <cstdint>

#include "kernels/pool2d_problem.hpp"

namespace loom::kernels::cpu {

void max_pool2d_forward(const detail::Pool2dProblem& p, const float* x, float* y, int32_t* argmax);
void max_pool2d_backward(const detail::Pool2dProblem& p, const float* dy, const int32_t* argmax,
                         float* dx);
void avg_pool2d_forward(const detail::Pool2dProblem& p, const float* x, float* y);
void avg_pool2d_backward(const detail::Pool2dProblem& p, const float* dy, float* dx);
// x: planes of `plane` elements -> one mean per plane, and back.
void global_avg_pool_forward(int64_t planes, int64_t plane, const float* x, float* y);
void global_avg_pool_backward(int64_t planes, int64_t plane, const float* dy, float* dx);

}  // namespace loom::kernels::cpu
