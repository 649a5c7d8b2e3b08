// LayerNorm over the last dimension with a learned weight (initialised to 1)
// and bias (initialised to 0); see kernels/layer_norm.hpp for the formulas.
// x [..., dim] -> y [..., dim]. Forward keeps x and the per-row mean and rstd;
// backward_input writes dx, backward_weight the weight and bias gradients.
// f32 on the host and on CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "loom/nn/module.hpp"

namespace loom::nn {

class LayerNorm : public Module {
 public:
  LayerNorm(std::string name, int64_t dim, float eps = 1e-5f, ModuleOptions options = {});

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;
  void backward_weight(Tape& tape) override;
  // Its weight gradient needs only the saved input and the output gradient.
  bool backward_weight_reads_parameters() override { return false; }
  void collect_parameters(std::vector<Parameter*>& out) override;

  int64_t dim() const { return dim_; }
  float eps() const { return eps_; }
  Parameter& weight() { return *weight_; }
  Parameter& bias() { return *bias_; }

 private:
  struct State;
  int64_t dim_;
  float eps_;
  std::unique_ptr<Parameter> weight_, bias_;
};

}  // namespace loom::nn
