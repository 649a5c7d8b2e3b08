// Internal: host bias add and bias gradient (f32). See loom/kernels/bias.hpp.
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

// y[r, c] += b[c] for r < rows, c < cols.
void bias_add(float* y, const float* b, int64_t rows, int64_t cols);
// db[c] (+)= sum_r dy[r, c], rows summed in order.
void bias_grad(const float* dy, float* db, int64_t rows, int64_t cols, bool accumulate);

}  // namespace loom::kernels::cpu
