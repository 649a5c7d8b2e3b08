#include "loom/nn/dropout.hpp"

#include "loom/kernels/dropout.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::nn {

struct Dropout::State : SavedState {
  bool active = false;  // false: forward was the identity
  RandomKey key;
  Shape shape;
};

Dropout::Dropout(std::string name, float p, int64_t slice)
    : Module(std::move(name)), p_(p), slice_(slice) {
  LOOM_CHECK(p >= 0.0f && p <= 1.0f, "dropout '", this->name(), "': probability ", p,
             " must lie in [0, 1]");
  LOOM_CHECK(slice >= 0, "dropout '", this->name(), "': slice ", slice, " must not be negative");
}

RandomKey Dropout::key(const Tape& tape) const {
  return RandomKey{tape.random_seed(), random_stream_id(name())};
}

Tensor Dropout::forward(const Tensor& x, Tape& tape) {
  LOOM_CHECK(x.defined(), "dropout '", name(), "': the input is undefined");
  State& state = tape.emplace<State>(*this);
  state.shape = x.shape();
  state.active = training() && p_ > 0.0f;
  if (!state.active) return x;
  state.key = key(tape);
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  trace::OpScope scope("dropout.forward", kernels::dropout_cost(x), x.device(), name());
  kernels::dropout_forward(x, p_, state.key, y, slice_ * x.numel());
  return y;
}

Tensor Dropout::backward_input(const Tensor& dy, Tape& tape) {
  const State state = tape.get<State>(*this);
  tape.release(*this);
  LOOM_CHECK(dy.defined() && dy.shape() == state.shape, "dropout '", name(), "': output gradient ",
             dy, " must have the input's shape ", shape_str(state.shape));
  if (!state.active) return dy;
  Tensor dx = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  trace::OpScope scope("dropout.backward_input", kernels::dropout_cost(dy), dy.device(), name());
  kernels::dropout_backward(dy, p_, state.key, dx, slice_ * dy.numel());
  return dx;
}

}  // namespace loom::nn
