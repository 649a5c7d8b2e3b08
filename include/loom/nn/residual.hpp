// Residual: y = inner(x) + (shortcut ? shortcut(x) : x).
//
// inner's output must have x's shape (or the shortcut's output's). Backward
// sends dy to both branches and adds their input gradients. backward runs the
// branches' full backwards (inner first), so their gradients become ready as
// soon as each is done. The container saves no state of its own.
#pragma once

#include <memory>
#include <string>

#include "loom/nn/module.hpp"

namespace loom::nn {

class Residual : public Module {
 public:
  Residual(std::string name, std::unique_ptr<Module> inner,
           std::unique_ptr<Module> shortcut = nullptr);

  Tensor forward(const Tensor& x, Tape& tape) override;
  Tensor backward_input(const Tensor& dy, Tape& tape) override;
  void backward_weight(Tape& tape) override;
  Tensor backward(const Tensor& dy, Tape& tape) override;
  void collect_parameters(std::vector<Parameter*>& out) override;

  std::vector<Module*> children() override;
  Module& inner() { return *inner_; }
  Module* shortcut() { return shortcut_.get(); }

 private:
  Tensor sum(const char* op, const Tensor& a, const Tensor& b) const;

  std::unique_ptr<Module> inner_;
  std::unique_ptr<Module> shortcut_;
};

}  // namespace loom::nn
