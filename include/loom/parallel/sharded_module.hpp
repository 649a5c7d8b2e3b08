// ShardedModule: the unit ZeRO stage 3 gathers and frees parameters by.
//
//   auto block = std::make_unique<parallel::ShardedModule>(std::move(inner));
//
// A transparent wrapper around one module (a GPT block, a ResNet stage, or
// the whole model as the outermost unit): forward and backward run the inner
// module's. With a ZeroOptimizer at stage 3 attached, the wrapper's own
// parameters (those of the inner module not inside a nested ShardedModule)
// are all-gathered just before its forward and before its backward (the
// optimizer prefetches the next unit's while this one computes) and freed
// right after: after forward, and after backward_input, unless the inner
// module's backward_weight reads parameter values
// (nn::Module::backward_weight_reads_parameters; none of Loom's layers do),
// in which case backward_input keeps them until backward_weight. So under a
// split backward (a zero-bubble pipeline schedule, B now and W later) a unit
// is not held from a micro-batch's B to its W. Wrappers nest: an outer wrapper's parameters stay
// gathered while its inner modules run. At stages 1 and 2 with
// ZeroOptions::overlap_param_gather the wrapper's forward only waits for the
// all-gather of its own parameters that the last step() started; otherwise
// nothing is attached and the wrapper only forwards calls.
//
// shard_children(seq) wraps every child of a Sequential that has parameters
// (e.g. GPT::blocks(), or a ResNet's stem, blocks and head) in place.
//
// A wrapper may also borrow (it does not own) its inner module, when the
// inner module is owned elsewhere (a pipeline chunk, pipeline/gpt_chunks.hpp),
// and may name other wrappers whose parameters its inner module uses too
// (gather_with: a weight tied to one another wrapper holds, e.g. the GPT
// head's projection tied to the token table of the embeddings in another
// chunk on the same rank): its forward and backward then gather theirs as
// well, before its own, and release them after.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "loom/nn/module.hpp"
#include "loom/nn/sequential.hpp"

namespace loom::parallel {

class ShardedModule;

// Implemented by ZeroOptimizer at stage 3.
class ParameterGatherer {
 public:
  enum class Phase { forward, backward };
  virtual ~ParameterGatherer() = default;
  // The module's own parameters are gathered when this returns.
  virtual void before_use(ShardedModule& module, Phase phase) = 0;
  // The module is done with them for now.
  virtual void after_use(ShardedModule& module, Phase phase) = 0;
};

class ShardedModule : public nn::Module {
 public:
  // Takes the inner module's name.
  explicit ShardedModule(std::unique_ptr<nn::Module> inner);
  // Borrows `inner`, which must outlive the wrapper.
  explicit ShardedModule(nn::Module& inner);

  Tensor forward(const Tensor& x, nn::Tape& tape) override;
  Tensor backward_input(const Tensor& dy, nn::Tape& tape) override;
  void backward_weight(nn::Tape& tape) override;
  Tensor backward(const Tensor& dy, nn::Tape& tape) override;
  void collect_parameters(std::vector<nn::Parameter*>& out) override;
  // Its parameters are its own unit's, which it gathers and releases itself:
  // nothing that an enclosing unit holds.
  bool backward_weight_reads_parameters() override { return false; }

  std::vector<nn::Module*> children() override { return {inner_}; }
  nn::Module& inner() { return *inner_; }
  // Set (and cleared) by ZeroOptimizer; at most one at a time.
  void attach(ParameterGatherer* gatherer);
  bool attached() const { return gatherer_ != nullptr; }
  // `other`'s parameters are gathered around this wrapper's uses too (see the
  // file comment); `other` must outlive this wrapper and be attached to the
  // same gatherer. Refuses itself and a wrapper named twice.
  void gather_with(ShardedModule& other);

 private:
  // Around each forward and backward: the wrappers named by gather_with, then this one.
  void before_use(ParameterGatherer::Phase phase);
  void after_use(ParameterGatherer::Phase phase);

  // Whether the inner module's backward_weight reads its parameters (asked
  // at the first backward_input): if not, the unit is released right after
  // backward_input instead of after backward_weight.
  bool weight_pass_reads_parameters();
  std::optional<bool> weight_pass_reads_;

  std::unique_ptr<nn::Module> owned_;  // null when the inner module is borrowed
  nn::Module* inner_;
  std::vector<ShardedModule*> gather_with_;
  ParameterGatherer* gatherer_ = nullptr;
};

// Replaces every child of `seq` that has parameters by a ShardedModule around
// it; returns the wrappers in child order.
std::vector<ShardedModule*> shard_children(nn::Sequential& seq);

}  // namespace loom::parallel
