#include "loom/optim/adamw.hpp"

#include <cmath>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/kernels/optimizer_update.hpp"

namespace loom::optim {
namespace {

const AdamWOptions& checked(const AdamWOptions& o) {
  LOOM_CHECK(o.beta1 >= 0.0 && o.beta1 < 1.0 && o.beta2 >= 0.0 && o.beta2 < 1.0, "AdamW betas (",
             o.beta1, ", ", o.beta2, ") must lie in [0, 1)");
  LOOM_CHECK(o.eps > 0.0 && std::isfinite(o.eps), "AdamW eps ", o.eps,
             " must be finite and positive");
  LOOM_CHECK(o.weight_decay >= 0.0 && std::isfinite(o.weight_decay), "AdamW weight_decay ",
             o.weight_decay, " must be finite and non-negative");
  return o;
}

}  // namespace

AdamW::AdamW(std::vector<ParamSlot> slots, const AdamWOptions& options)
    : Optimizer(std::move(slots), checked(options).lr, {"exp_avg", "exp_avg_sq"}),
      options_(options) {}

kernels::OpCost AdamW::slot_cost(const Tensor& value) const {
  return kernels::adamw_update_cost(value);
}

void AdamW::update_slot(size_t i, const Tensor& value, const Tensor& grad,
                        const std::vector<Tensor>& state) {
  kernels::AdamWUpdate u;
  u.lr = lr();
  u.beta1 = options_.beta1;
  u.beta2 = options_.beta2;
  u.eps = options_.eps;
  u.weight_decay = slots()[i].weight_decay ? options_.weight_decay : 0.0;
  u.step = step_count();
  kernels::adamw_update(value, grad, state[0], state[1], u);
}

}  // namespace loom::optim
