// The bytes one rank of a GPT run puts on the wire per training step in each
// parallel group, as train_gpt prints them at start (docs/3d.md, "What a run
// prints at start"). Ring algorithms: an all-reduce of S bytes over n ranks
// sends 2(n-1)/n S per rank; the largest rank is taken when printing.
#pragma once

#include <cstdint>
#include <vector>

#include "../common/layout_table.hpp"
#include "loom/loom.hpp"
#include "loom/parallel/planner.hpp"

namespace loom::examples {

struct GptStepShape {
  int64_t batch = 0, seq = 0, d_model = 0;  // sequences per replica per step
  int64_t blocks = 0;                       // transformer blocks on this rank
  bool first_stage = true;                  // holds the (vocabulary-parallel) embedding
  bool last_stage = true;                   // holds the head
  int micro_batches = 1;                    // under --pp
  int virtual_stages = 0;                   // chunks per rank; 0 without a pipeline
  bool sequence_parallel = false;
  bool recompute = false;       // --activation-checkpointing: blocks run forward twice
  bool bf16_gradients = false;  // --grad-reduce bf16
};

// parallel::planner::gpt_step_traffic's count (the planner predicts with the
// same one) for this rank's part of the model and ZeRO stage; under hybrid
// sharding (`hybrid` split from groups.dp) dp's bytes as the shard group's and
// the replicas'.
inline std::vector<GroupTraffic> gpt_step_traffic(const parallel::ParallelGroups& groups,
                                                  const parallel::ZeroOptimizer& zero,
                                                  const GptStepShape& s,
                                                  const parallel::ZeroGroups& hybrid = {}) {
  double param_bytes = 0;  // this rank's part of the model
  for (const nn::Parameter* p : zero.parameters()) {
    param_bytes += static_cast<double>(p->numel()) * static_cast<double>(dtype_size(p->dtype()));
  }
  const parallel::planner::StepTraffic t = parallel::planner::gpt_step_traffic(
      {.parameter_bytes = param_bytes,
       .dp = groups.dp->size(),
       .tp = groups.tp->size(),
       .zero_stage = zero.stage(),
       .zero_shard = zero.replica_count() > 1 ? zero.data_parallel_size() : 0,
       .batch = s.batch,
       .seq = s.seq,
       .d_model = s.d_model,
       .blocks = s.blocks,
       .first_stage = s.first_stage,
       .last_stage = s.last_stage,
       .micro_batches = s.micro_batches,
       .virtual_stages = s.virtual_stages,
       .sequence_parallel = s.sequence_parallel,
       .recompute = s.recompute,
       .bf16_gradients = s.bf16_gradients});
  std::vector<GroupTraffic> out;
  if (hybrid.shard) {
    out.push_back({"dp shard", hybrid.shard.get(), t.dp - t.dp_replicas});
    out.push_back({"dp replicas", hybrid.replicas.get(), t.dp_replicas});
  } else {
    out.push_back({"dp", groups.dp.get(), t.dp});
  }
  out.push_back({"tp", groups.tp.get(), t.tp});
  out.push_back({"pp", groups.pp.get(), t.pp});
  return out;
}

}  // namespace loom::examples
