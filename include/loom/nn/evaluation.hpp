// What an evaluation loop needs: a forward pass without a caller's Tape, the
// predicted class of each row, and the accuracy of those predictions.
//
//   model.set_training(false);                      // Dropout off, BatchNorm's running stats
//   Tensor logits = nn::infer(model, batch.images);  // no Tape to hold
//   double acc = nn::accuracy(logits, batch.labels);
//   model.set_training(true);
//
// infer() runs module.forward(x, tape) on a Tape that lives only for the
// call: whatever the forward saved for a backward is released when it
// returns, and only the output stays. (Saved state still exists while the
// forward runs, so the peak is that of a training forward; what infer saves
// is holding activations between calls.) It does not change the training
// mode: evaluation normally wants set_training(false) first.
//
// argmax() and accuracy() take logits [..., C] (f32, bf16 or f16; any
// device) and work on the host: a CUDA tensor is copied there, which
// synchronises its stream (they are for evaluation and logging, not the
// training step). A row's argmax is the index of its largest value, the first
// one on a tie; a NaN counts as larger than every number (numpy's and
// PyTorch's rule), so a row that overflowed is not silently "correct".
#pragma once

#include "loom/core/tensor.hpp"
#include "loom/nn/module.hpp"

namespace loom::nn {

// module.forward(x) on a Tape of its own, released on return.
Tensor infer(Module& module, const Tensor& x);

// The index of each row's largest logit: i32 [...] for logits [..., C], on
// the logits' device. Throws loom::Error if C is 0 or the dtype is not a
// floating-point one.
Tensor argmax(const Tensor& logits);

// The fraction of rows whose argmax equals the target: logits [..., C],
// targets i32/i64 of shape [...] (any device). Throws loom::Error naming the
// shapes when they do not fit, and for zero rows (no accuracy to give). For
// the accuracy over data-parallel ranks with equal rows per rank, take
// parallel::mean_over(dp, accuracy(...)).
double accuracy(const Tensor& logits, const Tensor& targets);

}  // namespace loom::nn
