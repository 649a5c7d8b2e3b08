#include "loom/optim/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "loom/core/error.hpp"
#include "loom/kernels/elementwise.hpp"

namespace loom::optim {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.initial_scale) {
  const LossScalerOptions& o = options;
  LOOM_CHECK(std::isfinite(o.min_scale) && o.min_scale > 0, "LossScaler: min_scale ", o.min_scale,
             " must be positive and finite");
  LOOM_CHECK(std::isfinite(o.max_scale) && o.max_scale >= o.min_scale, "LossScaler: max_scale ",
             o.max_scale, " must be finite and at least min_scale ", o.min_scale);
  LOOM_CHECK(o.initial_scale >= o.min_scale && o.initial_scale <= o.max_scale,
             "LossScaler: initial_scale ", o.initial_scale, " must lie in [min_scale ", o.min_scale,
             ", max_scale ", o.max_scale, "]");
  LOOM_CHECK(std::isfinite(o.growth_factor) && o.growth_factor >= 1.0, "LossScaler: growth_factor ",
             o.growth_factor, " must be at least 1");
  LOOM_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, "LossScaler: backoff_factor ",
             o.backoff_factor, " must lie in (0, 1)");
  LOOM_CHECK(o.growth_interval >= 1, "LossScaler: growth_interval ", o.growth_interval,
             " must be at least 1");
}

void LossScaler::scale_gradient(const Tensor& dloss) const {
  LOOM_CHECK(dloss.defined(), "LossScaler::scale_gradient: the loss gradient is undefined");
  kernels::scale(dloss, static_cast<float>(scale_), dloss);
}

bool LossScaler::update(double global_grad_norm) {
  ++steps_;
  if (!std::isfinite(global_grad_norm)) {
    ++skipped_;
    good_in_a_row_ = 0;
    scale_ = std::max(options_.min_scale, scale_ * options_.backoff_factor);
    return false;
  }
  if (++good_in_a_row_ >= options_.growth_interval) {
    good_in_a_row_ = 0;
    scale_ = std::min(options_.max_scale, scale_ * options_.growth_factor);
  }
  return true;
}

}  // namespace loom::optim
