// Dropout: in training, zero each element with probability p and scale the
// rest by 1 / (1 - p); the identity in eval mode or with p = 0.
//
// The mask's key is RandomKey{tape.random_seed(), random_stream_id(name())}:
// it depends on the micro-batch's seed and this module's name only, so a
// recomputation under Checkpoint (which copies the seed into its fresh
// tape) and the backward both regenerate the same mask, and nothing but
// the key is kept between forward and backward (kernels/dropout.hpp).
#pragma once

#include <string>

#include "loom/core/random.hpp"
#include "loom/nn/module.hpp"

namespace loom::nn {

class Dropout : public Module {
 public:
  Dropout(std::string name, float p);

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;

  float p() const { return p_; }
  // The key forward draws its mask from under `tape`.
  RandomKey key(const Tape& tape) const;

 private:
  struct State;
  float p_;
};

}  // namespace loom::nn
