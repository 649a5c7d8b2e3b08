// Dropout: in training, zero each element with probability p and scale the
// rest by 1 / (1 - p); the identity in eval mode or with p = 0.
//
// The mask's key is RandomKey{tape.random_seed(), random_stream_id(name())}:
// it depends on the micro-batch's seed and this module's name only, so a
// recomputation under Checkpoint (which copies the seed into its fresh
// tape) and the backward both regenerate the same mask, and nothing but
// the key is kept between forward and backward (kernels/dropout.hpp).
//
// A Dropout built with slice s > 0 takes slice s of a larger tensor cut into
// equal consecutive slices (a sequence-parallel rank's tokens) and draws that
// slice of the larger tensor's mask: the ranks together drop exactly what one
// rank dropping the whole tensor would.
#pragma once

#include <cstdint>
#include <string>

#include "loom/core/random.hpp"
#include "loom/nn/module.hpp"

namespace loom::nn {

class Dropout : public Module {
 public:
  Dropout(std::string name, float p, int64_t slice = 0);

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;

  float p() const { return p_; }
  int64_t slice() const { return slice_; }
  // The key forward draws its mask from under `tape`.
  RandomKey key(const Tape& tape) const;

 private:
  struct State;
  float p_;
  int64_t slice_;
};

}  // namespace loom::nn
