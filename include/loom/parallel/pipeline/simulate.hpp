// Timing a pipeline schedule from per-action durations: a pure function, the
// one the layout planner uses too.
//
// Each rank runs its list in order, starting at time 0. A compute action
// starts when the rank's previous action has ended and lasts its duration
// (BW: B + W of its chunk). A send takes no time on the rank (it is handed to
// the network) and its message arrives p2p_latency later; a receive ends when
// its message has arrived (or at once, if it already has): the time a rank
// spends in a receive is idle. Reduce gradients and the optimizer step take
// their given durations (0 by default).
//
//   makespan         the latest end of any action (the step time)
//   busy[r]          the time rank r spends in compute, reduce and optimizer
//   bubble_fraction  1 - sum(busy) / (pp * makespan): idle time over all
//                    ranks' time
//
// The schedule is validated first (validate_schedule), so a schedule that
// would deadlock or lacks its messages is a loom::Error, as are durations
// that are negative, not finite, or given per chunk for the wrong number of
// chunks.
#pragma once

#include <vector>

#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::parallel::pipeline {

struct ActionCosts {
  // One value for every chunk, or one per chunk (schedule.chunks() values).
  std::vector<double> forward{1.0};
  std::vector<double> backward_input{1.0};
  std::vector<double> backward_weight{1.0};
  double p2p_latency = 0.0;  // per message, from send to arrival
  double reduce_gradients = 0.0;
  double optimizer_step = 0.0;
  friend bool operator==(const ActionCosts&, const ActionCosts&) = default;
};

struct TimedAction {
  double start = 0.0;
  double end = 0.0;
};

struct Simulation {
  // Per rank, one entry per action of its list, in the same order.
  std::vector<std::vector<TimedAction>> timeline;
  std::vector<double> busy;
  double makespan = 0.0;
  double bubble_fraction = 0.0;
};

Simulation simulate(const Schedule& schedule, const ActionCosts& costs);

}  // namespace loom::parallel::pipeline
