// Embedding: a [vocab, dim] table of learned rows looked up by integer ids.
//
//   ids (i32 or i64, any shape S) -> y [S..., dim]
//   backward_input returns an undefined Tensor (ids are not differentiable)
//   and keeps dy; backward_weight scatter-adds dy into the table's gradient
//   (deterministic, see kernels/embedding.hpp) and calls end_grad_write().
//
// The table is initialised normal(0, init_std = 0.02), deterministic per
// (seed, parameter name). weight() exposes the Parameter so a tied output
// head (Linear(name, embedding.weight())) can share it. f32.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "loom/nn/module.hpp"

namespace loom::nn {

class Embedding : public Module {
 public:
  Embedding(std::string name, int64_t vocab, int64_t dim, ModuleOptions options = {},
            float init_std = 0.02f);

  Tensor forward(const Tensor& ids, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;
  void backward_weight(Tape& tape) override;
  // Its weight gradient needs only the saved input and the output gradient.
  bool backward_weight_reads_parameters() override { return false; }
  void collect_parameters(std::vector<Parameter*>& out) override;

  int64_t vocab() const { return vocab_; }
  int64_t dim() const { return dim_; }
  Parameter& weight() { return *weight_; }

 private:
  struct State;
  int64_t vocab_, dim_;
  std::unique_ptr<Parameter> weight_;
};

}  // namespace loom::nn
