// MLP: the transformer feed-forward block, Linear(dim -> hidden) -> GELU ->
// Linear(hidden -> dim), as a Sequential of children named name.fc1 and
// name.fc2 (PyTorch-like uniform initialisation, with biases). The GELU (exact
// or the tanh approximation) is fc1's epilogue and its derivative fc2's input
// gradient's (NOTE [fused activation] in nn/linear.hpp).
#pragma once

#include <cstdint>
#include <string>

#include "loom/kernels/activation.hpp"
#include "loom/nn/linear.hpp"
#include "loom/nn/sequential.hpp"

namespace loom::nn {

class MLP : public Sequential {
 public:
  MLP(std::string name, int64_t dim, int64_t hidden, ModuleOptions options = {},
      kernels::Activation gelu = kernels::Activation::gelu);

  Linear& fc1() { return *fc1_; }
  Linear& fc2() { return *fc2_; }

 private:
  Linear* fc1_ = nullptr;
  Linear* fc2_ = nullptr;
};

}  // namespace loom::nn
