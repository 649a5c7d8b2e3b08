#include "loom/nn/residual.hpp"

#include "loom/kernels/elementwise.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::nn {

Residual::Residual(std::string name, std::unique_ptr<Module> inner,
                   std::unique_ptr<Module> shortcut)
    : Module(std::move(name)), inner_(std::move(inner)), shortcut_(std::move(shortcut)) {
  LOOM_CHECK(inner_ != nullptr, "residual '", this->name(), "': the inner module is null");
}

// A fresh tensor: a branch's output may be its input itself (an identity
// Dropout), so adding in place could overwrite a tensor someone else holds.
Tensor Residual::sum(const char* op, const Tensor& a, const Tensor& b) const {
  LOOM_CHECK(a.defined() && b.defined() && a.shape() == b.shape(), "residual '", name(),
             "': the branches give ", a, " and ", b, "; they must have one shape");
  Tensor out = Tensor::empty(a.shape(), a.dtype(), a.device());
  trace::OpScope scope(op, kernels::elementwise_cost(kernels::ElementwiseOp::add, out), a.device(),
                       name());
  kernels::add(a, b, out);
  return out;
}

Tensor Residual::forward(const Tensor& x, Tape& tape) {
  const Tensor y = inner_->forward(x, tape);
  const Tensor s = shortcut_ ? shortcut_->forward(x, tape) : x;
  return sum("residual.forward", y, s);
}

Tensor Residual::backward_input(const Tensor& dy, Tape& tape) {
  const Tensor dx = inner_->backward_input(dy, tape);
  const Tensor ds = shortcut_ ? shortcut_->backward_input(dy, tape) : dy;
  return sum("residual.backward_input", dx, ds);
}

void Residual::backward_weight(Tape& tape) {
  inner_->backward_weight(tape);
  if (shortcut_) shortcut_->backward_weight(tape);
}

Tensor Residual::backward(const Tensor& dy, Tape& tape) {
  const Tensor dx = inner_->backward(dy, tape);
  const Tensor ds = shortcut_ ? shortcut_->backward(dy, tape) : dy;
  return sum("residual.backward_input", dx, ds);
}

void Residual::collect_parameters(std::vector<Parameter*>& out) {
  inner_->collect_parameters(out);
  if (shortcut_) shortcut_->collect_parameters(out);
}

std::vector<Module*> Residual::children() {
  if (shortcut_) return {inner_.get(), shortcut_.get()};
  return {inner_.get()};
}

}  // namespace loom::nn
