// pipeline_bench's worker (pipeline_bench.cpp has the driver): one process
// of a timed run under mpirun, the whole model on every rank (the single-rank
// and two-rank ceilings) or one pipeline schedule, printing its record as JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/models/gpt_config.hpp"
#include "loom/parallel/pipeline/generators.hpp"
#include "loom/parallel/pipeline/schedule.hpp"

namespace loom::bench::pipeline_bench {

inline constexpr int64_t kBatch = 8;  // sequences per global batch (issue 4)
inline constexpr int kLayers = 8;

struct WorkerFlags {
  std::string mode = "pipeline";  // pipeline, or single (the whole model on every rank)
  std::string schedule = "1f1b";
  int micro_batches = 8;
  int steps = 6;
  int warmup = 2;
  std::string cut = "balanced";  // balanced (by counted FLOPs) or even (by block count)
  bool activation_checkpointing = false;
  // cpu, or cuda: each process on its launcher-local rank's GPU (two
  // processes may share one), the executor's messages staged by the mpi backend.
  std::string device = "cpu";
  int receives_ahead = 2;  // ExecutorOptions::receives_ahead
  // ExecutorOptions::packed_weight_bytes, in MiB (0: every micro-batch packs the weights)
  int packed_weight_mib = 256;
  // zb-v only: plan the order with these durations and bound (the driver's
  // planned rows); the default is the unit-cost order.
  parallel::pipeline::ZbVPlan zb_v_plan;
};

// Issue 4's GPT (vocab 8192, d_model 256, 4 heads, seq 128) with kLayers
// blocks, checkpointed under --activation-checkpointing, on the host (the
// driver's view of it: module.device is set by each worker).
models::GPTConfig bench_config(const WorkerFlags& f);

// Blocks per chunk under the --cut rule.
std::vector<int64_t> cut_of(const WorkerFlags& f, const models::GPTConfig& config,
                            const parallel::pipeline::Schedule& schedule);

// Runs this process's part of a timed run; returns the exit status.
int run_worker(const WorkerFlags& f);

}  // namespace loom::bench::pipeline_bench
