// Layer normalisation over the last dimension, with a per-feature weight and bias.
//
// For each row r of x [..., D] (every leading dimension is a row):
//   mean[r] = sum_c x[r, c] / D
//   rstd[r] = 1 / sqrt(sum_c (x[r, c] - mean[r])^2 / D + eps)    (biased variance)
//   y[r, c] = (x[r, c] - mean[r]) * rstd[r] * weight[c] + bias[c]
// Forward also writes mean and rstd ([rows] f32 each), which backward reads
// instead of recomputing them.
//
// Backward is split like a module's (nn/module.hpp):
//   layer_norm_backward_input:  dx = rstd * (g - mean_c(g) - xhat * mean_c(g * xhat)),
//                               g = dy * weight, xhat = (x - mean) * rstd
//   layer_norm_backward_weight: dweight[c] (+)= sum_r dy * xhat, dbias[c] (+)= sum_r dy
// accumulate = false overwrites dweight/dbias, true adds to them. The column
// sums are deterministic (fixed order, no atomics).
//
// dtypes: f32 (host and CUDA). x, y, dx, dy have one shape; weight, bias,
// dweight, dbias are [D]. Row statistics are computed in f32 in two passes
// (the mean, then the centred variance), which stays accurate when the mean is
// large next to the spread.
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

void layer_norm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                        const Tensor& y, const Tensor& mean, const Tensor& rstd);
void layer_norm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& weight,
                               const Tensor& mean, const Tensor& rstd, const Tensor& dx);
void layer_norm_backward_weight(const Tensor& dy, const Tensor& x, const Tensor& mean,
                                const Tensor& rstd, const Tensor& dweight, const Tensor& dbias,
                                bool accumulate);

// Forward: 8 flops per element (mean, variance, normalise, scale, shift);
// bytes: x read, y written, weight/bias/mean/rstd.
OpCost layer_norm_forward_cost(const Tensor& x);
// Backward input: 9 flops per element; dy and x read, dx written.
OpCost layer_norm_backward_input_cost(const Tensor& x);
// Backward weight: 4 flops per element; dy and x read, dweight/dbias written.
OpCost layer_norm_backward_weight_cost(const Tensor& x, bool accumulate);

}  // namespace loom::kernels
