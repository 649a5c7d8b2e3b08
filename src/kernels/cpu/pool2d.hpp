// Internal: host pooling, f32 or bf16 (one dtype per call; bf16 widened to
// f32, accumulated in f32 and rounded once). See loom/kernels/pool2d.hpp.
#pragma once

#include <cstdint>

#include "kernels/pool2d_problem.hpp"
#include "loom/core/half.hpp"

namespace loom::kernels::cpu {

void max_pool2d_forward(const detail::Pool2dProblem& p, const float* x, float* y, int32_t* argmax);
void max_pool2d_forward(const detail::Pool2dProblem& p, const bfloat16* x, bfloat16* y,
                        int32_t* argmax);
void max_pool2d_backward(const detail::Pool2dProblem& p, const float* dy, const int32_t* argmax,
                         float* dx);
void max_pool2d_backward(const detail::Pool2dProblem& p, const bfloat16* dy, const int32_t* argmax,
                         bfloat16* dx);
void avg_pool2d_forward(const detail::Pool2dProblem& p, const float* x, float* y);
void avg_pool2d_forward(const detail::Pool2dProblem& p, const bfloat16* x, bfloat16* y);
void avg_pool2d_backward(const detail::Pool2dProblem& p, const float* dy, float* dx);
void avg_pool2d_backward(const detail::Pool2dProblem& p, const bfloat16* dy, bfloat16* dx);
// x: planes of `plane` elements -> one mean per plane, and back.
void global_avg_pool_forward(int64_t planes, int64_t plane, const float* x, float* y);
void global_avg_pool_forward(int64_t planes, int64_t plane, const bfloat16* x, bfloat16* y);
void global_avg_pool_backward(int64_t planes, int64_t plane, const float* dy, float* dx);
void global_avg_pool_backward(int64_t planes, int64_t plane, const bfloat16* dy, bfloat16* dx);

}  // namespace loom::kernels::cpu
