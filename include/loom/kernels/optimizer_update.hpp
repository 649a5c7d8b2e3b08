// Fused optimizer updates: one pass over a parameter, its gradient and the
// optimizer state, with PyTorch's update rules (torch.optim.SGD and AdamW,
// single-tensor path, maximize = false, amsgrad = false).
//
// SGD (momentum buffer `buf`, omitted when momentum == 0):
//   g = grad + weight_decay * p
//   buf = first_step ? g : momentum * buf + (1 - dampening) * g
//   g = nesterov ? g + momentum * buf : buf
//   p = p - lr * g
// AdamW (step t >= 1, counted from 1):
//   p = p * (1 - lr * weight_decay)
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g * g
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//
// The gradient is read, never written. Parameter and gradient share one dtype
// and device: f32 everywhere, bf16 too (arithmetic in f32, one rounding per
// stored parameter). State tensors are always f32. All tensors have the
// parameter's element count (shapes may differ: state is usually flat); none
// may overlap another. Host and CUDA compute in f32 with the same formulas but
// may differ in the last bit (the compilers contract products differently).
// Work on CUDA is queued on the device's current stream.
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

// Hyper-parameters are given in double, as PyTorch's Python floats are; the
// kernels use them rounded to f32, with 1 - beta and 1 - dampening formed in
// double first (as PyTorch does) so that beta2 = 0.999 gives 1 - beta2 = 0.001f.
struct SgdUpdate {
  double lr = 0.0;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  // The buffer's first update copies the gradient instead of reading the buffer.
  bool first_step = false;
};

// `momentum_buffer` must be defined when momentum != 0 and is ignored otherwise.
void sgd_update(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
                const SgdUpdate& update);

struct AdamWUpdate {
  double lr = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  int64_t step = 1;  // t in the bias corrections, >= 1
};

void adamw_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                  const Tensor& exp_avg_sq, const AdamWUpdate& update);

// Per element: SGD reads p, g (and buf), writes p (and buf); AdamW reads p, g,
// m, v and writes p, m, v. FLOPs count each add, multiply, divide and sqrt as 1.
OpCost sgd_update_cost(const Tensor& param, const SgdUpdate& update);
OpCost adamw_update_cost(const Tensor& param);

}  // namespace loom::kernels
