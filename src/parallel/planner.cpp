#include "loom/parallel/planner.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "loom/core/error.hpp"
#include "loom/models/gpt_flops.hpp"
#include "loom/models/gpt_memory.hpp"
#include "loom/parallel/pipeline/gpt_chunks.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "loom/parallel/pipeline/validate.hpp"
#include "loom/parallel/vocab_parallel.hpp"

namespace loom::parallel::planner {

// NOTE [planner step model] What each term of an estimate assumes.
//
// Parameters: every GPT parameter is f32 (the bf16 and f16 precisions round
// copies for the products and keep the f32 values as masters:
// nn/precision.hpp), so 4 bytes per element. A tensor-parallel block holds
// 1/tp of c_attn, c_fc (columns, bias included) and both c_proj (rows); its
// LayerNorms and the c_proj biases (added once, after the reduction) are
// replicated. The token table is vocabulary-parallel (padded to a multiple
// of tp), the position table replicated.
//
// ZeRO (parallel/zero.hpp): at stage 0 gradients are the reducer's buckets,
// as large as the parameters; from stage 1 the parameters are laid out flat,
// each starting on a 64-byte boundary, and cut into dp shards of a multiple
// of 64 bytes (the parameters, and at stage 1 the gradients, view that
// padded buffer); AdamW keeps two f32 moments per element it steps (the
// shard from stage 1; the planner counts its padding too). Stage 2 keeps the
// gradient shard at rest (plus at most two buckets of
// Workload::bucket_cap_bytes in flight, a transient), stage 3 the parameter
// shard (plus, a transient, what its prefetch budget allows gathered at once:
// the two largest units, for the GPT the outer unit with the token table,
// gathered through the whole pass, and a block).
//
// Activations: what one micro-batch's forward keeps until its backward on
// one chunk (models/gpt_memory.hpp: embeddings, blocks, head; the head
// keeping the logits' gradient, as the executor runs the loss's backward at
// once; a chunk after the first also keeps the activation it received),
// times the
// chunk activations the schedule holds at its peak on the rank
// (pipeline::peak_in_flight), taking the rank's largest chunk, as
// pipeline_bench's bound does. Without a pipeline one micro-batch is alive
// at a time. Transients: under activation checkpointing the backward of a
// block recomputes and holds that block's full activations once; where a
// weight scope is open (kernels::PackedWeightScope: the executor always,
// train_gpt over several micro-batches; never at ZeRO stage 3), under a
// reduced precision the weights' bf16/f16 copies, made once per step, and on
// a cluster that packs weights (the host) every weight matrix packed twice
// (the forward's and the input gradient's operand); without a scope, one
// product's rounded copy; under a pipeline the message buffers (the receives
// posted ahead and one send). Checked against train_gpt's measured peak,
// which includes the memory outside the allocator (docs/planner.md).
// Not counted: a pass's working memory beyond what it keeps, and what a
// micro-batch keeps between its B and its W under the zero-bubble schedules
// beyond what its forward left (pipeline_bench measures both: docs/
// pipeline.md, "The activation bound without the overcount").
//
// Compute: each chunk's forward, input-gradient and weight-gradient FLOPs
// for one micro-batch as the ops count them (models/gpt_flops.hpp, the
// recompute included under checkpointing), a 1/tp share each, at
// peak_flops x efficiency. The tp collectives run inside the passes and are
// not overlapped: per block two all-reduces of the micro-batch's f32
// activations in forward and two in backward (the same bytes as the
// reduce-scatter and all-gather pairs of sequence parallelism; two more in
// backward under recompute), one for the vocabulary-parallel embedding, one
// for the head's input gradient, and the vocabulary-parallel loss's three
// small ones (latency only), each at the tp group's bus bandwidth plus the
// latency. Under sequence parallelism the column-parallel layers (two per
// block, the head) gather their inputs again in backward, half an
// all-reduce's bytes each, beside the input gradient's products: only what
// outlasts those products counts.
//
// Pipeline: pipeline::simulate on the schedule make_schedule returns (the
// one train_gpt runs, at unit cost for zb-v) with those per-chunk durations
// and, as the point-to-point latency, the latency plus a stage message's
// transfer time (the micro-batch's activations, 1/tp of them under sequence
// parallelism) at the bandwidth of the slowest stage boundary. Its makespan
// includes the bubble. At pp 1 the same simulation runs the micro-batches
// one after another.
//
// Data parallelism: the gradient reduction overlaps the last micro-batch's
// backward on the rank (buckets launch as gradients become ready), so only
// what exceeds that backward is exposed, and at least the last bucket's
// transfer (ZeroOptions::first_bucket_bytes, the small bucket that launches
// last). The parameter all-gather after the step (stages 1 and 2), waited
// for per module at the next forward (overlap_param_gather), hides behind the
// rank's first micro-batch forward except what exceeds it, and at least the
// share of the first of its units (the blocks and the rest); waited for whole
// at the step's start, it is exposed. Stage 3 gathers before each unit,
// prefetched behind the compute: only what exceeds the compute is exposed.
//
// Placement (ParallelLayout: tp innermost, then dp, then pp; ranks filled a
// node at a time): a tp group stays in a node (the planner refuses
// otherwise); the dp group and the chain of pipeline stages run at the
// inter-node bandwidth when they span nodes, else the intra-node one.
//
// Optimizer: AdamW reads the parameter, gradient and both moments and writes
// the parameter and the moments, 28 bytes per element stepped, at the
// memory bandwidth.

namespace {

constexpr double kF32 = 4.0;
constexpr int64_t kAlignElements = 16;           // 64 bytes of f32
constexpr double kLastBucket = 1.0 * 1048576.0;  // ZeroOptions::first_bucket_bytes
constexpr double kAdamWBytesPerElement = 28.0;

int64_t align_up(int64_t value, int64_t step) {
  return (value + step - 1) / step * step;
}

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", bytes / 1073741824.0);
  return text;
}

// Parameter tensors of one block on one tp rank.
std::vector<int64_t> block_numels(int64_t d, int tp) {
  return {d,
          d,  // ln_1
          d * 3 * d / tp,
          3 * d / tp,  // attn.c_attn (columns: its heads' q, k, v)
          d / tp * d,
          d,  // attn.c_proj (rows), bias replicated
          d,
          d,  // ln_2
          d * 4 * d / tp,
          4 * d / tp,  // mlp.c_fc (columns)
          4 * d / tp * d,
          d};  // mlp.c_proj (rows), bias replicated
}

// The layout's recompute replaces the workload's; the model lives on the cluster's device.
models::GPTConfig layout_config(const Workload& work, const Cluster& cluster,
                                const Layout& layout) {
  models::GPTConfig config = work.model;
  config.module.device = cluster.device;
  config.checkpoint_blocks = layout.activation_checkpointing;
  config.checkpoint_attention = layout.checkpoint_attention;
  return config;
}

pipeline::Schedule layout_schedule(const Layout& layout) {
  return pipeline::make_schedule(layout.schedule, {.pp = layout.pp,
                                                   .micro_batches = layout.micro_batches,
                                                   .virtual_stages = layout.virtual_stages});
}

// Blocks of each chunk, in dataflow order (one chunk at pp 1).
std::vector<int64_t> chunk_layers(const models::GPTConfig& config,
                                  const std::optional<pipeline::Schedule>& schedule) {
  if (!schedule) return {config.layers};
  return pipeline::gpt_chunk_layers(config, *schedule);
}

double sum(const std::vector<int64_t>& v) {
  double s = 0;
  for (const int64_t x : v) s += static_cast<double>(x);
  return s;
}

// Ranks per group kind in one node: whether a group whose members are
// `stride` apart and `size` long stays within a node.
bool within_node(const Cluster& cluster, int stride, int size) {
  if (cluster.nodes == 1) return true;
  const int span = stride * size;
  return span <= cluster.devices_per_node && cluster.devices_per_node % span == 0;
}

}  // namespace

void Cluster::validate() const {
  LOOM_CHECK(nodes >= 1, "cluster: nodes ", nodes, " must be at least 1");
  LOOM_CHECK(devices_per_node >= 1, "cluster: devices per node ", devices_per_node,
             " must be at least 1");
  LOOM_CHECK(memory_bytes > 0, "cluster: memory per device ", memory_bytes,
             " bytes must be positive");
  LOOM_CHECK(peak_flops > 0, "cluster: peak ", peak_flops, " FLOP/s must be positive");
  LOOM_CHECK(efficiency > 0 && efficiency <= 1, "cluster: efficiency ", efficiency,
             " must be in (0, 1] (the fraction of the peak the model's work sustains)");
  LOOM_CHECK(intra_node_bandwidth > 0, "cluster: intra-node bandwidth ", intra_node_bandwidth,
             " bytes/s must be positive");
  LOOM_CHECK(nodes == 1 || inter_node_bandwidth > 0, "cluster: inter-node bandwidth ",
             inter_node_bandwidth, " bytes/s must be positive with ", nodes, " nodes");
  LOOM_CHECK(latency >= 0, "cluster: latency ", latency, " s must not be negative");
  LOOM_CHECK(memory_bandwidth > 0, "cluster: memory bandwidth ", memory_bandwidth,
             " bytes/s must be positive");
}

std::string Layout::str() const {
  std::string s = str_cat("dp ", dp, " x tp ", tp, " x pp ", pp);
  if (sequence_parallel) s += ", SP";
  s += str_cat(", ZeRO-", zero_stage);
  if (zero_shard > 0) s += str_cat(" over ", zero_shard);
  if (pp > 1) {
    s += str_cat(", ", pipeline::to_string(schedule));
    if (virtual_stages > 0) s += str_cat(" v ", virtual_stages);
  }
  if (micro_batches > 1 || pp > 1) s += str_cat(", M ", micro_batches);
  if (activation_checkpointing) s += ", blocks recomputed";
  if (checkpoint_attention) s += ", attention recomputed";
  if ((zero_stage == 1 || zero_stage == 2) && !overlap_param_gather) s += ", gathered at step";
  return s;
}

std::string Layout::flags() const {
  std::string s;
  auto add = [&](const std::string& flag) { s += (s.empty() ? "" : " ") + flag; };
  if (tp > 1) add(str_cat("--tp ", tp));
  if (sequence_parallel) add("--sequence-parallel");
  if (pp > 1) {
    add(str_cat("--pp ", pp, " --schedule ", pipeline::to_string(schedule)));
    if (virtual_stages > 0) add(str_cat("--virtual-stages ", virtual_stages));
  }
  if (micro_batches > 1 || pp > 1) add(str_cat("--micro-batches ", micro_batches));
  if (zero_stage > 0) add(str_cat("--zero-stage ", zero_stage));
  if (zero_shard > 0) add(str_cat("--zero-shard-size ", zero_shard));
  if (activation_checkpointing) add("--activation-checkpointing");
  if (checkpoint_attention) add("--checkpoint-attention");
  if ((zero_stage == 1 || zero_stage == 2) && !overlap_param_gather) {
    add("--no-overlap-param-gather");
  }
  return s;
}

namespace {

// rank_parameter_numels for a schedule (its placement) and cut already made.
std::vector<std::vector<int64_t>> numels_per_rank(const models::GPTConfig& config, int tp,
                                                  const pipeline::Schedule& schedule,
                                                  const std::vector<int64_t>& layers) {
  const int chunks = static_cast<int>(layers.size());
  const int64_t d = config.d_model;
  const int64_t table = padded_vocab(config.vocab, tp) / tp * d;
  const std::vector<int64_t> block = block_numels(d, tp);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(schedule.pp));
  for (int c = 0; c < chunks; ++c) {
    std::vector<int64_t>& mine = out[static_cast<size_t>(schedule.rank_of(c))];
    if (c == 0) mine.insert(mine.end(), {table, config.seq_len * d});  // wte, wpe
    for (int64_t b = 0; b < layers[static_cast<size_t>(c)]; ++b) {
      mine.insert(mine.end(), block.begin(), block.end());
    }
    if (c == chunks - 1) {
      mine.insert(mine.end(), {d, d});                                        // ln_f
      if (schedule.rank_of(c) != schedule.rank_of(0)) mine.push_back(table);  // the tied copy
    }
  }
  return out;
}

}  // namespace

std::vector<std::vector<int64_t>> rank_parameter_numels(const models::GPTConfig& config,
                                                        const Layout& layout) {
  config.validate();
  const pipeline::Schedule schedule =
      layout.pp > 1 ? layout_schedule(layout)
                    : pipeline::make_schedule(pipeline::ScheduleKind::one_f_one_b,
                                              {.pp = 1, .micro_batches = 1});
  const std::vector<int64_t> layers =
      chunk_layers(config, layout.pp > 1 ? std::optional(schedule) : std::nullopt);
  return numels_per_rank(config, layout.tp, schedule, layers);
}

StateBytes zero_state_bytes(const std::vector<int64_t>& numels, int dp, int stage) {
  LOOM_CHECK(dp >= 1, "zero_state_bytes: dp ", dp, " must be at least 1");
  LOOM_CHECK(stage >= 0 && stage <= 3, "zero_state_bytes: stage ", stage, " must be 0 to 3");
  const double whole = sum(numels) * kF32;
  if (dp == 1 || stage == 0) return {whole, whole, 2.0 * whole};  // ZeroOptimizer runs stage 0
  int64_t flat = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    flat = i + 1 < numels.size() ? flat + align_up(numels[i], kAlignElements) : flat + numels[i];
  }
  const double shard =
      static_cast<double>(align_up(std::max<int64_t>(1, (flat + dp - 1) / dp), kAlignElements)) *
      kF32;
  const double padded = shard * dp;  // the flat buffer the parameters (stage 1: gradients) view
  return {stage == 3 ? shard : padded, stage >= 2 ? shard : padded, 2.0 * shard};
}

StepTraffic gpt_step_traffic(const TrafficShape& s) {
  const double n_dp = s.dp, n_tp = s.tp;
  const double activations = static_cast<double>(s.batch * s.seq * s.d_model) * kF32;
  // Gradients: all-reduced (two passes) at stages 0 and 1, reduce-scattered
  // (one) at 2 and 3, half the bytes in bf16. Parameters: all-gathered once
  // after the step at stages 1 and 2, around every use at stage 3 (forward
  // and backward; per micro-batch under a pipeline).
  const int stage = s.dp > 1 ? s.zero_stage : 0;
  // Hybrid sharding: the collectives below run over the shard group, and
  // each rank's 1/n_shard of the gradients is all-reduced over the replicas.
  const double n_shard = stage > 0 && s.zero_shard > 0 ? s.zero_shard : n_dp;
  const double n_replicas = n_dp / n_shard;
  const double grad_passes = (stage <= 1 ? 2.0 : 1.0) * (s.bf16_gradients ? 0.5 : 1.0);
  const double param_passes =
      stage == 0 ? 0.0 : (stage < 3 ? 1.0 : 2.0 * (s.virtual_stages > 0 ? s.micro_batches : 1));
  // tp, in all-reduces of the activations (an all-gather or a reduce-scatter
  // is half of one): 4 per block, 2 more for a recomputed forward, the
  // embedding's sum, the head's input gradient; under SP, the column-parallel layers' inputs
  // gathered again in backward (2 per block, 1 for the head: NOTE [sequence-parallel input kept as
  // a slice] in src/parallel/tensor_parallel.cpp).
  const auto blocks = static_cast<double>(s.blocks);
  const double tp_collectives =
      4.0 * blocks * (s.recompute ? 1.5 : 1.0) + (s.first_stage ? 1.0 : 0.0) +
      (s.last_stage ? 1.0 : 0.0) +
      (s.sequence_parallel ? 0.5 * (2.0 * blocks + (s.last_stage ? 1.0 : 0.0)) : 0.0);
  const double pp_messages = 2.0 * s.virtual_stages;
  StepTraffic t;
  t.dp_replicas = 2.0 * (n_replicas - 1) / n_replicas * (s.bf16_gradients ? 0.5 : 1.0) *
                  s.parameter_bytes / n_shard;
  t.dp = (grad_passes + param_passes) * (n_shard - 1) / n_shard * s.parameter_bytes + t.dp_replicas;
  t.tp = tp_collectives * 2.0 * (n_tp - 1) / n_tp * activations;
  t.pp = pp_messages * activations / (s.sequence_parallel ? n_tp : 1.0);
  return t;
}

Estimate estimate(const Workload& work, const Cluster& cluster, const Layout& layout) {
  cluster.validate();
  work.model.validate();
  LOOM_CHECK(work.batch >= 1, "planner: batch ", work.batch, " must be at least 1");
  LOOM_CHECK(work.bucket_cap_bytes > 0, "planner: bucket cap ", work.bucket_cap_bytes,
             " bytes must be positive");
  Estimate e;
  e.layout = layout;
  const models::GPTConfig config = layout_config(work, cluster, layout);
  const int64_t d = config.d_model, seq = config.seq_len;
  auto refuse = [&](std::string why) {
    e.refused = std::move(why);
    return e;
  };
  if (layout.dp < 1 || layout.tp < 1 || layout.pp < 1) {
    return refuse(str_cat("dp ", layout.dp, ", tp ", layout.tp, " and pp ", layout.pp,
                          " must each be at least 1"));
  }
  if (layout.world() != cluster.world()) {
    return refuse(
        str_cat("dp x tp x pp = ", layout.world(), " ranks, the cluster has ", cluster.world()));
  }
  if (config.heads % layout.tp != 0) {
    return refuse(str_cat("tp ", layout.tp, " does not divide the ", config.heads, " heads"));
  }
  if (cluster.devices_per_node % layout.tp != 0) {
    return refuse(str_cat("tp ", layout.tp, " does not divide the ", cluster.devices_per_node,
                          " devices of a node (a tp group stays in one node)"));
  }
  if (layout.sequence_parallel && (layout.tp == 1 || seq % layout.tp != 0)) {
    return refuse(layout.tp == 1 ? std::string("sequence parallelism needs tp > 1")
                                 : str_cat("tp ", layout.tp, " does not divide the sequence ", seq,
                                           " (sequence parallelism)"));
  }
  if (layout.activation_checkpointing && layout.checkpoint_attention) {
    return refuse(
        "the attention's recompute is part of the blocks' (--checkpoint-attention is not with "
        "--activation-checkpointing)");
  }
  if (layout.checkpoint_attention && work.model.attention == nn::AttentionKernel::fused) {
    return refuse(
        "the fused attention keeps no probabilities to recompute (--checkpoint-attention is not "
        "with --attention fused)");
  }
  if (layout.zero_stage < 0 || layout.zero_stage > 3) {
    return refuse(str_cat("ZeRO stage ", layout.zero_stage, " is not 0 to 3"));
  }
  if (layout.zero_shard != 0 &&
      (layout.zero_stage < 1 || layout.zero_shard < 2 || layout.zero_shard >= layout.dp ||
       layout.dp % layout.zero_shard != 0)) {
    return refuse(str_cat("hybrid sharding over groups of ", layout.zero_shard, " of dp ",
                          layout.dp, " at ZeRO stage ", layout.zero_stage,
                          ": it needs stage 1 to 3 and a group of at least 2 ranks, fewer than "
                          "dp, dividing it"));
  }
  if (work.batch % layout.dp != 0) {
    return refuse(str_cat("dp ", layout.dp, " does not divide the batch of ", work.batch));
  }
  const int64_t rows = work.batch / layout.dp;
  if (layout.micro_batches < 1 || rows % layout.micro_batches != 0) {
    return refuse(str_cat(layout.micro_batches, " micro-batches do not divide the ", rows,
                          " sequences per replica"));
  }
  const int64_t micro_rows = rows / layout.micro_batches;
  std::optional<pipeline::Schedule> schedule;
  std::vector<int64_t> layers;
  std::vector<std::vector<int64_t>> numels;
  try {
    if (layout.pp > 1) {
      schedule = layout_schedule(layout);
    } else {
      LOOM_CHECK(layout.virtual_stages == 0, "virtual stages need a pipeline (pp > 1)");
      // Gradient accumulation: the micro-batches one after another.
      schedule = pipeline::make_schedule(pipeline::ScheduleKind::one_f_one_b,
                                         {.pp = 1, .micro_batches = layout.micro_batches});
    }
    layers = chunk_layers(config, layout.pp > 1 ? schedule : std::nullopt);
    numels = numels_per_rank(config, layout.tp, *schedule, layers);
  } catch (const Error& error) {
    return refuse(error.what());
  }
  const int chunks = static_cast<int>(layers.size());

  // ---- memory ----
  const models::GPTActivationBytes kept =
      models::gpt_activation_bytes(config, micro_rows, seq, layout.tp, layout.sequence_parallel);
  models::GPTConfig plain = config;
  plain.checkpoint_blocks = false;
  const double recomputed_block =
      config.checkpoint_blocks ? models::gpt_activation_bytes(plain, micro_rows, seq, layout.tp,
                                                              layout.sequence_parallel)
                                     .block
                               : 0.0;
  // The materialised attention's score matrices while one block runs its
  // backward (models::gpt_attention_transient_bytes).
  const double attention_transient =
      models::gpt_attention_transient_bytes(config, micro_rows, seq, layout.tp);
  // As the pipeline executor and train_gpt keep them (NOTE [activation bytes
  // convention] in models/gpt_memory.hpp): the loss's backward runs at once
  // (dlogits kept instead of the logits and the loss's state), and the
  // weights' low-precision copies are made once per step by the weight scope
  // where one is open (a transient; without one, as at ZeRO stage 3, one
  // product's copy at a time).
  // A stage message: one micro-batch's f32 activations (a token slice under SP).
  const double message =
      static_cast<double>(micro_rows * seq * d) * kF32 / (layout.sequence_parallel ? layout.tp : 1);
  auto chunk_bytes = [&](int c) {
    // A chunk after the first keeps the activation it received (the first
    // block's LayerNorm saves its input); on one rank that is the previous
    // chunk's output, counted there.
    const bool received = c > 0 && schedule->rank_of(c - 1) != schedule->rank_of(c);
    return (received ? message : 0.0) + (c == 0 ? kept.embeddings : 0.0) +
           static_cast<double>(layers[static_cast<size_t>(c)]) * kept.block +
           (c == chunks - 1 ? kept.head - kept.loss_state : 0.0);
  };
  const int stage = layout.dp > 1 ? layout.zero_stage : 0;
  // A weight scope is open (train_gpt: over several micro-batches; the
  // pipeline executor: always) below stage 3.
  const bool scoped = (layout.pp > 1 || layout.micro_batches > 1) && stage != 3;
  auto chunk_weight_copies = [&](int c) {
    const auto blocks = static_cast<double>(layers[static_cast<size_t>(c)]);
    const double head = c == chunks - 1 ? kept.head_weight_copies : 0.0;
    // c_fc's and the MLP's c_proj are the largest, 4 d^2 / tp of the 12.
    if (!scoped) return std::max(head, blocks > 0 ? kept.block_weight_copies / 3.0 : 0.0);
    return blocks * kept.block_weight_copies + head;
  };
  const std::vector<int> in_flight = pipeline::peak_in_flight(*schedule);
  const int64_t block_numel = [&] {
    int64_t n = 0;
    for (const int64_t x : block_numels(d, layout.tp)) n += x;
    return n;
  }();
  const double table_bytes =
      static_cast<double>(padded_vocab(config.vocab, layout.tp) / layout.tp * d) * kF32;
  for (int r = 0; r < layout.pp; ++r) {
    const StateBytes state =
        zero_state_bytes(numels[static_cast<size_t>(r)], layout.shard_ranks(), stage);
    double largest_chunk = 0, weight_copies = 0;
    for (int c = 0; c < chunks; ++c) {
      if (schedule->rank_of(c) != r) continue;
      largest_chunk = std::max(largest_chunk, chunk_bytes(c));
      weight_copies = scoped ? weight_copies + chunk_weight_copies(c)
                             : std::max(weight_copies, chunk_weight_copies(c));
    }
    const double activations =
        (layout.pp > 1 ? in_flight[static_cast<size_t>(r)] : 1) * largest_chunk;
    // The receives the executor keeps posted ahead (ExecutorOptions::
    // receives_ahead, 2) and a message being sent.
    double transient = recomputed_block + weight_copies + attention_transient +
                       (layout.pp > 1 ? 3.0 * message : 0.0);
    if (cluster.packs_weights && scoped) {
      // Every weight matrix of the rank's chunks, packed in the matmul dtype
      // twice, as the forward's transposed operand and as the input
      // gradient's: the blocks' four, and the head's projection (the token
      // table).
      double matrices = 0;
      for (int c = 0; c < chunks; ++c) {
        if (schedule->rank_of(c) != r) continue;
        matrices += static_cast<double>(layers[static_cast<size_t>(c)]) * 12.0 *
                        static_cast<double>(d * d / layout.tp) +
                    (c == chunks - 1 ? table_bytes / kF32 : 0.0);
      }
      transient +=
          2.0 * matrices *
          static_cast<double>(dtype_size(
              config.module.precision.reduced() ? config.module.precision.matmul : DType::f32));
    }
    if (stage >= 2) {
      transient +=
          std::min(2.0 * work.bucket_cap_bytes, sum(numels[static_cast<size_t>(r)]) * kF32);
    }
    if (stage == 3) {
      // The unit gathered and the next one prefetched: two blocks, or the
      // token table's part with a block.
      transient += std::max(2.0 * static_cast<double>(block_numel) * kF32,
                            table_bytes + static_cast<double>(block_numel) * kF32);
    }
    const double total =
        state.parameters + state.gradients + state.optimizer + activations + transient;
    if (total > e.total_bytes) {
      e.parameter_bytes = state.parameters;
      e.gradient_bytes = state.gradients;
      e.optimizer_bytes = state.optimizer;
      e.activation_bytes = activations;
      e.transient_bytes = transient;
      e.total_bytes = total;
    }
  }

  // ---- time ----
  const models::GPTFlops flops = models::gpt_flops(config, micro_rows, seq);
  const double rate = cluster.peak_flops * cluster.efficiency;
  const double tp_bandwidth = cluster.intra_node_bandwidth;  // a tp group stays in a node
  const double n_tp = layout.tp;
  const double activation_bytes = static_cast<double>(micro_rows * seq * d) * kF32;
  const double all_reduce =
      layout.tp == 1 ? 0.0
                     : 2.0 * (n_tp - 1) / n_tp * activation_bytes / tp_bandwidth + cluster.latency;
  pipeline::ActionCosts costs;
  costs.forward.assign(static_cast<size_t>(chunks), 0.0);
  costs.backward_input = costs.backward_weight = costs.forward;
  std::vector<double> chunk_compute(static_cast<size_t>(chunks), 0.0);
  std::vector<double> chunk_tp(static_cast<size_t>(chunks), 0.0);
  for (int c = 0; c < chunks; ++c) {
    const double blocks = static_cast<double>(layers[static_cast<size_t>(c)]);
    const bool first = c == 0, last = c == chunks - 1;
    auto pass = [&](auto field) {
      return ((first ? flops.embeddings.*field : 0.0) + blocks * flops.block.*field +
              (last ? flops.head.*field : 0.0)) /
             n_tp / rate;
    };
    const double f = pass(&models::PassFlops::forward);
    const double b = pass(&models::PassFlops::backward_input);
    const double w = pass(&models::PassFlops::backward_weight);
    double tp_f = 0, tp_b = 0;
    if (layout.tp > 1) {
      // Forward: two sums per block, the embedding's, the loss's three small
      // ones. Backward: two per block (four with the recomputed forward), the
      // head's input gradient. Under SP each sum is an all-gather and a
      // reduce-scatter, the same bytes, and the column-parallel layers gather
      // their inputs again (two per block, the head's), beside the input
      // gradient's products: only what outlasts them counts.
      tp_f =
          (2.0 * blocks + (first ? 1.0 : 0.0)) * all_reduce + (last ? 3.0 * cluster.latency : 0.0);
      tp_b =
          (2.0 * blocks * (config.checkpoint_blocks ? 2.0 : 1.0) + (last ? 1.0 : 0.0)) * all_reduce;
      if (layout.sequence_parallel) {
        tp_b += std::max(0.0, 0.5 * (2.0 * blocks + (last ? 1.0 : 0.0)) * all_reduce - b);
      }
    }
    costs.forward[static_cast<size_t>(c)] = f + tp_f;
    costs.backward_input[static_cast<size_t>(c)] = b + tp_b;
    costs.backward_weight[static_cast<size_t>(c)] = w;
    chunk_compute[static_cast<size_t>(c)] = f + b + w;
    chunk_tp[static_cast<size_t>(c)] = tp_f + tp_b;
  }
  const bool pp_local = within_node(cluster, layout.tp * layout.dp, layout.pp);
  const double pp_bandwidth =
      pp_local ? cluster.intra_node_bandwidth : cluster.inter_node_bandwidth;
  if (layout.pp > 1) {
    costs.p2p_latency =
        cluster.latency + activation_bytes / (layout.sequence_parallel ? n_tp : 1.0) / pp_bandwidth;
  }
  const pipeline::Simulation sim = pipeline::simulate(*schedule, costs);
  e.pipeline_step = sim.makespan;
  e.bubble_fraction = layout.pp > 1 ? sim.bubble_fraction : 0.0;
  const double micro = layout.micro_batches;

  // The busiest rank: its compute and tp time, its parameters, its last backward.
  int busiest = 0;
  std::vector<double> rank_compute(static_cast<size_t>(layout.pp), 0.0);
  std::vector<double> rank_tp(static_cast<size_t>(layout.pp), 0.0);
  std::vector<double> rank_backward(static_cast<size_t>(layout.pp), 0.0);
  std::vector<double> rank_forward(static_cast<size_t>(layout.pp), 0.0);  // one micro-batch's
  std::vector<int64_t> rank_blocks(static_cast<size_t>(layout.pp), 0);
  for (int c = 0; c < chunks; ++c) {
    const auto r = static_cast<size_t>(schedule->rank_of(c));
    rank_compute[r] += micro * chunk_compute[static_cast<size_t>(c)];
    rank_tp[r] += micro * chunk_tp[static_cast<size_t>(c)];
    rank_backward[r] += costs.backward_input[static_cast<size_t>(c)] +
                        costs.backward_weight[static_cast<size_t>(c)];
    rank_forward[r] += costs.forward[static_cast<size_t>(c)];
    rank_blocks[r] += layers[static_cast<size_t>(c)];
  }
  for (int r = 1; r < layout.pp; ++r) {
    if (rank_compute[static_cast<size_t>(r)] + rank_tp[static_cast<size_t>(r)] >
        rank_compute[static_cast<size_t>(busiest)] + rank_tp[static_cast<size_t>(busiest)]) {
      busiest = r;
    }
  }
  e.compute = rank_compute[static_cast<size_t>(busiest)];
  e.tp_communication = rank_tp[static_cast<size_t>(busiest)];

  // Traffic and the data-parallel exposure, per pipeline rank; the worst counts.
  // Hybrid sharding: the shard group's collectives at its own bandwidth, the
  // replicas' (the ranks of the shard group's size apart) at dp's.
  const bool dp_local = within_node(cluster, layout.tp, layout.dp);
  const double dp_bandwidth =
      dp_local ? cluster.intra_node_bandwidth : cluster.inter_node_bandwidth;
  const double shard_bandwidth = within_node(cluster, layout.tp, layout.shard_ranks())
                                     ? cluster.intra_node_bandwidth
                                     : cluster.inter_node_bandwidth;
  double optimizer_elements = 0;
  for (int r = 0; r < layout.pp; ++r) {
    const double params = sum(numels[static_cast<size_t>(r)]) * kF32;
    const StepTraffic traffic =
        gpt_step_traffic({.parameter_bytes = params,
                          .dp = layout.dp,
                          .tp = layout.tp,
                          .zero_stage = stage,
                          .zero_shard = layout.zero_shard,
                          .batch = rows,
                          .seq = seq,
                          .d_model = d,
                          .blocks = rank_blocks[static_cast<size_t>(r)],
                          .first_stage = schedule->rank_of(0) == r,
                          .last_stage = schedule->rank_of(schedule->chunks() - 1) == r,
                          .micro_batches = layout.micro_batches,
                          .virtual_stages = layout.pp > 1 ? schedule->virtual_stages : 0,
                          .sequence_parallel = layout.sequence_parallel,
                          .recompute = config.checkpoint_blocks,
                          .bf16_gradients = work.bf16_gradients});
    e.dp_wire_bytes = std::max(e.dp_wire_bytes, traffic.dp);
    e.tp_wire_bytes = std::max(e.tp_wire_bytes, traffic.tp);
    e.pp_wire_bytes = std::max(e.pp_wire_bytes, traffic.pp);
    double exposed = 0;
    if (layout.dp > 1) {
      const double n_shard = stage > 0 ? layout.shard_ranks() : layout.dp;
      const double ring = (n_shard - 1) / n_shard;
      const double grad_wire =
          (stage <= 1 ? 2.0 : 1.0) * (work.bf16_gradients ? 0.5 : 1.0) * ring * params;
      const double grad_seconds =
          grad_wire / shard_bandwidth + traffic.dp_replicas / dp_bandwidth + cluster.latency;
      const double last_bucket =
          std::min(grad_seconds, (stage <= 1 ? 2.0 : 1.0) * ring * std::min(kLastBucket, params) /
                                     shard_bandwidth);
      exposed = std::max(grad_seconds - rank_backward[static_cast<size_t>(r)], last_bucket);
      const double gather_seconds =
          (traffic.dp - traffic.dp_replicas - grad_wire) / shard_bandwidth;
      const auto rank = static_cast<size_t>(r);
      if (stage == 3) {
        exposed += std::max(0.0, gather_seconds - rank_compute[rank]);
      } else if (layout.overlap_param_gather) {
        const double first_unit = gather_seconds / static_cast<double>(rank_blocks[rank] + 1);
        exposed += std::max(gather_seconds - rank_forward[rank], first_unit);
      } else {
        exposed += gather_seconds;
      }
    }
    e.dp_exposed = std::max(e.dp_exposed, exposed);
    optimizer_elements = std::max(
        optimizer_elements,
        zero_state_bytes(numels[static_cast<size_t>(r)], layout.shard_ranks(), stage).optimizer /
            2.0 / kF32);
  }
  e.optimizer = optimizer_elements * kAdamWBytesPerElement / cluster.memory_bandwidth;
  e.step = e.pipeline_step + e.dp_exposed + e.optimizer;

  models::GPTConfig counted = work.model;  // the model's work, no recompute
  counted.checkpoint_blocks = counted.checkpoint_attention = false;
  counted.attention = nn::AttentionKernel::materialized;
  const models::GPTFlops whole = models::gpt_flops(counted, work.batch, seq);
  e.model_flops = whole.embeddings.total() +
                  static_cast<double>(counted.layers) * whole.block.total() + whole.head.total();
  e.mfu = e.model_flops / (static_cast<double>(cluster.world()) * cluster.peak_flops * e.step);
  e.tokens_per_second = static_cast<double>(work.batch * seq) / e.step;

  if (e.total_bytes > cluster.memory_bytes) {
    return refuse(str_cat("needs ", gib(e.total_bytes), " per device, ", gib(cluster.memory_bytes),
                          " available"));
  }
  return e;
}

}  // namespace loom::parallel::planner
