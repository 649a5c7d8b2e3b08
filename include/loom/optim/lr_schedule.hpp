// Learning-rate schedules: pure functions of the step number.
//
// WarmupCosine (the GPT recipe): linear warm-up to `peak` over `warmup_steps`,
// then a half cosine from `peak` down to `min` at `total_steps`, then `min`.
// Steps count from 0 (the step about to run):
//   step < warmup_steps:           peak * (step + 1) / warmup_steps
//   warmup_steps <= step < total:  min + (peak - min) * (1 + cos(pi * p)) / 2,
//                                  p = (step - warmup_steps) / (total_steps - warmup_steps)
//   step >= total_steps:           min
// So the last warm-up step runs at peak, the first decay step at peak too, and
// the schedule reaches min exactly at total_steps.
//
//   optim::WarmupCosine schedule{6e-4, 6e-5, 2000, 600000};
//   opt.set_lr(schedule.lr_at(step));
#pragma once

#include <cstdint>

namespace loom::optim {

struct WarmupCosine {
  double peak = 0.0;
  double min = 0.0;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;

  // Throws loom::Error if 0 <= min <= peak or 0 <= warmup_steps <= total_steps does not hold.
  void validate() const;
  // Calls validate(); `step` must be >= 0.
  double lr_at(int64_t step) const;
};

}  // namespace loom::optim
