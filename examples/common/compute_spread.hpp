// The examples' straggler line: how long each data-parallel rank computed
// before the step's gradient reduction (parallel::spread_over), and the world
// rank of the one well above the median. Collective over groups.dp: every
// rank calls it at the same steps.
//
//   data-parallel ranks: compute 40.1-74.4 ms (median 57.2) over 2 ranks; rank 1 30% above
//   the median (world rank 1)
//
// And the pipeline's: how long each stage computed in the step, which one is
// well above the median, and the share of the step the others must idle
// whatever the schedule (1 - mean / slowest: the bubble floor of
// pipeline_bench), with what balances the cut. Collective over groups.pp.
//
//   pipeline stages: compute 61.2-93.0 ms (median 77.1) over 2 ranks; rank 0 21% above the
//   median (world rank 0); the others idle at least 0.171 of the step: --stage-cut time or
//   --stage-layers
#pragma once

#include <cstdio>
#include <string>

#include "loom/core/error.hpp"
#include "loom/parallel/layout.hpp"
#include "loom/parallel/mean_over.hpp"
#include "loom/parallel/pipeline/executor.hpp"
#include "loom/parallel/spread_over.hpp"

namespace loom::examples {

inline std::string compute_spread_line(const parallel::ParallelGroups& groups,
                                       double busy_seconds) {
  const parallel::Spread busy = parallel::spread_over(*groups.dp, busy_seconds);
  std::string line = str_cat("data-parallel ranks: ", busy.summary("compute", 1e3, "ms"));
  if (busy.notable()) {
    line += str_cat(" (world rank ",
                    groups.layout.world_rank(
                        {.tp = groups.coord.tp, .dp = busy.max_rank, .pp = groups.coord.pp}),
                    ")");
  }
  return line;
}

inline std::string stage_spread_line(const parallel::ParallelGroups& groups, double busy_seconds,
                                     const std::string& balance_hint) {
  const parallel::Spread busy = parallel::spread_over(*groups.pp, busy_seconds);
  const double mean = parallel::mean_over(*groups.pp, busy_seconds);
  std::string line = str_cat("pipeline stages: ", busy.summary("compute", 1e3, "ms"));
  if (busy.notable()) {
    char idle[32];
    std::snprintf(idle, sizeof(idle), "%.3f", busy.max > 0 ? 1.0 - mean / busy.max : 0.0);
    line += str_cat(" (world rank ",
                    groups.layout.world_rank(
                        {.tp = groups.coord.tp, .dp = groups.coord.dp, .pp = busy.max_rank}),
                    "); the others idle at least ", idle, " of the step: ", balance_hint);
  }
  return line;
}

// What the examples print under a pipeline at a logged step: rank 0's waits
// on receives, messages and micro-batch activations, then stage_spread_line
// over `stats.compute_seconds()`; each line indented under the step line.
// Collective over groups.pp.
inline std::string pipeline_step_lines(const parallel::ParallelGroups& groups,
                                       const parallel::pipeline::StepStats& stats,
                                       const std::string& balance_hint) {
  char waits[256];
  std::snprintf(waits, sizeof(waits),
                "           pipeline (rank 0): %.1f ms waiting on receives (%.0f%% of the step), "
                "%lld messages sent, at most %d micro-batch chunk activations alive\n",
                stats.recv_wait_seconds * 1e3, 100.0 * stats.recv_wait_seconds / stats.step_seconds,
                static_cast<long long>(stats.messages_sent), stats.peak_tapes);
  return str_cat(waits, "           ",
                 stage_spread_line(groups, stats.compute_seconds(), balance_hint), "\n");
}

}  // namespace loom::examples
