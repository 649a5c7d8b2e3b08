// Internal: host layer norm (f32). See loom/kernels/layer_norm.hpp.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

void layer_norm_forward(const float* x, const float* weight, const float* bias, float eps, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols);
void layer_norm_backward_input(const float* dy, const float* x, const float* weight,
                               const float* mean, const float* rstd, float* dx, int64_t rows,
                               int64_t cols);
void layer_norm_backward_weight(const float* dy, const float* x, const float* mean,
                                const float* rstd, float* dweight, float* dbias, int64_t rows,
                                int64_t cols, bool accumulate);

}  // namespace loom::kernels::cpu
