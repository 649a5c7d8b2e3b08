// CrossEntropyLoss: the mean negative log-likelihood of softmax(logits) at
// the targets (kernels/cross_entropy.hpp), fused and numerically stable.
//
//   Tensor loss = ce.forward(logits [..., V] f32, targets [...] i32/i64, tape);
//   Tensor dlogits = ce.backward(tape, dloss = 1);   // logits' shape
//
// Leading dimensions are flattened into rows. Rows whose target equals
// ignore_index (-1 by default) are left out of the mean and get a zero
// gradient. loss is a scalar (shape {}) f32 tensor on the logits' device.
// forward keeps the logits, targets and one logsumexp per row in tape (not the
// probabilities); backward releases them. When the tape holds the only handle
// on the logits (drop yours after forward), backward writes dlogits over them
// instead of allocating a second [rows, V] tensor. Not a Module (it takes two inputs
// and has no input gradient to pass on besides dlogits).
#pragma once

#include <cstdint>
#include <string>

#include "loom/core/tensor.hpp"
#include "loom/nn/tape.hpp"

namespace loom::nn {

class CrossEntropyLoss {
 public:
  explicit CrossEntropyLoss(std::string name = "loss", int64_t ignore_index = -1);

  Tensor forward(const Tensor& logits, const Tensor& targets, Tape& tape);
  Tensor backward(Tape& tape, float dloss = 1.0f);

  const std::string& name() const { return name_; }
  int64_t ignore_index() const { return ignore_index_; }

 private:
  struct State;

  std::string name_;
  int64_t ignore_index_;
};

}  // namespace loom::nn
