// train_gpt's description of its pipeline at start: the schedule, the cut
// and each chunk's counted FLOPs, the simulator's bubble at those FLOPs.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include "../common/say.hpp"
#include "loom/loom.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "train_gpt_flags.hpp"

namespace loom::examples::gpt {

// Prints (on `lead`) how `pipeline` cuts the GPT and what it is expected to
// idle; returns what the stage-balance line should suggest when a stage
// computes well above the others (examples/common/compute_spread.hpp).
inline std::string describe_pipeline(bool lead, const Flags& f, const models::GPTConfig& config,
                                     const parallel::pipeline::Schedule& pipeline) {
  namespace pl = parallel::pipeline;
  std::string balance_hint = "--stage-layers";
  // The cut and each chunk's counted FLOPs (forward + backward of one sequence).
  const std::vector<int64_t> layers_per_chunk =
      pl::gpt_chunk_layers(config, pipeline, f.pipe.stage_layers);
  const std::vector<double> chunk_flops =
      pl::gpt_chunk_flops(config, pipeline, f.pipe.stage_layers);
  double total_flops = 0;
  for (const double x : chunk_flops) total_flops += x;
  std::string cut, costs;
  for (size_t c = 0; c < layers_per_chunk.size(); ++c) {
    cut += (cut.empty() ? "" : ",") + std::to_string(layers_per_chunk[c]);
    char cost[64];
    std::snprintf(cost, sizeof(cost), "%s%.3f (%.1f%%)", costs.empty() ? "" : ", ",
                  chunk_flops[c] / 1e9, 100.0 * chunk_flops[c] / total_flops);
    costs += cost;
  }
  say_on(lead,
         "pipeline: schedule %s, pp %d x %d virtual stage(s), %d micro-batches of %lld sequences, "
         "layers per chunk %s (%s); bubble at unit cost %.3f, at most %d chunk activations per "
         "rank\n",
         f.pipe.schedule.c_str(), f.pipe.pp, pipeline.virtual_stages, f.pipe.micro_batch_count(),
         static_cast<long long>(f.batch / f.pipe.micro_batch_count()), cut.c_str(),
         f.pipe.stage_layers.empty() ? "balanced by counted FLOPs" : "--stage-layers",
         pl::unit_cost_bubble(pl::schedule_kind_from_string(f.pipe.schedule),
                              {.pp = f.pipe.pp,
                               .micro_batches = f.pipe.micro_batch_count(),
                               .virtual_stages = f.pipe.virtual_stages}),
         pipeline.activation_bound);
  std::string recomputed;
  if (f.activation_checkpointing) recomputed = ", blocks recomputed in backward";
  if (f.checkpoint_attention) recomputed = ", attention recomputed in backward";
  for (const int stage : f.checkpoint_stages) {
    recomputed += str_cat(recomputed.empty() ? ", blocks recomputed on stage " : ", ", stage);
  }
  say_on(lead, "pipeline: counted GFLOP per sequence per chunk (forward + backward%s): %s\n",
         recomputed.c_str(), costs.c_str());
  // A last chunk without blocks that still outweighs a stage's share: the
  // head and the loss alone, which no cut of the blocks can lighten.
  if (layers_per_chunk.back() == 0 && chunk_flops.back() > total_flops / f.pipe.pp) {
    balance_hint =
        str_cat("the last stage holds only the head and the loss (vocabulary ", config.vocab, ", ",
                static_cast<int>(100.0 * chunk_flops.back() / total_flops + 0.5),
                "% of the counted FLOPs), which no --stage-layers lightens; --tp "
                "splits them");
  }
  // The simulator fed the counted FLOPs (F, B and W each a third of a chunk's).
  pl::ActionCosts counted;
  counted.forward.clear();
  for (const double x : chunk_flops) counted.forward.push_back(x / 3.0);
  counted.backward_input = counted.backward_weight = counted.forward;
  say_on(lead, "pipeline: expected bubble %.3f (the simulator at the counted FLOPs of this cut)\n",
         pl::simulate(pipeline, counted).bubble_fraction);
  return balance_hint;
}

}  // namespace loom::examples::gpt
