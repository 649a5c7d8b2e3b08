// The layout planner: for a GPT, a global batch and a cluster, every layout
// Loom can run (dp x tp x pp, sequence parallelism, ZeRO stage, pipeline
// schedule, micro-batches, activation checkpointing), each with its memory
// per device and its predicted step time, and the fastest that fits. Pure
// functions: nothing is built, run or communicated. `loom-plan` prints them
// (tools/loom_plan.cpp; docs/planner.md).
//
//   parallel::planner::Workload work{.model = models::GPTConfig::gpt2_124m(), .batch = 512};
//   parallel::planner::Cluster cluster{.nodes = 2, .devices_per_node = 8, ...};
//   const std::vector<Estimate> ranked = plan(work, cluster);  // fastest fitting first
//
// The model of a step (NOTE [planner step model] in src/parallel/planner.cpp
// says each term's assumptions):
//   memory    per rank, the largest rank's: parameters, gradients and
//             optimizer state as ZeroOptimizer keeps them at rest (exact
//             counts of the rank's parameters under the layout; ZeRO shards
//             within their 64-byte alignment), plus the activations its
//             schedule holds at its peak (models/gpt_memory.hpp per piece x
//             pipeline::peak_in_flight) and the transients (ZeRO-3's gathered
//             parameters, a recomputed block).
//   time      each chunk's forward, input-gradient and weight-gradient FLOPs
//             (models/gpt_flops.hpp; the chunk's share of the tp group's
//             work) at the cluster's sustained rate, plus the tp collectives
//             inside them at the tp group's bandwidth; the pipeline's step
//             from pipeline::simulate on the schedule the runtime would run
//             (so its bubble), with each stage message's transfer time as
//             the point-to-point latency; then the data-parallel traffic
//             that backward does not hide and the optimizer step at memory
//             bandwidth.
//   traffic   gpt_step_traffic below, the same count train_gpt prints at
//             start (docs/3d.md).
//
// What it leaves out is said in docs/planner.md (e.g. kernel efficiency that
// changes with the shapes a layout gives each product: one sustained rate
// for all of them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/models/gpt_config.hpp"
#include "loom/parallel/pipeline/generators.hpp"

namespace loom::parallel::planner {

// What the planner knows of a cluster (loom-plan's presets fill it from data
// sheets or from this machine). Bandwidths are all-reduce bus bandwidths
// (bytes a rank sends per second in a ring, 2(n-1)/n S / t), as
// collective_bench and nccl-tests report them; a point-to-point message is
// taken to move at the same rate.
struct Cluster {
  std::string name;
  int nodes = 1;
  int devices_per_node = 1;  // ranks per node (GPUs, or host cores)
  double memory_bytes = 0;   // per device, what a rank may use
  double peak_flops = 0;     // per device, dense, at the model's matmul precision
  double efficiency = 0.5;   // fraction of peak_flops the model's work sustains
  double intra_node_bandwidth = 0;
  double inter_node_bandwidth = 0;
  double latency = 10e-6;       // per collective and per message, seconds
  double memory_bandwidth = 0;  // device memory, bytes/s (the optimizer step)
  // The host's GEMMs keep each weight packed for a step (kernels::
  // PackedWeightScope, opened by the pipeline executor, and by train_gpt over
  // several micro-batches, except at ZeRO stage 3): a transient twice as
  // large as the rank's weight matrices (the forward's and the input
  // gradient's operand).
  bool packs_weights = false;
  // Where the ranks compute: the host or a GPU (Device::cuda(0) stands for
  // each rank's own). An automatic attention resolves by it
  // (models::GPTConfig::attention_kernel), and CUDA ranks keep the
  // vocabulary-parallel embedding's mask.
  Device device = Device::cpu();

  int world() const { return nodes * devices_per_node; }
  // Throws naming the field when a size or rate is not positive, or the
  // efficiency is outside (0, 1].
  void validate() const;
};

struct Workload {
  models::GPTConfig model;      // model.module.precision: the matmul precision
  int64_t batch = 8;            // sequences per step, over all replicas
  bool bf16_gradients = false;  // dp reduces gradients in bf16 (train_gpt --grad-reduce bf16)
  // ZeRO stages 2 and 3 hold at most two gradient buckets of this size in
  // flight (ZeroOptions::bucket_cap_bytes; train_gpt's --bucket-cap-mib, 25).
  double bucket_cap_bytes = 25.0 * 1048576.0;
};

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  bool sequence_parallel = false;
  int zero_stage = 0;
  // Hybrid sharding (ZeroOptions::replicas; train_gpt --zero-shard-size):
  // the ZeRO state sharded over groups of this many data-parallel ranks and
  // replicated over dp / zero_shard of them (0: sharded over the whole dp).
  int zero_shard = 0;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::one_f_one_b;
  int micro_batches = 1;                  // per replica per step (gradient accumulation at pp 1)
  int virtual_stages = 0;                 // 0: the schedule's own
  bool activation_checkpointing = false;  // whole blocks recomputed (train_gpt's flag)
  // Selective recompute: only each block's attention core (--checkpoint-attention);
  // not with activation_checkpointing.
  bool checkpoint_attention = false;
  // ZeRO 1, 2: the parameter all-gather after the step waited per module at
  // the next forward (ZeroOptions::overlap_param_gather, train_gpt's default),
  // or whole before it (--no-overlap-param-gather).
  bool overlap_param_gather = true;

  int world() const { return dp * tp * pp; }
  // The ranks one copy of the ZeRO state is sharded over.
  int shard_ranks() const { return zero_shard > 0 ? zero_shard : dp; }
  // "dp 2 x tp 2 x pp 2, SP, ZeRO-1, 1f1b, M 8, checkpointed"
  std::string str() const;
  // The train_gpt flags that run it: "--tp 2 --sequence-parallel --pp 2 ..."
  std::string flags() const;
};

struct Estimate {
  Layout layout;
  // Empty when the layout can run and fits; else the rule it breaks, naming
  // the numbers ("tp 3 does not divide the 12 heads", "needs 91.2 GiB per
  // device, 80.0 GiB available").
  std::string refused;
  bool fits() const { return refused.empty(); }

  // Bytes on the rank that holds the most (the pipeline stage with the most).
  double parameter_bytes = 0, gradient_bytes = 0, optimizer_bytes = 0;
  double activation_bytes = 0;  // the schedule's peak of kept activations
  double transient_bytes = 0;   // ZeRO-3's gathered parameters, a recomputed block
  double total_bytes = 0;

  // Seconds per step.
  double compute = 0;           // the busiest rank's forward and backward compute
  double tp_communication = 0;  // the busiest rank's tp collectives (inside its passes)
  double pipeline_step = 0;     // the simulated pipeline: compute + tp + messages + bubble
  double bubble_fraction = 0;   // simulate()'s idle share
  double dp_exposed = 0;        // data-parallel traffic backward does not hide
  double optimizer = 0;
  double step = 0;  // pipeline_step + dp_exposed + optimizer

  // Wire bytes per step of the busiest rank in each group (gpt_step_traffic).
  double dp_wire_bytes = 0, tp_wire_bytes = 0, pp_wire_bytes = 0;

  double model_flops = 0;  // per step: forward + backward of the batch, no recompute
  double mfu = 0;          // model_flops / (world x peak_flops x step)
  double tokens_per_second = 0;
};

// The estimate of one layout (refused with its reason when it cannot run on
// `cluster` or does not fit its memory). Throws on an invalid workload or
// cluster.
Estimate estimate(const Workload& work, const Cluster& cluster, const Layout& layout);

struct PlanOptions {
  std::vector<pipeline::ScheduleKind> schedules = {
      pipeline::ScheduleKind::one_f_one_b, pipeline::ScheduleKind::interleaved_1f1b,
      pipeline::ScheduleKind::zb_h1, pipeline::ScheduleKind::zb_v, pipeline::ScheduleKind::gpipe};
  int max_micro_batches = 64;  // per replica
  bool recompute = true;       // also consider recomputing the attention, or whole blocks
};

// Every layout of cluster.world() ranks: tp dividing the heads and the ranks
// of a node, pp up to the layers, dp what is left (dividing the batch); SP
// on and off; ZeRO 0-3 (0 at dp 1), and at stages 1-3, when dp spans nodes,
// also sharded over a node's dp ranks and replicated across nodes; each schedule at pp > 1 with M
// from pp doubling up to the rows per replica (gradient accumulation at pp 1); checkpointing off
// and on. Fitting layouts first, fastest first (less memory on ties), then the refused ones, the
// closest to fitting first.
std::vector<Estimate> plan(const Workload& work, const Cluster& cluster,
                           const PlanOptions& options = {});

// The layout to run: among the fitting layouts whose predicted step is within
// `tolerance` of the fastest, the simplest (NOTE [planner recommendation]):
// fewest pipeline stages, then fewest tp ranks, the least recompute (none,
// the attention, whole blocks), the lowest ZeRO stage, not hybrid, the fewest micro-batches, SP
// off before on, then the faster. `ranked` as plan() returns it; returns its
// index, or ranked.size() when nothing fits.
size_t recommended(const std::vector<Estimate>& ranked, double tolerance = 0.02);

// Parameter elements on each pipeline rank of one tp rank (pp entries), as
// build_gpt_chunks with TensorParallelGPTLayers creates them: each rank's
// blocks, the embeddings on the first chunk's rank, ln_f and (when the head
// is not on the embeddings' rank) the head's copy of the tied token table on
// the last chunk's. One entry per parameter tensor.
std::vector<std::vector<int64_t>> rank_parameter_numels(const models::GPTConfig& config,
                                                        const Layout& layout);

// The bytes ZeroOptimizer keeps at rest for parameters of `numels` elements
// of f32 on one of `dp` ranks sharing the state (hybrid sharding: the shard
// group's) at `stage` (its 64-byte alignment included):
// {parameters, gradients, optimizer state} with AdamW's two moments.
struct StateBytes {
  double parameters = 0, gradients = 0, optimizer = 0;
};
StateBytes zero_state_bytes(const std::vector<int64_t>& numels, int dp, int stage);

// The bytes one rank of a GPT run puts on the wire per training step in each
// parallel group, ring algorithms (an all-reduce of S bytes over n ranks sends
// 2(n-1)/n S per rank). train_gpt prints them at start (docs/3d.md).
struct TrafficShape {
  double parameter_bytes = 0;  // this rank's part of the model (unsharded)
  int dp = 1, tp = 1;
  int zero_stage = 0;
  int zero_shard = 0;                       // hybrid sharding: Layout::zero_shard
  int64_t batch = 0, seq = 0, d_model = 0;  // sequences per replica per step
  int64_t blocks = 0;                       // transformer blocks on this rank
  bool first_stage = true;                  // holds the (vocabulary-parallel) embedding
  bool last_stage = true;                   // holds the head (column-parallel, tied)
  int micro_batches = 1;                    // under a pipeline
  int virtual_stages = 0;                   // chunks per rank; 0 without a pipeline
  bool sequence_parallel = false;
  bool recompute = false;       // blocks run forward twice
  bool bf16_gradients = false;  // gradients reduced in bf16
};
struct StepTraffic {
  double dp = 0, tp = 0, pp = 0;  // wire bytes per rank per step
  // Hybrid sharding: of `dp`, the bytes averaging the shard's gradient over
  // the replicas (the rest stays in the shard group).
  double dp_replicas = 0;
};
StepTraffic gpt_step_traffic(const TrafficShape& shape);

}  // namespace loom::parallel::planner
