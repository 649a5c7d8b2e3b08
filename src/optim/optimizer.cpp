#include "loom/optim/optimizer.hpp"

#include <cmath>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/trace/op_scope.hpp"

namespace loom::optim {

Optimizer::Optimizer(std::vector<ParamSlot> slots, double lr, std::vector<std::string> state_names)
    : slots_(std::move(slots)), state_names_(std::move(state_names)) {
  set_lr(lr);
  state_.reserve(slots_.size());
  for (const ParamSlot& slot : slots_) {
    const Tensor value = slot.current_value();
    LOOM_CHECK(value.defined(), "optimizer slot '", slot.name, "' has no value tensor");
    LOOM_CHECK(value.dtype() == DType::f32 || value.dtype() == DType::bf16, "optimizer slot '",
               slot.name, "': value ", value, " is not f32 or bf16");
    std::vector<Tensor> tensors;
    for (size_t s = 0; s < state_names_.size(); ++s) {
      tensors.push_back(Tensor::zeros({value.numel()}, DType::f32, value.device()));
    }
    state_.push_back(std::move(tensors));
  }
}

void Optimizer::set_lr(double lr) {
  LOOM_CHECK(std::isfinite(lr) && lr >= 0.0, "learning rate ", lr,
             " must be finite and non-negative");
  lr_ = lr;
}

void Optimizer::set_step_count(int64_t steps) {
  LOOM_CHECK(steps >= 0, "optimizer step count ", steps, " must be non-negative");
  step_count_ = steps;
}

void Optimizer::step() {
  kernels::OpCost cost;
  std::vector<Tensor> values, grads;
  values.reserve(slots_.size());
  grads.reserve(slots_.size());
  for (const ParamSlot& slot : slots_) {
    if (slot.param != nullptr) slot.param->check_reduction_finished("optimizer step");
    values.push_back(slot.current_value());
    grads.push_back(slot.current_grad());
    cost += slot_cost(values.back());
  }
  const Device device = slots_.empty() ? Device::cpu() : values.front().device();
  trace::OpScope scope(step_op_name(), cost, device);
  ++step_count_;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const int64_t made_for = state_[i].empty() ? values[i].numel() : state_[i][0].numel();
    LOOM_CHECK(values[i].numel() == made_for, "optimizer slot '", slots_[i].name, "' now has ",
               values[i].numel(), " elements; its state was made for ", made_for);
    update_slot(i, values[i], grads[i], state_[i]);
  }
}

void Optimizer::zero_grad() {
  for (const ParamSlot& slot : slots_) {
    if (slot.param != nullptr) {
      slot.param->zero_grad();
    } else {
      slot.grad.zero();
    }
  }
}

std::vector<Tensor> Optimizer::grads() const {
  std::vector<Tensor> out;
  out.reserve(slots_.size());
  for (const ParamSlot& slot : slots_) out.push_back(slot.current_grad());
  return out;
}

std::vector<Optimizer::StateTensor> Optimizer::state() const {
  std::vector<StateTensor> out;
  for (size_t i = 0; i < slots_.size(); ++i) {
    for (size_t s = 0; s < state_names_.size(); ++s) {
      out.push_back({str_cat(slots_[i].name, ".", state_names_[s]), state_[i][s]});
    }
  }
  return out;
}

size_t Optimizer::state_bytes() const {
  size_t bytes = 0;
  for (const auto& tensors : state_) {
    for (const Tensor& t : tensors) bytes += t.nbytes();
  }
  return bytes;
}

}  // namespace loom::optim
