// Row-wise causal softmax of attention scores, and its backward.
//
// scores and probs are [..., T, T]: a stack of T x T matrices, row i holding
// query i's scores against keys 0 .. T-1. Query i may attend to keys j <= i:
//
//   probs[i, j] = exp(scale * s[i, j] - m_i) / sum_{j' <= i} exp(scale * s[i, j'] - m_i)   j <= i
//   probs[i, j] = 0 exactly                                                                j > i
//
// with m_i = max_{j <= i} scale * s[i, j] (for range; it cancels). The masked
// scores are never read, so they may hold anything, NaN included. The
// backward of probs = causal_softmax(s, scale) is
//
//   ds[i, j] = scale * p[i, j] * (dp[i, j] - sum_{j' <= i} dp[i, j'] p[i, j'])   j <= i
//   ds[i, j] = 0 exactly                                                          j > i
//
// probs may be scores itself (in place), and dscores may be dprobs; other
// overlaps are rejected. dtypes: probs and dscores share one (f32, bf16 or
// f16); scores and dprobs have it too, or are f32 (mixed precision: f32
// scores from a product of bf16 operands give bf16 probabilities for the
// next product, and an f32 dprobs gives bf16 dscores). Arithmetic is f32
// throughout, each output rounded once. The host takes scores and dprobs in
// f32 only; CUDA any of the above. Host and CUDA agree to a few ulps (their
// exp differs). Work on CUDA is queued on the device's current stream.
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

void causal_softmax(const Tensor& scores, float scale, const Tensor& probs);
void causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, float scale,
                             const Tensor& dscores);

// Counts only the T (T + 1) / 2 unmasked elements of each matrix as work:
// forward 5 flops each (scale, max, subtract, exp, normalise; the row sum is
// folded into the normalise), backward 5 (product, row sum, subtract, two
// multiplies); bytes: every element of the inputs read once and the output
// written once.
OpCost causal_softmax_cost(const Tensor& scores);
OpCost causal_softmax_backward_cost(const Tensor& probs);

}  // namespace loom::kernels
