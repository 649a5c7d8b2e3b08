// Conv2d: a 2-D convolution layer over NCHW input (kernels/conv2d.hpp).
//
//   nn::Conv2d conv("layer1.0.conv1", 64, 64, 3, {.stride = 1, .padding = 1});
//   y = conv.forward(x, tape);   // x [N, 64, H, W] -> y [N, 64, H', W']
//
// Parameters: "<name>.weight" [out, in, kernel, kernel] and, with bias,
// "<name>.bias" [out]. Both are initialised like PyTorch's default
// (kaiming-uniform with a = sqrt(5)): uniform in +-1/sqrt(in * kernel^2),
// drawn from RandomKey{seed, random_stream_id(parameter name)}.
// forward saves x; backward_input saves dy for backward_weight, which writes
// the gradients (NOTE [gradient contributions]) and releases the state.
//
// Mixed precision (nn/precision.hpp): under bf16 the products take
// bf16 operands with f32 sums; the output is written in
// Precision::activations (bf16 under precision_from_string("bf16"): rounded
// once from the f32 sums), the input is taken in f32 or bf16 (a bf16 one is
// the operand as it is, and is saved for backward in half the bytes), and the
// input gradient comes back in the input's dtype. The weight and its gradient
// stay f32 (on CUDA the weight gradient is rounded to bf16 once before it is
// accumulated: NOTE [bf16 operands on CUDA] in kernels/conv2d.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "loom/kernels/conv2d.hpp"
#include "loom/nn/module.hpp"

namespace loom::nn {

struct Conv2dOptions {
  int64_t stride = 1;
  int64_t padding = 0;
  bool bias = false;  // a ResNet's convolutions feed BatchNorm, which has its own shift
  // false: backward_input skips the input gradient and returns an undefined
  // tensor (a first layer, whose input is data nobody differentiates).
  bool input_gradient = true;
  ModuleOptions module = {};
};

class Conv2d : public Module {
 public:
  Conv2d(std::string name, int64_t in_channels, int64_t out_channels, int64_t kernel,
         const Conv2dOptions& options = {});

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;
  void backward_weight(Tape& tape) override;
  // Its weight gradient needs only the saved input and the output gradient.
  bool backward_weight_reads_parameters() override { return false; }
  void collect_parameters(std::vector<Parameter*>& out) override;

  Parameter& weight() { return *weight_; }
  Parameter* bias() { return bias_.get(); }  // null without bias
  const kernels::Conv2dParams& params() const { return params_; }

 private:
  struct State;
  kernels::Conv2dParams params_;
  DType output_dtype_;
  bool input_gradient_ = true;
  std::unique_ptr<Parameter> weight_;
  std::unique_ptr<Parameter> bias_;
};

}  // namespace loom::nn
