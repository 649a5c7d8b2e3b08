// Internal: host activations (f32, bf16, f16). See loom/kernels/activation.hpp.
#pragma once

#include <cstdint>

#include "loom/core/dtype.hpp"
#include "loom/kernels/activation.hpp"

namespace loom::kernels::cpu {

// y = f(x); y may equal x.
void activation_forward(Activation f, const float* x, float* y, int64_t n);
// dx = dy * f'(x); dx may equal dy.
void activation_backward(Activation f, const float* x, const float* dy, float* dx, int64_t n);
// The same on tensors of `dtype` (f32, bf16 or f16): 16-bit data is computed in
// f32 a chunk at a time (kernels/cpu/float_io.hpp) and rounded once.
void activation_forward(Activation f, const void* x, void* y, DType dtype, int64_t n);
void activation_backward(Activation f, const void* x, const void* dy, void* dx, DType dtype,
                         int64_t n);

}  // namespace loom::kernels::cpu
