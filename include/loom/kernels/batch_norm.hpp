// Batch normalization over N, H and W of NCHW tensors, one statistic per
// channel, in separate steps so that a data-parallel caller can all-reduce
// the per-channel sums across ranks between them (synchronized BatchNorm):
//
//   training forward                          eval forward
//     batch_norm_stats(x, sums)                 batch_norm_eval_stats(running_mean,
//     [all-reduce sums and count]                 running_var, eps, mean, invstd)
//     batch_norm_finalize(sums, count, ...)     batch_norm_normalize(...)
//     batch_norm_normalize(x, mean, invstd, weight, bias, y)
//
//   backward (both modes)
//     batch_norm_backward_sums(dy, x, mean, invstd, grad_sums)
//     [all-reduce grad_sums (training only)]
//     batch_norm_backward_input(dy, x, mean, invstd, weight, grad_sums, count, batch_stats, dx)
//
// x, y, dy, dx: [N, C, H, W] (any trailing shape after C works: [N, C] too).
// sums, grad_sums: f32 [2, C]: {sum x, sum x^2} and {sum dy, sum dy * xhat}
// with xhat = (x - mean) * invstd; grad_sums are also the bias and weight
// gradients. mean, invstd, running stats, weight, bias: f32 [C]; weight and
// bias may be undefined (1 and 0). count is the number of values per channel
// the sums cover (N * H * W, summed over ranks after an all-reduce).
//
// The variance is sum_sq / count - mean^2 (biased, used to normalize); the
// running variance gets the unbiased count / (count - 1) of it, as PyTorch
// does. Forming it from f32 sums loses accuracy when |mean| >> std (relative
// error about 1e-7 * mean^2 / var); the host sums each plane in f32 with
// Eigen's pairwise tree and the planes in double, CUDA in double.
//
// dtypes: the activations x, y, dy and dx are f32 or bf16 (host and CUDA),
// one dtype for all of them in a call; every per-channel tensor
// (sums, grad_sums, mean, invstd, weight, bias, running stats) is f32. bf16
// values are widened to f32, the arithmetic is the f32 one, and each output
// element is rounded once to nearest even: normalize and backward_input give
// the f32 results on the widened values, rounded; stats and backward_sums
// sum a plane in another order than f32 does (rounding differences only).
// Work on CUDA is queued on the device's current stream.
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

void batch_norm_stats(const Tensor& x, const Tensor& sums);
// mean = sum / count, invstd = 1 / sqrt(var + eps). With running_mean and
// running_var defined, also running = (1 - momentum) running + momentum batch.
// count must be at least 2.
void batch_norm_finalize(const Tensor& sums, int64_t count, float eps, float momentum,
                         const Tensor& mean, const Tensor& invstd, const Tensor& running_mean,
                         const Tensor& running_var);
// mean = running_mean, invstd = 1 / sqrt(running_var + eps).
void batch_norm_eval_stats(const Tensor& running_mean, const Tensor& running_var, float eps,
                           const Tensor& mean, const Tensor& invstd);
// y = (x - mean) * invstd * weight + bias. y may be x (in place).
void batch_norm_normalize(const Tensor& x, const Tensor& mean, const Tensor& invstd,
                          const Tensor& weight, const Tensor& bias, const Tensor& y);
void batch_norm_backward_sums(const Tensor& dy, const Tensor& x, const Tensor& mean,
                              const Tensor& invstd, const Tensor& grad_sums);
// batch_stats (training): dx = weight * invstd * (dy - (sum dy + xhat * sum dy xhat) / count),
// the statistics being functions of x. Otherwise (eval, fixed statistics):
// dx = weight * invstd * dy, and grad_sums and count are not read.
void batch_norm_backward_input(const Tensor& dy, const Tensor& x, const Tensor& mean,
                               const Tensor& invstd, const Tensor& weight, const Tensor& grad_sums,
                               int64_t count, bool batch_stats, const Tensor& dx);

enum class BatchNormStep { stats, normalize, backward_sums, backward_input };

// Per element of x: stats 3 flops, normalize 2, backward_sums 4, backward_input 3;
// bytes: the element-sized tensors each step reads and writes.
OpCost batch_norm_cost(BatchNormStep step, const Tensor& x);

}  // namespace loom::kernels
