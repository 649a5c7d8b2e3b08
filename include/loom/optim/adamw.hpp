// AdamW (decoupled weight decay), as torch.optim.AdamW: see
// kernels/optimizer_update.hpp for the formulas. Two f32 moments per slot
// ("exp_avg", "exp_avg_sq": 8 bytes per element). A slot with
// weight_decay == false uses weight decay 0.
#pragma once

#include <vector>

#include "loom/optim/optimizer.hpp"

namespace loom::optim {

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamSlot> slots, const AdamWOptions& options = {});
  const AdamWOptions& options() const { return options_; }

 private:
  const char* step_op_name() const override { return "adamw.step"; }
  kernels::OpCost slot_cost(const Tensor& value) const override;
  void update_slot(size_t i, const Tensor& value, const Tensor& grad,
                   const std::vector<Tensor>& state) override;

  AdamWOptions options_;
};

}  // namespace loom::optim
