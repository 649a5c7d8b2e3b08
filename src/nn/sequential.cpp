#include "loom/nn/sequential.hpp"

namespace loom::nn {

Module& Sequential::add(std::unique_ptr<Module> child) {
  LOOM_CHECK(child != nullptr, "sequential '", name(), "': cannot add a null child");
  child->set_training(training());
  children_.push_back(std::move(child));
  return *children_.back();
}

std::unique_ptr<Module> Sequential::replace(size_t i, std::unique_ptr<Module> child) {
  LOOM_CHECK(i < children_.size(), "sequential '", name(), "': child ", i, " out of range (",
             children_.size(), " children)");
  if (child) child->set_training(training());
  std::swap(children_[i], child);
  return child;
}

Tensor Sequential::forward(const Tensor& x, Tape& tape) {
  Tensor y = x;
  for (auto& child : children_) y = child->forward(y, tape);
  return y;
}

Tensor Sequential::backward_input(const Tensor& dy, Tape& tape) {
  Tensor g = dy;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it)
    g = (*it)->backward_input(g, tape);
  return g;
}

void Sequential::backward_weight(Tape& tape) {
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) (*it)->backward_weight(tape);
}

Tensor Sequential::backward(const Tensor& dy, Tape& tape) {
  Tensor g = dy;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) g = (*it)->backward(g, tape);
  return g;
}

void Sequential::collect_parameters(std::vector<Parameter*>& out) {
  for (auto& child : children_) child->collect_parameters(out);
}

std::vector<Module*> Sequential::children() {
  std::vector<Module*> out;
  out.reserve(children_.size());
  for (auto& child : children_) out.push_back(child.get());
  return out;
}

}  // namespace loom::nn
