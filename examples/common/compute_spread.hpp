// The examples' straggler line: how long each data-parallel rank computed
// before the step's gradient reduction (parallel::spread_over), and the world
// rank of the one well above the median. Collective over groups.dp: every
// rank calls it at the same steps.
//
//   data-parallel ranks: compute 40.1-74.4 ms (median 57.2) over 2 ranks; rank 1 30% above
//   the median (world rank 1)
#pragma once

#include <string>

#include "loom/core/error.hpp"
#include "loom/parallel/layout.hpp"
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

}  // namespace loom::examples
