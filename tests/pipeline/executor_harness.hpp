// Training a small GPT with the pipeline executor on in-process ranks
// (pp x dp, ZeRO stages 0 to 3), and the single-rank run on the same global
// batch that it must reproduce. Shared by the executor's tests.
//
// Data: step s's global batch is dp x M micro-batches of `rows` sequences of
// seq_len token ids (a fixed formula of step, row and position); data-parallel
// replica d takes micro-batches [d M, (d + 1) M). Each micro-batch's loss is
// the mean cross-entropy over its tokens; the step's gradient is that of the
// mean over all dp x M micro-batches, on one rank and in the pipeline alike.
// Optimizer: SGD, lr 0.1, momentum 0.9, through ZeroOptimizer (buckets of 4 to
// 16 KiB, so the small model still spans several buckets).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/models/gpt_config.hpp"
#include "loom/parallel/layout.hpp"
#include "loom/parallel/pipeline/executor.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/zero.hpp"

namespace loom::testing {

// vocab 37, 8 layers, d_model 16, 2 heads, seq_len 8: 8 layers take pp 4 x 2 chunks.
models::GPTConfig executor_test_config();

struct PipelineRun {
  parallel::pipeline::ScheduleKind kind = parallel::pipeline::ScheduleKind::one_f_one_b;
  int pp = 2;
  int dp = 1;
  int micro_batches = 4;
  int virtual_stages = 0;  // 0: the schedule's own
  // zb-v only: what its order is planned with (none: the unit-cost order).
  std::optional<parallel::pipeline::ZbVPlan> zb_v = {};
  int zero_stage = 0;
  int steps = 3;
  // Uneven inputs (parallel::UnevenInputs over dp): replica d has a batch for
  // its first replica_steps[d] steps and stands in with its last one after
  // that; the run lasts until no replica has one (`steps` is then ignored).
  // The single-rank run takes, at each step, the micro-batches of the
  // replicas that have a batch. Empty: every replica has every step's.
  std::vector<int> replica_steps = {};
  // A broken program, for the failure tests: stage s runs stage_steps[s]
  // steps (NOTE [local departures]). Empty: every stage runs `steps`.
  std::vector<int> stage_steps = {};
  int rows = 2;     // sequences per micro-batch
  double clip = 0;  // > 0: clip by the global norm
  // ExecutorOptions::packed_weight_bytes (0: every micro-batch packs the weights anew).
  int64_t packed_weight_bytes = parallel::pipeline::ExecutorOptions{}.packed_weight_bytes;
  // Blocks per chunk (build_gpt_chunks); empty: the default cut, balanced by counted FLOPs.
  std::vector<int64_t> chunk_layers = {};
  models::GPTConfig config = executor_test_config();
  // Where the pipeline ranks compute (config.module.device is overridden);
  // the single-rank reference runs as config says (the host by default).
  Device device = Device::cpu();
};

// What one rank saw.
struct RankRun {
  parallel::MeshCoord coord;
  std::vector<parallel::pipeline::StepStats> stats;  // per step
  std::map<std::string, std::vector<float>> params;  // after the last step
  parallel::MemoryStats memory;                      // ZeroOptimizer::memory() after the last step
  int64_t shard_numel = 0;                           // ZeroOptimizer::shard_numel()
  int receives_per_step = 0;                         // recv actions in its list
  int activation_bound = 0;                          // the schedule's
  // Shape headers this rank received on the pp group over all steps (if the
  // flight recorder kept every operation).
  int shape_headers_received = 0;
};

// This rank's part of `run` on `world` (pp x dp ranks): every rank calls it.
RankRun run_pipeline_rank(const PipelineRun& run, comm::Communicator& world);
// Every world rank's run, by world rank, on in-process ranks.
std::vector<RankRun> run_pipeline(const PipelineRun& run);

struct SingleRun {
  std::vector<double> losses;  // per step, the mean over the global batch
  std::vector<double> norms;   // per step, when clipping
  std::map<std::string, std::vector<float>> params;
};
// One rank, the whole model, the global batch's dp x M micro-batches in order.
SingleRun run_single_rank(const PipelineRun& run);

// Compares `got` with `want`: per step the loss averaged over the ranks, the
// norm, and every rank's parameters, each within atol + rtol |want|; and
// every copy of one parameter (data-parallel replicas, the token table on
// the first and the last stage) equal bit for bit, and (every_parameter)
// every reference parameter present. Returns "" or what differs.
std::string compare_with_single_rank(const std::vector<RankRun>& got, const SingleRun& want,
                                     double atol, double rtol, bool every_parameter = true);
// The largest |got - want| / (atol + rtol |want|) over the same values (<= 1:
// within tolerance): how near the tolerance a run came.
double worst_ratio(const std::vector<RankRun>& got, const SingleRun& want, double atol,
                   double rtol);

}  // namespace loom::testing
