// Reductions of all elements of a floating-point tensor to one number.
//
//   sum          sum of x
//   sum_squares  sum of x^2 (squared L2 norm; gradient clipping sums it over shards)
//   max          largest x (-inf for an empty tensor)
//   abs_max      largest |x| (0 for an empty tensor); overflow checks of loss scaling
//
// A NaN anywhere makes every reduction NaN. Results are deterministic: the
// same input gives the same bits on every run (a fixed reduction tree, no
// atomics), wherever the tensor sits in memory. The host accumulates in
// double, CUDA in f32 (compensated per thread, then a tree), so sums agree to
// about 1e-6 of the sum of magnitudes, not bit for bit; max and abs_max agree
// exactly. On CUDA the double-returning reduce() gives the f32 result.
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

enum class Reduction { sum, sum_squares, max, abs_max };

// Writes the result into `out`, a 1-element f32 tensor on x's device, without
// synchronising with the host (so it can feed further device work).
void reduce(const Tensor& x, Reduction op, const Tensor& out);
// The result on the host (synchronises with the device).
double reduce(const Tensor& x, Reduction op);

inline double sum(const Tensor& x) {
  return reduce(x, Reduction::sum);
}
inline double sum_squares(const Tensor& x) {
  return reduce(x, Reduction::sum_squares);
}
inline double max(const Tensor& x) {
  return reduce(x, Reduction::max);
}
inline double abs_max(const Tensor& x) {
  return reduce(x, Reduction::abs_max);
}

// flops: one per element (two for sum_squares); bytes: the input once.
OpCost reduce_cost(const Tensor& x, Reduction op);

}  // namespace loom::kernels
