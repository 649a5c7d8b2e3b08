#include "loom/nn/checkpoint.hpp"

namespace loom::nn {

struct Checkpoint::State : SavedState {
  Tensor x;
  uint64_t seed = 0;
  int64_t first_row = 0;
  bool stand_in = false;
  Tape inner;  // the recomputed forward's state, between backward_input and backward_weight
  bool recomputed = false;
};

Checkpoint::Checkpoint(std::string name, std::unique_ptr<Module> inner)
    : Module(std::move(name)), inner_(std::move(inner)) {
  LOOM_CHECK(inner_ != nullptr, "checkpoint '", this->name(), "': the inner module is null");
}

Tensor Checkpoint::forward(const Tensor& x, Tape& tape) {
  Tensor y;
  {
    Tape scratch;
    scratch.set_random_seed(tape.random_seed());
    scratch.set_first_row(tape.first_row());
    scratch.set_micro_batch(tape.micro_batch());
    scratch.set_stand_in(tape.stand_in());
    y = inner_->forward(x, scratch);
  }  // everything inner saved is freed here
  State& state = tape.emplace<State>(*this);
  state.x = x;
  state.seed = tape.random_seed();
  state.first_row = tape.first_row();
  state.stand_in = tape.stand_in();
  return y;
}

Checkpoint::State& Checkpoint::recompute(Tape& tape) {
  State& state = tape.get<State>(*this);
  LOOM_CHECK(!state.recomputed, "checkpoint '", name(),
             "': backward_input already ran for this tape");
  state.inner.set_random_seed(state.seed);
  state.inner.set_first_row(state.first_row);
  state.inner.set_micro_batch(tape.micro_batch());
  state.inner.set_stand_in(state.stand_in);
  inner_->forward(state.x, state.inner);
  state.recomputed = true;
  return state;
}

Tensor Checkpoint::backward_input(const Tensor& dy, Tape& tape) {
  State& state = recompute(tape);
  Tensor dx = inner_->backward_input(dy, state.inner);
  // Without parameters there is no backward_weight to wait for: release now,
  // as every parameter-free module does (nn/tape.hpp).
  if (inner_->parameters().empty()) {
    inner_->backward_weight(state.inner);
    tape.release(*this);
  }
  return dx;
}

void Checkpoint::backward_weight(Tape& tape) {
  if (!tape.has(*this) && inner_->parameters().empty()) return;  // released by backward_input
  State& state = tape.get<State>(*this);
  LOOM_CHECK(state.recomputed, "checkpoint '", name(),
             "': backward_weight needs backward_input first");
  inner_->backward_weight(state.inner);
  tape.release(*this);
}

Tensor Checkpoint::backward(const Tensor& dy, Tape& tape) {
  State& state = recompute(tape);
  Tensor dx = inner_->backward(dy, state.inner);
  tape.release(*this);
  return dx;
}

void Checkpoint::collect_parameters(std::vector<Parameter*>& out) {
  inner_->collect_parameters(out);
}

}  // namespace loom::nn
