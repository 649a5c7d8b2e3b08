// Dynamic loss scaling for fp16 training (the GradScaler of PyTorch's AMP).
//
// f16 holds magnitudes from about 6e-8 (subnormal) to 65504: small gradients
// of an fp16 model underflow to zero. So the loss gradient is multiplied by a
// scale S before backward, every gradient comes out S times too large, and
// is divided by S before the optimizer step. Too large an S overflows: some
// gradient is inf or NaN. Then the step is skipped and S shrinks; after
// `growth_interval` good steps in a row S grows again.
//
//   optim::LossScaler scaler;                  // S = 65536
//   Tensor dlogits = loss.backward(loss_tape, scaler.scale());  // S x dL/dlogits
//   model.backward(dlogits, tape);
//   zero.finish();
//   const double norm = zero.clip_grad_norm(max_norm, scaler.scale());  // true norm; unscales
//   if (scaler.update(norm)) zero.step();     // false: inf/NaN, step skipped, S lowered
//
// Agreement: the norm that update() reads is the global gradient norm,
// summed over every group that holds a different part of the gradients (dp
// shards, tp, pp: parallel/grad_clip.hpp), so an inf or NaN on any rank makes
// it non-finite on every rank: all ranks skip the same step and keep the same
// scale without a collective of their own.
#pragma once

#include <cstdint>

#include "loom/core/tensor.hpp"

namespace loom::optim {

struct LossScalerOptions {
  double initial_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;      // after growth_interval finite steps in a row
  double backoff_factor = 0.5;     // after a non-finite step
  int64_t growth_interval = 2000;
  double min_scale = 1.0;         // the scale never falls below this
  double max_scale = 16777216.0;  // 2^24: never grows above
};

class LossScaler {
 public:
  // Throws loom::Error naming the option and the rule when out of range.
  explicit LossScaler(const LossScalerOptions& options = {});

  double scale() const { return scale_; }
  // Multiplies the loss gradient by scale(), in place (f32, bf16 or f16, any
  // device). Exact when S is a power of two; passing S (times 1/M under
  // gradient accumulation) to the loss's backward instead applies it before
  // the gradient is rounded to the logits' dtype.
  void scale_gradient(const Tensor& dloss) const;
  // After backward: the true global gradient norm of this step (non-finite on
  // every rank when any gradient overflowed). Returns whether the optimizer
  // may step; updates the scale and the counters.
  bool update(double global_grad_norm);

  int64_t skipped_steps() const { return skipped_; }  // since construction
  int64_t steps() const { return steps_; }            // update() calls
  const LossScalerOptions& options() const { return options_; }

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t good_in_a_row_ = 0;
  int64_t skipped_ = 0;
  int64_t steps_ = 0;
};

}  // namespace loom::optim
