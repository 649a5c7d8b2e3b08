#include "loom/parallel/train_step.hpp"

#include <cmath>
#include <limits>

#include "loom/core/error.hpp"
#include "loom/nn/tape.hpp"
#include "loom/optim/grad_clip.hpp"
#include "loom/parallel/grad_clip.hpp"

namespace loom::parallel {

StepResult TrainStep::run(const Tensor& inputs, const Tensor& targets, int64_t step) {
  LOOM_CHECK((zero != nullptr) != (optimizer != nullptr),
             "TrainStep: give exactly one of `zero` (a ZeroOptimizer) and `optimizer` (an "
             "optim::Optimizer, with or without a GradReducer); got ",
             zero != nullptr ? "both" : "neither");
  LOOM_CHECK(reducer == nullptr || optimizer != nullptr,
             "TrainStep: `reducer` goes with `optimizer`; a ZeroOptimizer reduces its own "
             "gradients");
  LOOM_CHECK(std::isfinite(clip_norm) && clip_norm >= 0, "TrainStep: clip_norm ", clip_norm,
             " must be finite and at least 0 (0: no clipping)");
  LOOM_CHECK(step >= 0, "TrainStep: step ", step, " must not be negative");

  if (zero != nullptr) {
    zero->zero_grad();
  } else {
    optimizer->zero_grad();
  }
  const bool stand_in = uneven != nullptr && uneven->stand_in();
  const float loss_weight = uneven != nullptr ? static_cast<float>(uneven->loss_weight()) : 1.0f;
  nn::Tape tape, loss_tape;
  tape.set_random_seed(seed * 1000003 + static_cast<uint64_t>(step));
  tape.set_first_row(first_row);
  tape.set_stand_in(stand_in);
  const Tensor logits = model.forward(inputs, tape);
  StepResult result;
  result.stand_in = stand_in;
  result.loss = loss.forward(logits, targets, loss_tape).item<float>();
  model.backward(loss.backward(loss_tape, loss_weight), tape);

  if (zero != nullptr) {
    zero->finish();
  } else if (reducer != nullptr) {
    reducer->finish();
  }
  result.grad_norm = std::numeric_limits<double>::quiet_NaN();
  if (clip_norm > 0) {
    if (zero != nullptr) {
      result.grad_norm = zero->clip_grad_norm(clip_norm);
    } else if (reducer != nullptr) {
      result.grad_norm =
          parallel::clip_grad_norm(model.parameters(), reducer->options().groups, clip_norm);
    } else {
      result.grad_norm = optim::clip_grad_norm(optimizer->grads(), clip_norm);
    }
  }
  optim::Optimizer& updater = zero != nullptr ? zero->optimizer() : *optimizer;
  if (lr_at) updater.set_lr(lr_at(step));
  result.lr = updater.lr();
  result.stepped = clip_norm <= 0 || std::isfinite(result.grad_norm);
  if (result.stepped) {
    if (zero != nullptr) {
      zero->step();
    } else {
      optimizer->step();
    }
  }
  return result;
}

}  // namespace loom::parallel
