// Cross-entropy of a softmax: the fused, numerically stable loss of a
// classifier's logits against integer targets, and its gradient.
//
// For logits [N, V] (f32 or bf16, host and CUDA) and targets [N] (i32 or i64):
//   lse[r]  = m + log(sum_c exp(logits[r, c] - m)),  m = max_c logits[r, c]
//   loss    = sum over counted rows of (lse[r] - logits[r, targets[r]]) / count
// where a row is counted unless targets[r] == ignore_index, and count is the
// number of counted rows (loss = 0 when count is 0, not NaN).
// Forward writes loss and count (1-element f32 tensors) and lse ([N] f32),
// which is all backward needs besides the logits:
//   dlogits[r, c] = (exp(logits[r, c] - lse[r]) - [c == targets[r]]) * dloss / count
// and 0 on ignored rows. dlogits may be the logits tensor itself (in place), so
// a caller can turn the logits into their gradient without a second [N, V] buffer.
// bf16 logits are widened as they are read; their gradient (dlogits has the
// logits' dtype) is computed in f32 and rounded once.
//
// The loss is summed in a fixed order (host: in double, by row; CUDA: in f32
// by a fixed tree): deterministic. Targets must lie in [0, V) or equal
// ignore_index: the host throws loom::Error naming the row, the target and V;
// CUDA cannot throw from a kernel, so there such a row's loss is NaN (and so is
// the mean), which shows up in the loss curve rather than passing silently.
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"

namespace loom::kernels {

void cross_entropy_forward(const Tensor& logits, const Tensor& targets, const Tensor& loss,
                           const Tensor& lse, const Tensor& count, int64_t ignore_index = -1);
void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                            const Tensor& count, float dloss, const Tensor& dlogits,
                            int64_t ignore_index = -1);

// The pieces of a cross-entropy whose classes are split over ranks (the
// vocabulary-parallel loss, parallel/vocab_parallel.hpp), over the first
// `valid` columns (0 <= valid <= columns) of each row of f32 or bf16 logits
// [rows, columns], host or CUDA (every operand on the logits' device):
//   cross_entropy_row_max:      max[r]  = max_c logits[r, c] (NaNs skipped; -inf for valid 0)
//   cross_entropy_row_sum_exp:  sums[r] = sum_c exp(logits[r, c] - shift[r])
//   cross_entropy_row_pick:     out[r]  = logits[r, columns[r]], 0 where columns[r] < 0
//   cross_entropy_row_gradient: dlogits[r, c] = exp(logits[r, c] - lse[r]) * scale
//                               - (c == columns[r] ? scale : 0) for c < valid, 0 from
//                               `valid` on, and 0 on a row whose columns[r] is kIgnoredRow
// max, shift, sums, lse and out are f32 [rows]; columns is i64 [rows]: the row's
// target column in this piece, kNotHere where the target lies in another
// rank's piece, kIgnoredRow where the row has no target (ignore_index).
// dlogits has the logits' dtype and shape (bf16 computed in f32 and rounded
// once) and may be the logits themselves.
constexpr int64_t kNotHere = -1;
constexpr int64_t kIgnoredRow = -2;
void cross_entropy_row_max(const Tensor& logits, int64_t valid, const Tensor& max);
void cross_entropy_row_sum_exp(const Tensor& logits, int64_t valid, const Tensor& shift,
                               const Tensor& sums);
void cross_entropy_row_pick(const Tensor& logits, const Tensor& columns, const Tensor& out);
void cross_entropy_row_gradient(const Tensor& logits, int64_t valid, const Tensor& lse,
                                const Tensor& columns, float scale, const Tensor& dlogits);

// Forward: 4 flops per logit (max, subtract, exp, add); reads the logits and targets.
OpCost cross_entropy_forward_cost(const Tensor& logits);
// Backward: 4 flops per logit; reads the logits, writes dlogits.
OpCost cross_entropy_backward_cost(const Tensor& logits);

}  // namespace loom::kernels
