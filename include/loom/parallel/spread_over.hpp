// spread_over: how one per-rank quantity (a step's compute time, say) spreads
// over the ranks of a group, and which rank is furthest out: telling a
// straggler from a slow step.
//
//   const parallel::Spread busy = parallel::spread_over(*dp, compute_seconds);
//   if (lead) std::printf("%s\n", busy.summary("compute before the reduction", 1e3, "ms").c_str());
//   // compute before the reduction 301.2-412.0 ms (median 305.1) over 4 ranks; rank 3 36% above
//   the median
//
// Collective, like mean_over: every rank of `group` calls it in the same
// order as the group's other collectives (one all-gather of 8 bytes per rank)
// and every rank gets the same result. Ranks are the group's. A group of one
// rank returns its value without communicating.
//
// In data parallelism every rank does the same work between two gradient
// reductions, so the time a rank spends computing before it enters the
// reduction should be the same everywhere; the others wait for the slowest in
// the reduction. A rank well above the median (a slower device, a noisy
// neighbour on its core, a throttled node) makes the whole group that slow.
#pragma once

#include <string>
#include <string_view>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"

namespace loom::parallel {

struct Spread {
  int ranks = 1;
  double min = 0, median = 0, max = 0;  // the median of an even count: the mean of the middle two
  int min_rank = 0, max_rank = 0;       // the lowest rank holding the minimum / maximum
  // max / median - 1 (0 when the median is not positive): how far the
  // largest value is above the typical one.
  double excess() const;
  // Worth naming the rank: 10% above the median (on a shared 2-core machine
  // steps of a few ms jitter by up to about that much).
  static constexpr double kNotable = 0.10;
  bool notable(double threshold = kNotable) const { return ranks > 1 && excess() >= threshold; }
  // "<what> 301.2-412.0 ms (median 305.1) over 4 ranks; rank 3 36% above the median",
  // values multiplied by `scale` and followed by `unit`; the last part only
  // when notable(threshold).
  std::string summary(std::string_view what, double scale, std::string_view unit,
                      double threshold = kNotable) const;
};

Spread spread_over(comm::Communicator& group, double value, Device device = Device::cpu());

}  // namespace loom::parallel
