// Optimizer: the part SGD and AdamW share: slots, learning rate, step count,
// per-slot state tensors, zero_grad, and the memory the state takes.
//
// State is allocated (zero-filled) at construction, so state_bytes() is known
// before the first step (ZeRO accounting) and a checkpoint can be loaded into
// state() before stepping. state() returns views of the live tensors: a
// loader copies into them (Tensor::copy_from) and sets step_count().
//
// Every slot steps on every step(). A Parameter with nothing written since
// zero_grad() steps with a zero gradient (weight decay and momentum still
// apply); PyTorch would skip a parameter whose grad is None, but ranks of a
// data-parallel group must apply identical updates whichever rank used it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/kernels/cost.hpp"
#include "loom/optim/param_slot.hpp"

namespace loom::optim {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every slot; step_count() goes up by one first.
  void step();
  // Parameter slots: Parameter::zero_grad() (O(1)); buffer slots: fills the grad with zeros.
  void zero_grad();

  double lr() const { return lr_; }
  void set_lr(double lr);
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t steps);

  const std::vector<ParamSlot>& slots() const { return slots_; }
  // The current gradients of all slots, in slot order (for clip_grad_norm).
  std::vector<Tensor> grads() const;

  struct StateTensor {
    std::string name;  // "<slot name>.<state name>", e.g. "fc1.weight.exp_avg"
    Tensor tensor;
  };
  std::vector<StateTensor> state() const;
  // Bytes of optimizer state held (all slots, all state tensors).
  size_t state_bytes() const;

 protected:
  // `state_names`: the f32 tensors kept per slot (e.g. {"exp_avg", "exp_avg_sq"}).
  Optimizer(std::vector<ParamSlot> slots, double lr, std::vector<std::string> state_names);

  // The name of the OpScope around step() (a string literal).
  virtual const char* step_op_name() const = 0;
  virtual kernels::OpCost slot_cost(const Tensor& value) const = 0;
  // Updates slot i given its current value and gradient and its state tensors.
  virtual void update_slot(size_t i, const Tensor& value, const Tensor& grad,
                           const std::vector<Tensor>& state) = 0;

 private:
  std::vector<ParamSlot> slots_;
  std::vector<std::string> state_names_;
  std::vector<std::vector<Tensor>> state_;  // [slot][state name]
  double lr_ = 0;
  int64_t step_count_ = 0;
};

}  // namespace loom::optim
