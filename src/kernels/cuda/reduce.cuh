// Internal (CUDA): deterministic reductions on the device. Declarations only,
// so host-compiled dispatch code can include it.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/kernels/reduce.hpp"

namespace loom::kernels::cuda {

// How many f32 partial results reduce() needs as scratch for n elements (0: none).
int64_t reduce_partials(int64_t n, DType dtype);

// Queues out[0] = reduction of x[0, n) on `stream` (a cudaStream_t); n >= 1, the
// device is current, `partials` holds reduce_partials(n, dtype) floats.
void reduce(const void* x, DType dtype, int64_t n, Reduction op, float* out, float* partials,
            void* stream);

}  // namespace loom::kernels::cuda
