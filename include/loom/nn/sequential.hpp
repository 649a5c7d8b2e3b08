// Sequential: children applied in order; the container owns them.
//
//   forward:         x -> c0 -> c1 -> ... -> y
//   backward:        each child's full backward (input, then weight), last
//                    child first, so gradients become ready progressively and
//                    a reducer can start on the last layers while the first
//                    are still running
//   backward_input:  every child's backward_input, last first
//   backward_weight: every child's backward_weight, last first
//
// Children keep the names they were given (pass child names such as
// "h.0.mlp.fc1" yourself). The container saves no state of its own.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/nn/module.hpp"

namespace loom::nn {

class Sequential : public Module {
 public:
  explicit Sequential(std::string name) : Module(std::move(name)) {}

  // Constructs a child of type M from `args` and appends it.
  template <class M, class... A>
  M& emplace(A&&... args) {
    auto child = std::make_unique<M>(std::forward<A>(args)...);
    M& ref = *child;
    add(std::move(child));
    return ref;
  }
  Module& add(std::unique_ptr<Module> child);
  // Swaps child i for `child` and returns the old one (wrapping a child, e.g.
  // parallel::shard_children); `child` may be null only until it is swapped back.
  std::unique_ptr<Module> replace(size_t i, std::unique_ptr<Module> child);

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;
  void backward_weight(Tape& tape) override;
  Tensor backward(const Tensor& dy, Tape& tape) override;
  void collect_parameters(std::vector<Parameter*>& out) override;
  std::vector<Module*> children() override;

  size_t size() const { return children_.size(); }
  Module& operator[](size_t i) { return *children_.at(i); }

 private:
  std::vector<std::unique_ptr<Module>> children_;
};

}  // namespace loom::nn
