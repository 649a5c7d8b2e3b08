// What a gradient is reduced over, shared by data parallelism (GradReducer)
// and ZeRO (ZeroOptimizer), which both run one gradient-bucket engine
// (docs/parallel.md, "Who reduces what").
//
// Every gradient is averaged over the data-parallel group (all-reduce, or
// reduce-scatter at ZeRO stages 2 and 3). A parameter's nn::Placement may ask
// for more, before that average:
//
//   Placement.sum_grad_over_tp     summed over ReductionGroups::tp
//   Placement.tied_across_stages   summed over ReductionGroups::embedding
//
// and the global gradient norm sums over ReductionGroups::model (the tensor-
// and pipeline-parallel ranks of one replica), counting a tensor-parallel
// replica on tp rank 0 only and a tied copy on the embedding group's rank 0
// only. A group left null is a group of one rank: asking a sum over a null
// group throws at construction, naming the parameter.
#pragma once

#include <string_view>

#include "loom/comm/communicator.hpp"
#include "loom/parallel/layout.hpp"

namespace loom::parallel {

// Unused parameters (no gradient written by the step's end): `error` throws
// on every rank naming the first one and the rank that did not write it (one
// 8-byte all-reduce per step lets the ranks agree, so a parameter unused on
// one rank only fails everywhere instead of hanging); `zero_fill` reduces a
// zero gradient for them.
enum class UnusedParameters { error, zero_fill };
std::string_view unused_parameters_name(UnusedParameters value);

struct ReductionGroups {
  comm::Communicator* tp = nullptr;         // sums of sum_grad_over_tp gradients
  comm::Communicator* embedding = nullptr;  // sums of tied copies (null on a middle stage)
  comm::Communicator* model = nullptr;      // tp x pp of one replica: the norm's sum
};

// The groups of `groups` (which must outlive their use).
ReductionGroups reduction_groups(const ParallelGroups& groups);

}  // namespace loom::parallel
