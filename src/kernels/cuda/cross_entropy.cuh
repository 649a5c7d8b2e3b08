// Internal (CUDA): cross-entropy (f32 or bf16 logits, i32/i64 targets). Declarations
// only, so host-compiled dispatch code can include it.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::cuda {

// Queued on `stream` (a cudaStream_t); the device is current; rows, classes >= 1.
// Logits are f32 or bf16 (`logits_dtype`, dlogits alike), targets i32 or i64
// (`dtype`). row_loss is scratch for `rows` floats; loss and count are
// 1-element outputs.
void cross_entropy_forward(const void* logits, DType logits_dtype, const void* targets, DType dtype,
                           int64_t rows, int64_t classes, int64_t ignore_index, float* lse,
                           float* row_loss, float* loss, float* count, void* stream);
// dlogits may be logits; the scale dloss / count is computed on the device.
void cross_entropy_backward(const void* logits, DType logits_dtype, const void* targets,
                            DType dtype, const float* lse, const float* count, float dloss,
                            int64_t rows, int64_t classes, int64_t ignore_index, void* dlogits,
                            void* stream);

// The vocabulary-parallel pieces (loom/kernels/cross_entropy.hpp): logits f32
// or bf16 (`dtype`) [rows, stride], dlogits alike; rows may be 0.
void row_max(const void* logits, DType dtype, int64_t rows, int64_t stride, int64_t valid,
             float* max, void* stream);
void row_sum_exp(const void* logits, DType dtype, int64_t rows, int64_t stride, int64_t valid,
                 const float* shift, float* sums, void* stream);
void row_pick(const void* logits, DType dtype, int64_t rows, int64_t stride, const int64_t* columns,
              float* out, void* stream);
void row_gradient(const void* logits, DType dtype, int64_t rows, int64_t stride, int64_t valid,
                  const float* lse, const int64_t* columns, float scale, void* dlogits,
                  void* stream);

}  // namespace loom::kernels::cuda
