// Internal: host reductions (f32, bf16, f16), accumulated in double.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/kernels/reduce.hpp"

namespace loom::kernels::cpu {

// The reduction of x[0, n); n >= 1.
double reduce(const void* x, DType dtype, int64_t n, Reduction op);

}  // namespace loom::kernels::cpu
