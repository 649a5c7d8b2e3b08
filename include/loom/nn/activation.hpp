// Point-wise activation modules: ReLU and GELU (the exact erf form, PyTorch's
// default, or the tanh approximation). No parameters; forward keeps its input for backward, which
// releases it (see kernels/activation.hpp for the functions and dtypes).
#pragma once

#include <string>

#include "loom/kernels/activation.hpp"
#include "loom/nn/module.hpp"

namespace loom::nn {

class ActivationModule : public Module {
 public:
  ActivationModule(std::string name, kernels::Activation function)
      : Module(std::move(name)), function_(function) {}

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;
  kernels::Activation function() const { return function_; }

 private:
  struct State;
  kernels::Activation function_;
};

class ReLU : public ActivationModule {
 public:
  explicit ReLU(std::string name) : ActivationModule(std::move(name), kernels::Activation::relu) {}
};

class GELU : public ActivationModule {
 public:
  // approximation: kernels::Activation::gelu (exact) or gelu_tanh.
  explicit GELU(std::string name, kernels::Activation approximation = kernels::Activation::gelu);
};

}  // namespace loom::nn
