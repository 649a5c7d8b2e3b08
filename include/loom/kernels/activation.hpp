// Point-wise activation functions and their derivatives.
//
//   relu:  f(x) = max(x, 0)                    f'(x) = 1 if x > 0 else 0
//   gelu:  f(x) = x * Phi(x)                   f'(x) = Phi(x) + x * phi(x)
//          Phi(x) = (1 + erf(x / sqrt 2)) / 2, phi(x) = exp(-x^2 / 2) / sqrt(2 pi)
//          (the exact erf form, PyTorch's default)
//   gelu_tanh: f(x) = x (1 + tanh(u)) / 2,     u = sqrt(2 / pi) (x + 0.044715 x^3)
//          (the tanh approximation: PyTorch's gelu(approximate="tanh"), GPT-2's
//          and llm.c's, and the one cuBLASLt's GELU epilogues compute; within
//          about 5e-4 of the exact form)
//
// activation_forward writes y = f(x); activation_backward writes
// dx = dy * f'(x). All tensors of a call have the same element count, dtype
// and device (shapes may differ; elements pair up in row-major order); y may be
// x itself and dx may be dy itself (in place). dtypes: f32 on the host; f32 or
// bf16 on CUDA (computed in f32, rounded once). NaN inputs give NaN. The host
// erf is Eigen's vectorised rational approximation (a few ulp); the two
// backends agree to about 1e-6 relative, not bit for bit.
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

enum class Activation { relu, gelu, gelu_tanh };

const char* activation_name(Activation f);  // "relu", "gelu", "gelu_tanh"

void activation_forward(Activation f, const Tensor& x, const Tensor& y);
void activation_backward(Activation f, const Tensor& x, const Tensor& dy, const Tensor& dx);

// flops per element (erf and exp count one each): relu forward 1, backward 1;
// gelu (either form) forward 5, backward 10. bytes: every tensor read or written once.
OpCost activation_forward_cost(Activation f, const Tensor& x);
OpCost activation_backward_cost(Activation f, const Tensor& x);

}  // namespace loom::kernels
