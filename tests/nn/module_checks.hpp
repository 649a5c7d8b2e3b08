// Checks shared by the module tests: split backward (backward_input then
// backward_weight) gives the same bits as backward, and helpers for random
// inputs.
#pragma once

#include <catch2/catch.hpp>

#include <random>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/nn/module.hpp"

namespace loom::nn::testing {

inline Tensor random_input(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(static_cast<size_t>(shape_numel(shape)));
  for (float& v : values) v = dist(engine);
  return Tensor::from_vector(values, shape);
}

struct Gradients {
  std::vector<float> dx;
  std::vector<std::vector<float>> params;
};

// One forward and backward (split or not) from zeroed gradients.
inline Gradients run_backward(Module& module, const Tensor& x, const Tensor& dy, bool split) {
  module.zero_grad();
  Tape tape;
  module.forward(x, tape);
  Tensor dx;
  if (split) {
    dx = module.backward_input(dy, tape);
    module.backward_weight(tape);
  } else {
    dx = module.backward(dy, tape);
  }
  CHECK(tape.empty());
  Gradients g;
  if (dx.defined()) g.dx = dx.to_vector<float>();
  for (Parameter* p : module.parameters()) g.params.push_back(p->grad().to_vector<float>());
  return g;
}

// backward_input + backward_weight equals backward, bit for bit.
inline void check_split_backward(Module& module, const Tensor& x, const Shape& y_shape) {
  const Tensor dy = random_input(y_shape, 99);
  const Gradients whole = run_backward(module, x, dy, false);
  const Gradients split = run_backward(module, x, dy, true);
  CHECK(whole.dx == split.dx);
  REQUIRE(whole.params.size() == split.params.size());
  for (size_t i = 0; i < whole.params.size(); ++i) CHECK(whole.params[i] == split.params[i]);
}

}  // namespace loom::nn::testing
