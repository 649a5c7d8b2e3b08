// Internal: host bias add (f32) and bias gradient (dy f32, bf16 or f16; db
// f32). See loom/kernels/bias.hpp.
#pragma once

#include <cstdint>

#include "loom/core/half.hpp"

namespace loom::kernels::cpu {

// y[r, c] += b[c] for r < rows, c < cols.
void bias_add(float* y, const float* b, int64_t rows, int64_t cols);
// db[c] (+)= sum_r dy[r, c], rows summed in order, in f32.
void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate);
void bias_grad(const bfloat16* dy, float* db, int64_t rows, int64_t cols, bool accumulate);
void bias_grad(const float16* dy, float* db, int64_t rows, int64_t cols, bool accumulate);

}  // namespace loom::kernels::cpu
