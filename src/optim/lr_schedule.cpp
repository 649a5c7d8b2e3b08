#include "loom/optim/lr_schedule.hpp"

#include <cmath>
#include <numbers>

#include "loom/core/error.hpp"

namespace loom::optim {

void WarmupCosine::validate() const {
  LOOM_CHECK(std::isfinite(peak) && std::isfinite(min) && 0.0 <= min && min <= peak,
             "WarmupCosine: need 0 <= min <= peak; got min ", min, ", peak ", peak);
  LOOM_CHECK(0 <= warmup_steps && warmup_steps <= total_steps,
             "WarmupCosine: need 0 <= warmup_steps <= total_steps; got warmup_steps ", warmup_steps,
             ", total_steps ", total_steps);
}

double WarmupCosine::lr_at(int64_t step) const {
  validate();
  LOOM_CHECK(step >= 0, "WarmupCosine::lr_at: step ", step, " must be >= 0");
  if (step < warmup_steps) {
    return peak * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (step >= total_steps) return min;
  const double progress =
      static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min + (peak - min) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace loom::optim
