// Checkpoint (activation checkpointing): trade compute for memory.
//
// forward runs inner in a scratch tape that is dropped right after, and
// keeps only the input (and the micro-batch's random seed). backward runs
// inner's forward again in a fresh tape carrying that seed (so Dropout
// draws the same mask), then inner's backward on it. The gradients equal
// those of inner alone; the FLOPs of the recomputation are counted again
// (they are executed: hardware FLOPs, not model FLOPs).
//
// Split backward: backward_input recomputes and runs inner's backward_input,
// holding the recomputed tape until backward_weight finishes with it.
#pragma once

#include <memory>
#include <string>

#include "loom/nn/module.hpp"

namespace loom::nn {

class Checkpoint : public Module {
 public:
  Checkpoint(std::string name, std::unique_ptr<Module> inner);

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;
  void backward_weight(Tape& tape) override;
  Tensor backward(const Tensor& dy, Tape& tape) override;
  void collect_parameters(std::vector<Parameter*>& out) override;

  std::vector<Module*> children() override { return {inner_.get()}; }
  Module& inner() { return *inner_; }

 private:
  struct State;
  State& recompute(Tape& tape);

  std::unique_ptr<Module> inner_;
};

}  // namespace loom::nn
