// Internal: host layer norm (f32). See loom/kernels/layer_norm.hpp.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::cpu {

void layer_norm_forward(const float* x, const float* weight, const float* bias, float eps, float* y,
                        float* mean, float* rstd, int64_t rows, int64_t cols);
void layer_norm_backward_input(const float* dy, const float* x, const float* weight,
                               const float* mean, const float* rstd, float* dx, int64_t rows,
                               int64_t cols);
void layer_norm_backward_weight(const float* dy, const float* x, const float* mean,
                                const float* rstd, float* dweight, float* dbias, int64_t rows,
                                int64_t cols, bool accumulate);

// The same with x, y, dy and dx of `dtype` (f32, bf16 or f16; weights,
// statistics and weight gradients stay f32): 16-bit rows are converted to f32
// a block of rows at a time, computed by the f32 code, and rounded once.
void layer_norm_forward(const void* x, DType dtype, const float* weight, const float* bias,
                        float eps, void* y, float* mean, float* rstd, int64_t rows, int64_t cols);
void layer_norm_backward_input(const void* dy, const void* x, DType dtype, const float* weight,
                               const float* mean, const float* rstd, void* dx, int64_t rows,
                               int64_t cols);
void layer_norm_backward_weight(const void* dy, const void* x, DType dtype, const float* mean,
                                const float* rstd, float* dweight, float* dbias, int64_t rows,
                                int64_t cols, bool accumulate);

}  // namespace loom::kernels::cpu
