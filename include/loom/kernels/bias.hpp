// Bias of a dense layer: add a per-feature vector to every row, and its
// gradient, the column sums of the output gradient.
//
//   bias_add(y, b):               y[r, c] += b[c]        (in place)
//   bias_grad(dy, db, accumulate): db[c] (+)= sum_r dy[r, c]
//
// y and dy have shape [..., C] (every leading dimension is a row); b and db
// are [C]. dtypes: f32 on the host; f32 or bf16 on CUDA (all operands one
// dtype; bf16 sums accumulate in f32); CUDA's bias_grad also f16. bias_grad
// also takes a bf16 or f16 dy with an f32 db (a reduced-precision layer's
// output gradient; summed in f32, read as it is). bias_grad is deterministic:
// every column is summed in a fixed order, no atomics, so the same input gives
// the same bits on every run (on CUDA, of a device with the same number of
// SMs: NOTE [split reductions] in kernels/cuda/bias.cu). accumulate = false
// overwrites db (it is not read),
// true adds to it (see NOTE [gradient contributions] in nn/parameter.hpp).
// Work on CUDA is queued on the device's current stream.
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

void bias_add(const Tensor& y, const Tensor& bias);
void bias_grad(const Tensor& dy, const Tensor& dbias, bool accumulate);

// bias_add: one add per element of y; y read and written, b read.
OpCost bias_add_cost(const Tensor& y);
// bias_grad: one add per element of dy (plus C when accumulating); dy read, db written.
OpCost bias_grad_cost(const Tensor& dy, bool accumulate);

}  // namespace loom::kernels
