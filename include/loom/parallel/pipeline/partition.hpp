// Balanced contiguous partitions: a model's layers, in order, cut into
// consecutive ranges (a pipeline's chunks) so that the most expensive range
// costs as little as possible. Pure functions, no communication.
//
// A chunk's cost is a fixed cost of its own (what it holds besides the
// layers: the GPT's embeddings on the first chunk, its head on the last) plus
// the costs of the layers it takes. A rank's load is the sum of its chunks'
// costs (chunk_ranks; by default each chunk on a rank of its own).
// balanced_partition returns the cut that
//   1. minimises the largest chunk cost (the classic linear partition
//      problem; exact dynamic programme, O(chunks x layers^2)); every cut
//      whose chunks stay within kPartitionTolerance of that minimum counts as
//      optimal (counted FLOPs do not predict time to 1%, and the GPT's
//      embeddings, a few thousand FLOPs, should not decide where a block
//      goes);
//   2. among those, minimises the largest rank load (it matters where a rank
//      holds several chunks: interleaved, ZB-V's V);
//   3. among those, minimises the sum of squared chunk costs, so the chunks
//      that do not set the maximum are as even as they can be;
//   4. among those, gives the earlier chunks as many layers as it can (the
//      lexicographically largest cut), so the result is unique.
// Step 2 enumerates the cuts that step 1 leaves (pruned by the programme's
// tables); where more than kPartitionSearchLimit of them remain it is
// skipped, and steps 1, 3 and 4 stay exact. tests/pipeline/partition_test.cpp
// checks all four against brute force.
//
// Costs are doubles; whole numbers below 2^53 (FLOP counts) add exactly, so
// step 1 is exact for them. Bad input throws loom::Error naming the value and
// the rule: no chunks, a negative or non-finite cost, a per-chunk list of the
// wrong length, a negative rank, or more layers demanded (min_layers) than
// there are.
#pragma once

#include <cstdint>
#include <vector>

namespace loom::parallel::pipeline {

struct PartitionProblem {
  std::vector<double> layer_costs;  // per layer, in order, >= 0
  std::vector<double> chunk_costs;  // per chunk, its fixed cost, >= 0 (its size: the chunks)
  std::vector<int64_t> min_layers;  // per chunk, the fewest layers it may take (>= 0)
  std::vector<int> chunk_ranks;     // per chunk, the rank holding it; empty: chunk c on rank c
};

inline constexpr double kPartitionTolerance = 0.01;
inline constexpr int64_t kPartitionSearchLimit = 200000;

// Layers per chunk, in order, summing to layer_costs.size().
std::vector<int64_t> balanced_partition(const PartitionProblem& problem);

// Each chunk's cost under `cut` (layers per chunk, checked against the problem).
std::vector<double> partition_costs(const PartitionProblem& problem,
                                    const std::vector<int64_t>& cut);

}  // namespace loom::parallel::pipeline
