// TrainStep: one training step of the common case, zero_grad -> forward ->
// loss -> backward -> finish -> clip -> schedule -> step, in that order, with
// every part named in the struct so nothing is hidden:
//
//   parallel::TrainStep train{.model = *model, .loss = loss_fn, .zero = &zero,
//                             .clip_norm = 1.0,
//                             .lr_at = [&](int64_t s) { return schedule.lr_at(s); }};
//   for (int64_t step = 0; step < steps; ++step) {
//     parallel::StepResult r = train.run(batch.images, batch.labels, step);
//     if (lead) std::printf("loss %.4f\n", parallel::mean_over(*dp, r.loss));
//   }
//
// run(inputs, targets, step) is exactly this (with `zero`):
//
//   zero.zero_grad();                                  // or optimizer->zero_grad()
//   nn::Tape tape, loss_tape;
//   tape.set_random_seed(seed * 1000003 + step);       // Dropout's masks (the GPT example's rule)
//   tape.set_first_row(first_row);                     // ... at this rank's rows of the batch
//   tape.set_stand_in(uneven->stand_in());             // with `uneven` only
//   Tensor logits = model.forward(inputs, tape);
//   double loss_value = loss.forward(logits, targets, loss_tape).item<float>();
//   model.backward(loss.backward(loss_tape, w), tape); // w: uneven->loss_weight(), else 1
//   zero.finish();                                     // or reducer->finish(), if any
//   double norm = clip_norm > 0 ? zero.clip_grad_norm(clip_norm) : NaN;
//   if (lr_at) zero.set_lr(lr_at(step));
//   if (clip_norm <= 0 || std::isfinite(norm)) zero.step();
//
// Who updates the parameters: exactly one of
//  - `zero`: a ZeroOptimizer (any stage; clipping is its true global norm);
//  - `optimizer`: an optim::Optimizer, alone (one rank) or after a GradReducer
//    `reducer` (data parallelism): clipping is then
//    parallel::clip_grad_norm(model.parameters(), reducer->options().groups),
//    without a reducer optim::clip_grad_norm(optimizer->grads()).
// run() throws loom::Error naming the rule when neither or both are given.
//
// With `uneven` (ranks that run out of data at different steps,
// parallel/uneven_inputs.hpp) call uneven->next(has_batch) before each run();
// a rank without a batch passes a stand-in (its last batch) and its
// StepResult::stand_in is true (its loss is the stand-in's: average with
// uneven->mean(loss)).
//
// A step whose gradient norm is not finite (an overflow) is not taken:
// StepResult::stepped is false and the parameters keep their values; the
// learning rate is set all the same. Anything else (gradient accumulation
// over micro-batches with no_sync(), several losses, a custom loss) is written
// out with the same parts; the sequence above is the template.
#pragma once

#include <cstdint>
#include <functional>

#include "loom/core/tensor.hpp"
#include "loom/nn/cross_entropy_loss.hpp"
#include "loom/nn/module.hpp"
#include "loom/optim/optimizer.hpp"
#include "loom/parallel/grad_reducer.hpp"
#include "loom/parallel/uneven_inputs.hpp"
#include "loom/parallel/zero.hpp"

namespace loom::parallel {

struct StepResult {
  double loss = 0;        // this rank's loss (mean_over(dp, loss) for the group's mean)
  double grad_norm = 0;   // the global gradient norm before clipping; NaN without clipping
  double lr = 0;          // the learning rate this step used
  bool stepped = false;   // false when the norm was not finite and the update was skipped
  bool stand_in = false;  // this rank ran a stand-in batch (TrainStep::uneven)
};

struct TrainStep {
  nn::Module& model;
  nn::CrossEntropyLoss& loss;
  ZeroOptimizer* zero = nullptr;
  optim::Optimizer* optimizer = nullptr;
  GradReducer* reducer = nullptr;                  // with `optimizer` only; null on one rank
  double clip_norm = 0.0;                          // > 0: clip the gradients' global norm to this
  std::function<double(int64_t step)> lr_at = {};  // empty: keep the optimizer's rate
  uint64_t seed = 0;                               // the forward tape's random seed (above)
  // This rank's first row in the step's global batch (its data-parallel rank
  // times its rows), where Dropout places its masks (nn::Tape::first_row).
  int64_t first_row = 0;
  // Ranks whose data runs out at different steps (parallel/uneven_inputs.hpp):
  // run() takes the loss weight and the stand-in flag of the step its last
  // next() opened.
  UnevenInputs* uneven = nullptr;

  StepResult run(const Tensor& inputs, const Tensor& targets, int64_t step);
};

}  // namespace loom::parallel
