// Internal (CUDA): bias add and bias gradient. Declarations only, so
// host-compiled dispatch code can include it.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"

namespace loom::kernels::cuda {

// Queued on `stream` (a cudaStream_t); the device is current; dtype f32 or bf16.
void bias_add(void* y, const void* b, DType dtype, int64_t rows, int64_t cols, void* stream);
void bias_grad(const void* dy, void* db, DType dtype, int64_t rows, int64_t cols, bool accumulate,
               void* stream);
// The bias gradient of an NCHW output: db[c] (+)= the sum of dy over images and
// the plane's positions. dtype f32, bf16 or f16 (f32 sums either way).
void channel_bias_grad(const void* dy, void* db, DType dtype, int64_t images, int64_t channels,
                       int64_t plane, bool accumulate, void* stream);

}  // namespace loom::kernels::cuda
