// Internal: host cross-entropy (f32 logits, i32/i64 targets). See
// loom/kernels/cross_entropy.hpp; targets are range-checked by the dispatcher.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::cpu {

// The row of the first target outside [0, classes) that is not ignore_index, or -1.
int64_t first_bad_target(const void* targets, DType dtype, int64_t rows, int64_t classes,
                         int64_t ignore_index);

// Writes lse[rows]; returns the summed row losses and sets *count.
double cross_entropy_forward(const float* logits, const void* targets, DType dtype, int64_t rows,
                             int64_t classes, int64_t ignore_index, float* lse, int64_t* count);
// dlogits may be logits. scale = dloss / count.
void cross_entropy_backward(const float* logits, const void* targets, DType dtype, const float* lse,
                            int64_t rows, int64_t classes, int64_t ignore_index, float scale,
                            float* dlogits);

// Rows `stride` floats apart, their first `valid` columns (loom/kernels/cross_entropy.hpp).
void row_max(const float* logits, int64_t rows, int64_t stride, int64_t valid, float* max);
void row_sum_exp(const float* logits, int64_t rows, int64_t stride, int64_t valid,
                 const float* shift, float* sums);
void row_softmax(const float* logits, int64_t rows, int64_t stride, int64_t valid, const float* lse,
                 float scale, float* out);

}  // namespace loom::kernels::cpu
