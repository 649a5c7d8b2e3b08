// Internal: host batch_norm steps. Activations (x, y, dy, dx) are f32 or
// bf16, one dtype per call; the per-channel values are f32. See
// loom/kernels/batch_norm.hpp and NOTE [bf16 batch_norm] in batch_norm.cpp.
#pragma once

#include <cstdint>

#include "kernels/batch_norm_problem.hpp"
#include "loom/core/half.hpp"

namespace loom::kernels::cpu {

void batch_norm_stats(const detail::BatchNormShape& s, const float* x, float* sums);
void batch_norm_stats(const detail::BatchNormShape& s, const bfloat16* x, float* sums);
void batch_norm_finalize(int64_t channels, const float* sums, int64_t count, float eps,
                         float momentum, float* mean, float* invstd, float* running_mean,
                         float* running_var);
void batch_norm_eval_stats(int64_t channels, const float* running_mean, const float* running_var,
                           float eps, float* mean, float* invstd);
void batch_norm_normalize(const detail::BatchNormShape& s, const float* x, const float* mean,
                          const float* invstd, const float* weight, const float* bias, float* y);
void batch_norm_normalize(const detail::BatchNormShape& s, const bfloat16* x, const float* mean,
                          const float* invstd, const float* weight, const float* bias, bfloat16* y);
void batch_norm_backward_sums(const detail::BatchNormShape& s, const float* dy, const float* x,
                              const float* mean, const float* invstd, float* grad_sums);
void batch_norm_backward_sums(const detail::BatchNormShape& s, const bfloat16* dy,
                              const bfloat16* x, const float* mean, const float* invstd,
                              float* grad_sums);
void batch_norm_backward_input(const detail::BatchNormShape& s, const float* dy, const float* x,
                               const float* mean, const float* invstd, const float* weight,
                               const float* grad_sums, int64_t count, bool batch_stats, float* dx);
void batch_norm_backward_input(const detail::BatchNormShape& s, const bfloat16* dy,
                               const bfloat16* x, const float* mean, const float* invstd,
                               const float* weight, const float* grad_sums, int64_t count,
                               bool batch_stats, bfloat16* dx);

}  // namespace loom::kernels::cpu
