// Checkpoint (activation checkpointing): trade compute for memory.
//
// forward runs inner in a scratch context that is dropped right after, and
// keeps only the input (and the micro-batch's random seed). backward runs
// inner's forward again in a fresh context carrying that seed (so Dropout
// draws the same mask), then inner's backward on it. The gradients equal
// those of inner alone; the FLOPs of the recomputation are counted again
// (they are executed: hardware FLOPs, not model FLOPs).
//
// Split backward: backward_input recomputes and runs inner's backward_input,
// holding the recomputed context until backward_weight finishes with it.
#pragma once

#include <memory>
#include <string>

#include "loom/nn/module.hpp"

namespace loom::nn {

class Checkpoint : public Module {
 public:
  Checkpoint(std::string name, std::unique_ptr<Module> inner);

  Tensor forward(const Tensor& x, Context& ctx) override;
  Tensor backward_input(const Tensor& dy, Context& ctx) override;
  void backward_weight(Context& ctx) override;
  Tensor backward(const Tensor& dy, Context& ctx) override;
  void collect_parameters(std::vector<Parameter*>& out) override;
  void set_training(bool training) override;

  Module& inner() { return *inner_; }

 private:
  struct State;
  State& recompute(Context& ctx);

  std::unique_ptr<Module> inner_;
};

}  // namespace loom::nn
