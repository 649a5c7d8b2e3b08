#include "loom/nn/dropout.hpp"

#include "loom/kernels/dropout.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::nn {

struct Dropout::State : SavedState {
  bool active = false;  // false: forward was the identity
  RandomKey key;
  int64_t offset = 0;  // the input's first element in the mask
  Shape shape;
};

Dropout::Dropout(std::string name, float p, int64_t slice, int64_t slices)
    : Module(std::move(name)), p_(p), slice_(slice), slices_(slices) {
  LOOM_CHECK(p >= 0.0f && p <= 1.0f, "dropout '", this->name(), "': probability ", p,
             " must lie in [0, 1]");
  LOOM_CHECK(slices >= 1 && slice >= 0 && slice < slices, "dropout '", this->name(), "': slice ",
             slice, " of ", slices, " must lie in [0, slices)");
}

int64_t Dropout::mask_offset(const Tensor& x, const Tape& tape) const {
  const int64_t offset = slice_ * x.numel();
  if (tape.first_row() == 0) return offset;
  LOOM_CHECK(tape.first_row() > 0, "dropout '", name(), "': the tape's first row ",
             tape.first_row(), " must not be negative");
  LOOM_CHECK(x.dim() >= 1 && x.size(0) > 0 && (x.numel() * slices_) % x.size(0) == 0, "dropout '",
             name(), "': input ", x, " (slice ", slice_, " of ", slices_,
             ") has no whole rows along dimension 0 to place at the tape's first row ",
             tape.first_row());
  return tape.first_row() * (x.numel() * slices_ / x.size(0)) + offset;
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
  state.offset = mask_offset(x, tape);
  kernels::dropout_forward(x, p_, state.key, y, state.offset);
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
  kernels::dropout_backward(dy, p_, state.key, dx, state.offset);
  return dx;
}

}  // namespace loom::nn
