#include "loom/nn/activation.hpp"

#include "loom/trace/op_scope.hpp"

namespace loom::nn {
namespace {

// The profiler's op names (string literals: trace::OpScope keeps them).
const char* op_name(kernels::Activation f, bool backward) {
  switch (f) {
    case kernels::Activation::relu:
      return backward ? "relu.backward_input" : "relu.forward";
    case kernels::Activation::gelu:
      return backward ? "gelu.backward_input" : "gelu.forward";
    case kernels::Activation::gelu_tanh:
      return backward ? "gelu_tanh.backward_input" : "gelu_tanh.forward";
  }
  return "activation";
}

}  // namespace

GELU::GELU(std::string name, kernels::Activation approximation)
    : ActivationModule(std::move(name), approximation) {
  LOOM_CHECK(
      approximation == kernels::Activation::gelu || approximation == kernels::Activation::gelu_tanh,
      "GELU '", this->name(), "': approximation ", kernels::activation_name(approximation),
      " is not a GELU (gelu or gelu_tanh)");
}

struct ActivationModule::State : SavedState {
  Tensor x;
};

Tensor ActivationModule::forward(const Tensor& x, Tape& tape) {
  LOOM_CHECK(x.defined(), kernels::activation_name(function_), " '", name(),
             "': the input is undefined");
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  {
    trace::OpScope scope(op_name(function_, false), kernels::activation_forward_cost(function_, x),
                         x.device(), name());
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
    trace::OpScope scope(op_name(function_, true), kernels::activation_backward_cost(function_, x),
                         x.device(), name());
    kernels::activation_backward(function_, x, dy, dx);
  }
  tape.release(*this);
  return dx;
}

}  // namespace loom::nn
