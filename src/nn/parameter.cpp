#include "loom/nn/parameter.hpp"

#include <algorithm>

#include "loom/core/error.hpp"

namespace loom::nn {

Parameter::Parameter(std::string name, Tensor value, int uses_per_backward)
    : name_(std::move(name)), value_(std::move(value)) {
  LOOM_CHECK(value_.defined(), "parameter '", name_, "' has no value");
  set_uses_per_backward(uses_per_backward);
}

void Parameter::set_value_buffer(const Tensor& buffer) {
  LOOM_CHECK(buffer.numel() == value_.numel() && buffer.dtype() == value_.dtype() &&
                 buffer.device() == value_.device(),
             "parameter '", name_, "': value buffer ", buffer.str(), " does not match the value ",
             value_.str(), " (element count, dtype and device must agree)");
  Tensor target = buffer.view(value_.shape());
  if (!target.shares_storage(value_) || target.storage_offset() != value_.storage_offset()) {
    target.copy_from(value_);
  }
  value_ = target;
}

const Tensor& Parameter::grad() {
  if (!grad_.defined()) {
    grad_ = Tensor::zeros(value_.shape(), value_.dtype(), value_.device());
  } else if (!grad_written_) {
    grad_.zero();
  }
  return grad_;
}

void Parameter::zero_grad() {
  grad_written_ = false;
}

void Parameter::set_grad_buffer(const Tensor& buffer) {
  LOOM_CHECK(buffer.numel() == value_.numel() && buffer.dtype() == value_.dtype() &&
                 buffer.device() == value_.device(),
             "parameter '", name_, "': gradient buffer ", buffer.str(),
             " does not match the value ", value_.str(),
             " (element count, dtype and device must agree)");
  Tensor target = buffer.view(value_.shape());
  if (grad_written_ && grad_.defined() &&
      !(target.shares_storage(grad_) && target.storage_offset() == grad_.storage_offset())) {
    target.copy_from(grad_);
  }
  grad_ = target;
}

Parameter::GradWrite Parameter::begin_grad_write() {
  if (!grad_.defined()) grad_ = Tensor::empty(value_.shape(), value_.dtype(), value_.device());
  return GradWrite{grad_, grad_written_};
}

void Parameter::end_grad_write() {
  grad_written_ = true;
  if (++pending_uses_ >= uses_per_backward_) {
    pending_uses_ = 0;
    mark_ready();
  }
}

void Parameter::set_uses_per_backward(int uses) {
  LOOM_CHECK(uses >= 1, "parameter '", name_, "': uses_per_backward is ", uses,
             "; it must be at least 1");
  uses_per_backward_ = uses;
  pending_uses_ = 0;
}

int Parameter::add_ready_hook(ReadyHook hook) {
  hooks_.emplace_back(next_hook_id_, std::move(hook));
  return next_hook_id_++;
}

void Parameter::remove_ready_hook(int id) {
  std::erase_if(hooks_, [id](const auto& entry) { return entry.first == id; });
}

void Parameter::mark_ready() {
  for (auto& [id, hook] : hooks_) hook(*this);
}

}  // namespace loom::nn
