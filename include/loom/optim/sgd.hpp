// SGD with momentum, dampening, Nesterov and (L2, coupled) weight decay, as
// torch.optim.SGD: see kernels/optimizer_update.hpp for the formulas. One
// momentum buffer per slot when momentum != 0, none otherwise. A slot with
// weight_decay == false uses weight decay 0.
#pragma once

#include <vector>

#include "loom/optim/optimizer.hpp"

namespace loom::optim {

struct SgdOptions {
  double lr = 1e-3;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;  // needs momentum > 0 and dampening == 0
};

class SGD final : public Optimizer {
 public:
  SGD(std::vector<ParamSlot> slots, const SgdOptions& options = {});
  const SgdOptions& options() const { return options_; }

 private:
  const char* step_op_name() const override { return "sgd.step"; }
  kernels::OpCost slot_cost(const Tensor& value) const override;
  void update_slot(size_t i, const Tensor& value, const Tensor& grad,
                   const std::vector<Tensor>& state) override;

  SgdOptions options_;
};

}  // namespace loom::optim
