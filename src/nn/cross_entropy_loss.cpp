#include "loom/nn/cross_entropy_loss.hpp"

#include "loom/kernels/cross_entropy.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::nn {

struct CrossEntropyLoss::State : SavedState {
  Tensor logits;   // [rows, V]
  Tensor targets;  // [rows]
  Tensor lse;      // [rows]
  Tensor count;    // [1]: rows counted in the mean
  Shape logits_shape;
};

CrossEntropyLoss::CrossEntropyLoss(std::string name, int64_t ignore_index)
    : name_(std::move(name)), ignore_index_(ignore_index) {}

Tensor CrossEntropyLoss::forward(const Tensor& logits, const Tensor& targets, Tape& tape) {
  LOOM_CHECK(logits.defined() && logits.dim() >= 1 &&
                 (logits.dtype() == DType::f32 || logits.dtype() == DType::bf16),
             "cross_entropy '", name(), "': logits ", logits,
             " must be an f32 or bf16 [..., classes] tensor");
  const Shape leading(logits.shape().begin(), logits.shape().end() - 1);
  LOOM_CHECK(targets.defined() && targets.shape() == leading, "cross_entropy '", name(),
             "': targets ", targets, " must have the logits' leading shape ", shape_str(leading),
             " (logits ", logits, ")");
  const int64_t classes = logits.size(-1);
  const int64_t rows = shape_numel(leading);
  State& state = tape.emplace<State>(this, name_);
  state.logits = logits.view({rows, classes});
  state.targets = targets.view({rows});
  state.lse = Tensor::empty({rows}, DType::f32, logits.device());
  state.count = Tensor::empty({1}, DType::f32, logits.device());
  state.logits_shape = logits.shape();
  Tensor loss = Tensor::empty({}, DType::f32, logits.device());
  trace::OpScope scope("cross_entropy.forward", kernels::cross_entropy_forward_cost(state.logits),
                       logits.device(), name());
  kernels::cross_entropy_forward(state.logits, state.targets, loss, state.lse, state.count,
                                 ignore_index_);
  return loss;
}

Tensor CrossEntropyLoss::backward(Tape& tape, float dloss) {
  State state = std::move(tape.get<State>(this, name_));
  tape.release(this);
  // NOTE [loss gradient in place] Where the tape held the only handle on the
  // logits (the caller let go of its own after forward), the gradient
  // overwrites them, row by row after reading it: the step then holds one
  // [rows, V] tensor at its peak instead of two, the largest of a GPT with a
  // large vocabulary (llm.c's fused classifier does the same).
  Tensor dlogits =
      state.logits.sole_handle()
          ? state.logits.view(state.logits_shape)
          : Tensor::empty(state.logits_shape, state.logits.dtype(), state.logits.device());
  trace::OpScope scope("cross_entropy.backward", kernels::cross_entropy_backward_cost(state.logits),
                       dlogits.device(), name());
  kernels::cross_entropy_backward(state.logits, state.targets, state.lse, state.count, dloss,
                                  dlogits.view(state.logits.shape()), ignore_index_);
  return dlogits;
}

}  // namespace loom::nn
