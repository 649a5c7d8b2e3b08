// The bytes one rank of a GPT run puts on the wire per training step in each
// parallel group, as train_gpt prints them at start (docs/3d.md, "What a run
// prints at start"). Ring algorithms: an all-reduce of S bytes over n ranks
// sends 2(n-1)/n S per rank; the largest rank is taken when printing.
#pragma once

#include <cstdint>
#include <vector>

#include "../common/layout_table.hpp"
#include "loom/loom.hpp"

namespace loom::examples {

struct GptStepShape {
  int64_t batch = 0, seq = 0, d_model = 0;  // sequences per replica per step
  int64_t blocks = 0;                       // transformer blocks on this rank
  bool first_stage = true;                  // holds the (vocabulary-parallel) embedding
  int micro_batches = 1;                    // under --pp
  int virtual_stages = 0;                   // chunks per rank; 0 without a pipeline
  bool sequence_parallel = false;
  bool recompute = false;       // --activation-checkpointing: blocks run forward twice
  bool bf16_gradients = false;  // --grad-reduce bf16
};

// dp: the gradients reduced (all-reduce at ZeRO 0 and 1, reduce-scatter at 2
// and 3; bf16 gradients: half the bytes) and the parameters gathered (once at
// stages 1 and 2; at 3 twice, forward and backward, or twice per micro-batch
// under a pipeline). tp: per block two all-reduces of
// the step's activations forward and two backward (or their reduce-scatter /
// all-gather halves under sequence parallelism), half as many again when
// blocks are recomputed, and the vocabulary-parallel embedding's. pp: each
// micro-batch's activation out and gradient back per chunk (a token slice
// under sequence parallelism).
inline std::vector<GroupTraffic> gpt_step_traffic(const parallel::ParallelGroups& groups,
                                                  const parallel::ZeroOptimizer& zero,
                                                  const GptStepShape& s) {
  double param_bytes = 0;  // this rank's part of the model
  for (const nn::Parameter* p : zero.parameters()) {
    param_bytes += static_cast<double>(p->numel()) * static_cast<double>(dtype_size(p->dtype()));
  }
  const double n_dp = groups.dp->size(), n_tp = groups.tp->size();
  const double activations = static_cast<double>(s.batch * s.seq * s.d_model) * 4.0;
  // Gradients: all-reduced (two passes) at stages 0 and 1, reduce-scattered
  // (one) at 2 and 3, half the bytes in bf16. Parameters: all-gathered once
  // after the step at stages 1 and 2, around every use at stage 3.
  const int stage = zero.stage();
  const double grad_passes = (stage <= 1 ? 2.0 : 1.0) * (s.bf16_gradients ? 0.5 : 1.0);
  const double param_passes =
      stage == 0 ? 0.0 : (stage < 3 ? 1.0 : 2.0 * (s.virtual_stages > 0 ? s.micro_batches : 1));
  const double dp_passes = grad_passes + param_passes;
  const double tp_collectives =
      4.0 * static_cast<double>(s.blocks) * (s.recompute ? 1.5 : 1.0) + (s.first_stage ? 1.0 : 0.0);
  const double pp_messages = 2.0 * s.virtual_stages;
  return {{"dp", groups.dp.get(), dp_passes * (n_dp - 1) / n_dp * param_bytes},
          {"tp", groups.tp.get(), tp_collectives * 2.0 * (n_tp - 1) / n_tp * activations},
          {"pp", groups.pp.get(), pp_messages * activations / (s.sequence_parallel ? n_tp : 1.0)}};
}

}  // namespace loom::examples
