// A module that only owns parameters, for tests that write the gradients
// themselves (no forward pass): ZeRO with bf16/f16 parameters, whose host
// layers would otherwise need low-precision kernels for every op.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/nn/module.hpp"

namespace loom::test {

class ParamBag final : public nn::Module {
 public:
  // One parameter per (name, size), holding `init[j]` rounded to `dtype`.
  ParamBag(std::string name, const std::vector<std::pair<std::string, int64_t>>& sizes,
           const std::vector<std::vector<float>>& init, DType dtype)
      : nn::Module(std::move(name)) {
    for (size_t j = 0; j < sizes.size(); ++j) {
      const Tensor value = Tensor::from_vector(init[j], {sizes[j].second}).to(dtype);
      params_.push_back(std::make_unique<nn::Parameter>(child_name(sizes[j].first), value));
    }
  }
  Tensor forward(const Tensor& x, nn::Tape&) override { return x; }
  Tensor backward_input(const Tensor& dy, nn::Tape&) override { return dy; }
  void collect_parameters(std::vector<nn::Parameter*>& out) override {
    for (auto& p : params_) out.push_back(p.get());
  }

 private:
  std::vector<std::unique_ptr<nn::Parameter>> params_;
};

}  // namespace loom::test
