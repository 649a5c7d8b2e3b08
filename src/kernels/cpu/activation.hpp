// Internal: host activations (f32). See loom/kernels/activation.hpp.
#pragma once

#include <cstdint>

#include "loom/kernels/activation.hpp"

namespace loom::kernels::cpu {

// y = f(x); y may equal x.
void activation_forward(Activation f, const float* x, float* y, int64_t n);
// dx = dy * f'(x); dx may equal dy.
void activation_backward(Activation f, const float* x, const float* dy, float* dx, int64_t n);

}  // namespace loom::kernels::cpu
