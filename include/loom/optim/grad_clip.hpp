// Gradient clipping by global L2 norm (torch.nn.utils.clip_grad_norm_).
//
//   norm = sqrt(sum over all gradients of sum(g^2))      (accumulated in double)
//   if norm > max_norm: every g *= max_norm / (norm + 1e-6)
//   return norm                                          (the norm before clipping)
//
// A non-finite norm (NaN or inf: some gradient overflowed) leaves the
// gradients untouched and is returned as is; the caller should skip the
// optimizer step (std::isfinite(norm)), as mixed-precision loss scaling does.
//
// The pieces are public because a sharded run (ZeRO) sums the squares of its
// shard, all-reduces that sum, and then scales its shard:
//   double sq = grad_sum_squares(shard_grads);  all_reduce(sq);
//   double norm = std::sqrt(sq);  if (norm > max_norm) scale_grads(shard_grads,
//   clip_coefficient(norm, max_norm));
// On CUDA, sums of squares are accumulated in f32 on the device (kernels/reduce.hpp),
// then added in double.
#pragma once

#include <span>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/nn/parameter.hpp"

namespace loom::optim {

double grad_sum_squares(std::span<const Tensor> grads);
// max_norm / (norm + 1e-6).
double clip_coefficient(double norm, double max_norm);
// Multiplies every gradient by `factor`, in place.
void scale_grads(std::span<const Tensor> grads, double factor);

// max_norm must be positive and finite. Returns the pre-clip norm.
double clip_grad_norm(std::span<const Tensor> grads, double max_norm);
double clip_grad_norm(const std::vector<nn::Parameter*>& params, double max_norm);

}  // namespace loom::optim
