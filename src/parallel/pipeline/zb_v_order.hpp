// Internal: the order of ZB-V's compute actions, from a list scheduler run at
// unit cost (pipeline/generators.hpp says which action an idle rank picks).
#pragma once

#include <vector>

#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::parallel::pipeline::detail {

// Per rank, F, B and W of every micro-batch on the chunks `placement` gives
// it, with at most `activation_bound` chunk activations in flight per rank.
// Needs activation_bound >= 2 (one micro-batch through both chunks of a rank).
std::vector<std::vector<Action>> zb_v_order(int pp, int micro_batches,
                                            const std::vector<ChunkPlace>& placement,
                                            int activation_bound);

}  // namespace loom::parallel::pipeline::detail
