// Internal: host cross-entropy (f32 or bf16 logits, i32/i64 targets). See
// loom/kernels/cross_entropy.hpp; targets are range-checked by the dispatcher.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/kernels/cross_entropy.hpp"

namespace loom::kernels::cpu {

// Logits as their tensor holds them: f32, or bf16 (widened as they are read).
struct Logits {
  const void* data;
  bool bf16;
};

int64_t first_bad_target(const void* targets, DType dtype, int64_t rows, int64_t classes,
                         int64_t ignore_index);

double cross_entropy_forward(Logits logits, const void* targets, DType dtype, int64_t rows,
                             int64_t classes, int64_t ignore_index, float* lse, int64_t* count);
// dlogits: the logits' dtype (a bf16 gradient rounded once from f32).
void cross_entropy_backward(Logits logits, const void* targets, DType dtype, const float* lse,
                            int64_t rows, int64_t classes, int64_t ignore_index, float scale,
                            void* dlogits);

void row_max(Logits logits, int64_t rows, int64_t stride, int64_t valid, float* max);
void row_sum_exp(Logits logits, int64_t rows, int64_t stride, int64_t valid, const float* shift,
                 float* sums);
// out: f32; columns[r] < 0 gives 0.
void row_pick(Logits logits, int64_t rows, int64_t stride, const int64_t* columns, float* out);
// dlogits: the logits' dtype (a bf16 gradient rounded once from f32); may be the logits.
void row_gradient(Logits logits, int64_t rows, int64_t stride, int64_t valid, const float* lse,
                  const int64_t* columns, float scale, void* dlogits);

}  // namespace loom::kernels::cpu
