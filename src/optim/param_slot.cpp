#include "loom/optim/param_slot.hpp"

#include <utility>

#include "loom/core/error.hpp"

namespace loom::optim {

ParamSlot ParamSlot::of(nn::Parameter& param, bool weight_decay) {
  ParamSlot slot;
  slot.name = param.name();
  slot.param = &param;
  slot.weight_decay = weight_decay;
  return slot;
}

ParamSlot ParamSlot::buffer(std::string name, Tensor value, Tensor grad, bool weight_decay) {
  LOOM_CHECK(value.defined() && grad.defined(), "optimizer slot '", name,
             "': value and grad must be defined");
  LOOM_CHECK(value.numel() == grad.numel() && value.dtype() == grad.dtype() &&
                 value.device() == grad.device(),
             "optimizer slot '", name, "': grad ", grad, " must match value ", value,
             " in element count, dtype and device");
  ParamSlot slot;
  slot.name = std::move(name);
  slot.value = std::move(value);
  slot.grad = std::move(grad);
  slot.weight_decay = weight_decay;
  return slot;
}

Tensor ParamSlot::current_value() const {
  return param != nullptr ? param->value() : value;
}

Tensor ParamSlot::current_grad() const {
  return param != nullptr ? param->grad() : grad;
}

std::vector<ParamSlot> param_slots(const std::vector<nn::Parameter*>& params, DecayPolicy policy) {
  std::vector<ParamSlot> slots;
  slots.reserve(params.size());
  for (nn::Parameter* p : params) {
    LOOM_CHECK(p != nullptr, "param_slots: parameter ", slots.size(), " is null");
    const bool decay = policy == DecayPolicy::all ||
                       (policy == DecayPolicy::matrices_only && p->value().dim() >= 2);
    slots.push_back(ParamSlot::of(*p, decay));
  }
  return slots;
}

}  // namespace loom::optim
