// Internal: the host tanh-approximation GELU (Activation::gelu_tanh), f32.
//
//   f(x)  = x / 2 (1 + tanh(u)),  u = sqrt(2 / pi) (x + 0.044715 x^3)
//         = x s,                  s = sigmoid(2 u) = 1 / (1 + e^(-2u))
//   f'(x) = s + x s (1 - s) 2 u'(x),  2 u'(x) = 2 sqrt(2 / pi) (1 + 3 0.044715 x^2)
//
// (1 + tanh(u)) / 2 is sigmoid(2u), which takes one exponential and no tanh;
// 1 - s is computed as e s with e = e^(-2u), not as 1 - s, which cancels
// where s is near 1.
// AVX-512 registers with exp16 (exp_avx512.hpp) where the build has it, else
// one value at a time with std::exp: the two agree to a few ulp, not bit for
// bit. In place is fine (every element is read before it is written).
#pragma once

#include <cstdint>

namespace loom::kernels::cpu {

void gelu_tanh_forward(const float* x, float* y, int64_t n);
// dx = dy * f'(x).
void gelu_tanh_backward(const float* x, const float* dy, float* dx, int64_t n);

}  // namespace loom::kernels::cpu
