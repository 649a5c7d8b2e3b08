// Dropout: in training, zero each element with probability p and scale the
// rest by 1 / (1 - p); the identity in eval mode or with p = 0.
//
// The mask's key is RandomKey{tape.random_seed(), random_stream_id(name())}:
// it depends on the micro-batch's seed and this module's name only, so a
// recomputation under Checkpoint (which copies the seed into its fresh
// tape) and the backward both regenerate the same mask, and nothing but
// the key is kept between forward and backward (kernels/dropout.hpp).
//
// A Dropout built with slice s of `slices` takes slice s of a larger tensor
// cut into that many equal consecutive slices (a sequence-parallel rank's
// tokens) and draws that slice of the larger tensor's mask: the ranks
// together drop exactly what one rank dropping the whole tensor would.
//
// NOTE [dropout by global position] The element's index in the mask is its
// position in the step's global batch: the tape's first_row() (where this
// micro-batch's row 0 sits in the global batch; 0 by default) times the
// elements of one whole row (dimension 0 of the input, all slices), plus the
// slice's offset, plus the element's index in the input. With one seed for
// the step, a run over data-parallel ranks, pipeline micro-batches or
// gradient accumulation draws the masks one rank draws on the whole batch.
// (PyTorch and Megatron-LM draw from per-rank generator states, so their masks
// change with the layout.)
#pragma once

#include <cstdint>
#include <string>

#include "loom/core/random.hpp"
#include "loom/nn/module.hpp"

namespace loom::nn {

class Dropout : public Module {
 public:
  Dropout(std::string name, float p, int64_t slice = 0, int64_t slices = 1);

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;

  float p() const { return p_; }
  int64_t slice() const { return slice_; }
  int64_t slices() const { return slices_; }
  // The key forward draws its mask from under `tape`.
  RandomKey key(const Tape& tape) const;

 private:
  struct State;
  // The index of `x`'s first element in the mask (NOTE [dropout by global position]).
  int64_t mask_offset(const Tensor& x, const Tape& tape) const;

  float p_;
  int64_t slice_, slices_;
};

}  // namespace loom::nn
