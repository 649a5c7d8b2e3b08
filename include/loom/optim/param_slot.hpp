// ParamSlot: one tensor an optimizer updates, with its gradient.
//
// A slot either follows an nn::Parameter, whose value and gradient are fetched
// at every step (a data-parallel reducer may move the gradient into a bucket
// view between steps), or holds explicit tensors: a ZeRO shard of a flat
// parameter buffer with the matching shard of the gradient buffer. The
// optimizer keeps its state (momentum, Adam moments) per slot, flat, f32, on
// the value's device.
//
// Weight decay is chosen per slot; GPT practice decays matrices (embeddings,
// linear weights) and not biases or LayerNorm gains: DecayPolicy::matrices_only.
#pragma once

#include <string>
#include <vector>

#include "loom/core/tensor.hpp"
#include "loom/nn/parameter.hpp"

namespace loom::optim {

struct ParamSlot {
  std::string name;
  nn::Parameter* param = nullptr;  // followed at step time when set
  Tensor value;                    // explicit buffers when param is null
  Tensor grad;
  bool weight_decay = true;

  static ParamSlot of(nn::Parameter& param, bool weight_decay = true);
  // value and grad: same element count, dtype and device.
  static ParamSlot buffer(std::string name, Tensor value, Tensor grad, bool weight_decay = true);

  // The value and gradient to use now (for a Parameter: value() and grad(),
  // which reads as zeros when nothing was written since zero_grad()).
  Tensor current_value() const;
  Tensor current_grad() const;
};

enum class DecayPolicy {
  all,            // every slot decays
  none,           // no slot decays
  matrices_only,  // parameters of two or more dimensions decay; biases, norms' gains do not
};

std::vector<ParamSlot> param_slots(const std::vector<nn::Parameter*>& params,
                                   DecayPolicy policy = DecayPolicy::all);

}  // namespace loom::optim
