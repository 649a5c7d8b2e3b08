// Internal (CUDA): activations. Declarations only, so host-compiled dispatch
// code can include it.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/kernels/activation.hpp"

namespace loom::kernels::cuda {

// Queued on `stream` (a cudaStream_t); the device is current; dtype f32 or bf16; n >= 1.
void activation_forward(Activation f, const void* x, void* y, DType dtype, int64_t n, void* stream);
void activation_backward(Activation f, const void* x, const void* dy, void* dx, DType dtype,
                         int64_t n, void* stream);

}  // namespace loom::kernels::cuda
