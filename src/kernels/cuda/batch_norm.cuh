// Internal (CUDA): batch_norm steps; activations f32 or bf16 (`dtype`), the
// per-channel tensors f32. See loom/kernels/batch_norm.hpp.
// Declarations only, so host-compiled dispatch code can include it. Each
// queues its kernels on `stream`, whose device must be current; stats and
// backward_sums take their partial sums from the device's allocator on
// `stream` (NOTE [split reductions] in bias.cu).
#pragma once

#include <cstdint>

#include "kernels/batch_norm_problem.hpp"
#include "loom/core/dtype.hpp"
#include "loom/core/stream.hpp"

namespace loom::kernels::cuda {

void batch_norm_stats(const detail::BatchNormShape& s, const void* x, DType dtype, float* sums,
                      const Stream& stream);
void batch_norm_finalize(int64_t channels, const float* sums, int64_t count, float eps,
                         float momentum, float* mean, float* invstd, float* running_mean,
                         float* running_var, const Stream& stream);
void batch_norm_eval_stats(int64_t channels, const float* running_mean, const float* running_var,
                           float eps, float* mean, float* invstd, const Stream& stream);
void batch_norm_normalize(const detail::BatchNormShape& s, const void* x, DType dtype,
                          const float* mean, const float* invstd, const float* weight,
                          const float* bias, void* y, const Stream& stream);
void batch_norm_backward_sums(const detail::BatchNormShape& s, const void* dy, const void* x,
                              DType dtype, const float* mean, const float* invstd, float* grad_sums,
                              const Stream& stream);
void batch_norm_backward_input(const detail::BatchNormShape& s, const void* dy, const void* x,
                               DType dtype, const float* mean, const float* invstd,
                               const float* weight, const float* grad_sums, int64_t count,
                               bool batch_stats, void* dx, const Stream& stream);

}  // namespace loom::kernels::cuda
