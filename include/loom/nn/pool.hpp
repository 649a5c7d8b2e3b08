// Pooling layers over NCHW activations (kernels/pool2d.hpp); no parameters.
//
//   MaxPool2d      y = max over kernel x kernel windows (ResNet's ImageNet stem:
//                  kernel 3, stride 2, padding 1); saves the argmax for backward.
//   AvgPool2d      y = mean over the windows, padding counted as zeros.
//   GlobalAvgPool  [N, C, H, W] -> [N, C], the mean of each plane (ResNet's head).
//
// backward_input releases the state (there is no weight pass).
#pragma once

#include <cstdint>
#include <string>

#include "loom/kernels/pool2d.hpp"
#include "loom/nn/module.hpp"

namespace loom::nn {

class MaxPool2d : public Module {
 public:
  MaxPool2d(std::string name, int64_t kernel, int64_t stride, int64_t padding = 0);
  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;

 private:
  struct State;
  kernels::Pool2dParams params_;
};

class AvgPool2d : public Module {
 public:
  AvgPool2d(std::string name, int64_t kernel, int64_t stride, int64_t padding = 0);
  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;

 private:
  struct State;
  kernels::Pool2dParams params_;
};

class GlobalAvgPool : public Module {
 public:
  explicit GlobalAvgPool(std::string name);
  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;

 private:
  struct State;
};

}  // namespace loom::nn
