// Internal: the order of ZB-V's compute actions, from a list scheduler
// (pipeline/generators.hpp says which action an idle rank picks).
#pragma once

#include <random>
#include <vector>

#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/pipeline/simulate.hpp"

namespace loom::parallel::pipeline::detail {

// Per rank, F, B and W of every micro-batch on the chunks `placement` gives
// it, with at most `activation_bound` chunk activations in flight per rank,
// planned with the per-chunk durations and the latency of `costs` (checked by
// the caller). Needs activation_bound >= the most chunks a rank holds (one
// micro-batch through all of them).
//
// With `rng`, a rank that has no ready B but could run an F or a pending W
// runs the W with probability `prefer_weight` (the randomised variants NOTE
// [zb-v bound search] tries); without, it runs the F.
std::vector<std::vector<Action>> zb_v_order(int pp, int micro_batches,
                                            const std::vector<ChunkPlace>& placement,
                                            int activation_bound, const ActionCosts& costs,
                                            std::mt19937_64* rng = nullptr,
                                            double prefer_weight = 0.0);

}  // namespace loom::parallel::pipeline::detail
