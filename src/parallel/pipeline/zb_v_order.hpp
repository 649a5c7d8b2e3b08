// Internal: the order of ZB-V's compute actions, from a list scheduler
// (pipeline/generators.hpp says which action an idle rank picks).
#pragma once

#include <vector>

#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/pipeline/simulate.hpp"

namespace loom::parallel::pipeline::detail {

// Per rank, F, B and W of every micro-batch on the chunks `placement` gives
// it, with at most `activation_bound` chunk activations in flight per rank,
// planned with the per-chunk durations and the latency of `costs` (checked by
// the caller). Needs activation_bound >= the most chunks a rank holds (one
// micro-batch through all of them).
std::vector<std::vector<Action>> zb_v_order(int pp, int micro_batches,
                                            const std::vector<ChunkPlace>& placement,
                                            int activation_bound, const ActionCosts& costs);

}  // namespace loom::parallel::pipeline::detail
