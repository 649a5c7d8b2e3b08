#include "loom/nn/activation.hpp"

#include "loom/trace/op_scope.hpp"

namespace loom::nn {

struct ActivationModule::State : SavedState {
  Tensor x;
};

Tensor ActivationModule::forward(const Tensor& x, Tape& tape) {
  LOOM_CHECK(x.defined(), kernels::activation_name(function_), " '", name(),
             "': the input is undefined");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  {
    const char* op = function_ == kernels::Activation::relu ? "relu.forward" : "gelu.forward";
    trace::OpScope scope(op, kernels::activation_forward_cost(function_, x), x.device(), name());
    kernels::activation_forward(function_, x, y);
  }
  tape.emplace<State>(*this).x = x;
  return y;
}

Tensor ActivationModule::backward_input(const Tensor& dy, Tape& tape) {
  const Tensor x = tape.get<State>(*this).x;
  LOOM_CHECK(dy.defined() && dy.shape() == x.shape(), kernels::activation_name(function_), " '",
             name(), "': output gradient ", dy, " must have the input's shape ",
             shape_str(x.shape()));
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  {
    const char* op =
        function_ == kernels::Activation::relu ? "relu.backward_input" : "gelu.backward_input";
    trace::OpScope scope(op, kernels::activation_backward_cost(function_, x), x.device(), name());
    kernels::activation_backward(function_, x, dy, dx);
  }
  tape.release(*this);
  return dx;
}

}  // namespace loom::nn
