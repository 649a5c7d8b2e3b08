// PipelineExecutor: runs one rank's pipeline schedule (pipeline/schedule.hpp)
// over the pipeline-parallel group, one training step per call
// (docs/pipeline.md, "The executor").
//
//   pl::Schedule s = pl::make_schedule(pl::ScheduleKind::one_f_one_b, {.pp = 4, .micro_batches =
//   8}); pl::GPTChunks chunks = pl::build_gpt_chunks(config, s, groups.coord.pp);
//   parallel::ZeroOptimizer zero(chunks.parameters(), *groups.dp, optim::SgdOptions{...},
//                                {.stage = 1, .groups = parallel::reduction_groups(groups)});
//   pl::PipelineExecutor executor(s, *groups.pp, chunks.modules(), zero);
//   pl::StepStats stats = executor.step(input_of_micro_batch, loss_of_logits);
//
// What one step() does, on every rank of the pp group:
//  - zero_grad() on the ZeroOptimizer, then the rank's actions in list order:
//    F calls the chunk's forward (chunk 0 takes input(m), the micro-batch's
//    token ids; the last chunk's logits go to loss(logits, m) at once), B its
//    backward_input, W its backward_weight, BW its backward; reduce gradients
//    is ZeroOptimizer::finish() (then clip_grad_norm when asked, or the
//    norm unscaled under a loss scaler), optimizer step is
//    ZeroOptimizer::step() (skipped when the norm is not finite).
//  - Each (micro-batch, chunk) gets its own nn::Tape, created at its F and
//    destroyed after its W (or BW); the tapes of one micro-batch share its id,
//    and the micro-batch whose weight gradients come last on this rank is
//    named to the bucket engine (set_last_micro_batch), so buckets launch
//    while that micro-batch's backward still runs (NOTE [final micro-batch]
//    in src/parallel/grad_buckets.hpp); the others only accumulate.
//  - The loss: the callback returns micro-batch m's mean loss and the
//    gradient of that loss with respect to the logits; the executor scales
//    the gradient by 1 / micro_batches, so the step's gradient is that of the
//    mean over micro-batches, as one rank running the same micro-batches
//    with each loss scaled by 1 / M (times the loss scale, fp16:
//    ExecutorOptions::loss_scaler). StepStats::loss is the mean of the
//    returned losses on the rank holding the last chunk, and on every rank
//    when ExecutorOptions::broadcast_loss (one 8-byte broadcast over pp).
//    It is this data-parallel replica's mean: average it over dp yourself
//    (parallel::mean_over) for the global batch's.
//
// NOTE [ZeRO 3 under the pipeline] At ZeRO stage 3 every chunk module is a
// ShardedModule attached to the ZeroOptimizer (checked at construction; for a
// GPT: GPTChunks::shard_parameters(), then modules()), and the parameters are
// gathered per action, as ZeRO 3 without a pipeline gathers them per
// micro-batch: F gathers around the chunk's forward, B around its
// backward_input (kept until the same micro-batch's W only for a module whose
// backward_weight reads parameter values, which none of Loom's layers does:
// nn::Module::backward_weight_reads_parameters), BW around its backward; inside
// a chunk each block is a unit of its own, gathered around its own part of the
// action (the next one prefetched), the chunk's own parameters (embeddings,
// final LayerNorm, the head's table) for the whole action. Every unit counts
// its users, so micro-batches in flight (several B before their W, two chunks
// on a rank) never release what another still uses, and finish() finds every
// unit released. So a rank holds its 1/dp shard at rest and, in a step, the
// units that an action is running or whose B waits for its W; it all-gathers
// each chunk's parameters 2 M times per step (stage 2: once). A parameter that
// two chunks of a rank use (ZB-V's token table, tied on rank 0) is in one unit,
// which the other chunk's wrapper also gathers (ShardedModule::gather_with).
//
// Messages (NOTE [pipeline messages] in src/parallel/pipeline/stage_messages.hpp):
//  - Each message has its own tag, from its kind, micro-batch and chunk, so
//    activations and gradients between the same two ranks (pp = 2, or two
//    chunks per rank) can never be taken for one another.
//  - The first message of each (kind, chunk) is preceded by its shape and
//    dtype; later ones, in this and every later step, use the cached shape,
//    and a sender whose tensor differs from the shape it announced throws
//    naming both.
//  - Receives are posted ahead: the next ExecutorOptions::receives_ahead
//    receives of the list are always posted, before the computations that
//    precede them. Sends are posted and not waited for until the end of the
//    step (completed ones are dropped as the step goes), so they overlap the
//    compute that follows.
//  - Devices: received activations and gradients are allocated on the device
//    of the rank's chunks (their parameters'), so a rank on a GPU computes on
//    device tensors; the mpi backend stages device memory through host
//    buffers (docs/comm.md), and neighbouring ranks may sit on different
//    devices.
//
// Checked at construction, before any communication (loom::Error naming the
// value and the rule): the pp group's size and the schedule's pp; one module
// per virtual stage, none null; validate_schedule() (its message, prefixed);
// exactly one reduce gradients and one optimizer step on this rank, and one
// micro-batch whose weight gradient is the last on every chunk of the rank;
// message tags that fit the communicator's range (2 × chunks × (M + 1) <
// 32768); at ZeRO stage 3, chunks that are attached ShardedModules; every
// parameter of the rank's chunks on one device.
//
// Not thread-safe; one executor per rank. The modules, the communicator and
// the ZeroOptimizer must outlive it. A step that throws (a peer failed, a
// callback threw) leaves messages half exchanged: later steps throw saying so.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/tensor.hpp"
#include "loom/kernels/gemm.hpp"
#include "loom/nn/module.hpp"
#include "loom/optim/loss_scaler.hpp"
#include "loom/parallel/pipeline/schedule.hpp"
#include "loom/parallel/pipeline/simulate.hpp"
#include "loom/parallel/uneven_inputs.hpp"
#include "loom/parallel/zero.hpp"

namespace loom::parallel::pipeline {

// Micro-batch m's input to chunk 0 (GPT: token ids [b, T]). Called on the
// rank holding chunk 0, at micro-batch m's forward there.
using InputProvider = std::function<Tensor(int micro_batch)>;

struct LossOutput {
  double loss = 0;  // the micro-batch's loss (a mean over its rows)
  Tensor dlogits;   // dloss x d loss / d logits, the logits' shape and dtype
};
// Called on the rank holding the last chunk, right after micro-batch m's
// forward there, with that chunk's output. `dloss` is the factor the step's
// gradient needs on this micro-batch's loss: 1/M for the mean over the M
// micro-batches, times fp16's loss scale. Apply it inside the loss's backward
// (`CrossEntropyLoss::backward(tape, dloss)`), where the gradient is still
// f32: scaling bf16 or f16 logits' gradients afterwards rounds them twice.
// The logits are handed over (the executor keeps no handle on them): a loss
// function that drops its own after the loss's forward lets the backward
// write dlogits over them (NOTE [loss gradient in place] in
// src/nn/cross_entropy_loss.cpp).
using LossFunction = std::function<LossOutput(Tensor logits, int micro_batch, float dloss)>;

// Where micro-batch m's tapes draw their random numbers (dropout): the
// step's seed, and the micro-batch's first row in the step's global batch
// (nn::Tape::first_row, NOTE [dropout by global position] in nn/dropout.hpp),
// so that the masks are those of a single-rank run on the whole batch.
// Without a provider every tape's seed and first row are 0.
struct MicroBatchRandom {
  uint64_t seed = 0;
  int64_t first_row = 0;
};
using SeedProvider = std::function<MicroBatchRandom(int micro_batch)>;

struct ExecutorOptions {
  // Receives kept posted ahead of the one being waited for (at least 1).
  int receives_ahead = 2;
  // > 0: ZeroOptimizer::clip_grad_norm(max) between reduce and step.
  double clip_grad_norm = 0;
  // The last stage's loss broadcast over pp, so every rank's stats carry it.
  bool broadcast_loss = true;
  // fp16: dynamic loss scaling (optim/loss_scaler.hpp). Each rank passes its
  // own scaler, built with the same options on every rank. The loss gradient
  // is multiplied by scale() / M; reduce gradients takes the true global norm
  // (unscaling, and clipping when clip_grad_norm > 0); the optimizer step runs
  // only when update(norm) allows it, so an overflow on any rank skips the
  // same step and lowers the same scale everywhere. Must outlive the executor.
  optim::LossScaler* loss_scaler = nullptr;
  // Data-parallel replicas whose data runs out at different steps
  // (parallel/uneven_inputs.hpp), over the dp group: every rank of a replica
  // calls uneven->next(has_batch) with the same flag before each step(); the
  // loss gradient is then also multiplied by loss_weight(), and a replica
  // without a batch runs the step on stand-in inputs with every tape's
  // stand_in set (StepStats::stand_in). Its StepStats::loss is the stand-in's:
  // average with uneven->mean(). Must outlive the executor.
  UnevenInputs* uneven = nullptr;
  // Each weight's packed form (host f32 GEMMs) kept from its first micro-batch
  // to the step's reduce gradients, at most this many bytes per rank (NOTE
  // [packed weight reuse] in loom/kernels/gemm.hpp); 0: pack per micro-batch.
  // Not at ZeRO stage 3, whose gathered weights come and go within a step.
  int64_t packed_weight_bytes = int64_t{256} << 20;
  // On a CUDA device: wait for each compute action's kernels before reading
  // the clock, so StepStats' compute and receive-wait times are the device's
  // (what the simulator and pipeline_bench take). Off, the host runs ahead
  // of the device and those times measure kernel launches. No effect on the
  // host.
  bool synchronize_device_actions = true;
};

// One chunk's compute time in a step, summed over its micro-batches.
struct ChunkSeconds {
  double forward = 0;
  double backward_input = 0;
  double backward_weight = 0;
  double backward = 0;  // fused BW
};

struct StepStats {
  // The mean over micro-batches of this replica (NaN on a rank without the
  // last chunk when broadcast_loss is false).
  double loss = 0;
  // Before clipping, when ExecutorOptions::clip_grad_norm > 0 or a loss
  // scaler is given (then the true, unscaled norm).
  double grad_norm = 0;
  // False when the global norm was not finite (an overflow) and the optimizer
  // step was skipped, on every rank alike (the norm is global).
  bool stepped = true;
  double loss_scale = 1;  // the loss scale this step ran with (1 without a scaler)
  bool stand_in = false;  // this replica ran stand-in inputs (ExecutorOptions::uneven)
  double step_seconds = 0;
  // Time blocked waiting for receives (shape headers included): what the
  // rank idles on the pipeline, for the measured bubble.
  double recv_wait_seconds = 0;
  double send_wait_seconds = 0;  // waiting for sends still in flight at the step's end
  // Compute time per action kind, summed over the step (BW counts as backward).
  double forward_seconds = 0;
  double backward_input_seconds = 0;
  double backward_weight_seconds = 0;
  double backward_seconds = 0;
  // The four above together: the step's compute before its reduction.
  double compute_seconds() const {
    return forward_seconds + backward_input_seconds + backward_weight_seconds + backward_seconds;
  }
  double reduce_seconds = 0;  // finish() (and clipping)
  double optimizer_seconds = 0;
  int64_t messages_sent = 0;  // payloads, shape headers not counted
  int64_t bytes_sent = 0;
  int64_t messages_received = 0;
  // The most (micro-batch, chunk) tapes alive at once on this rank.
  int peak_tapes = 0;
  // The compute times above per chunk of this rank (index: virtual stage).
  std::vector<ChunkSeconds> chunk_seconds;
  // Weights packed once and reused over the micro-batches (packed_weight_bytes).
  kernels::PackedWeightScope::Stats packed_weights;
};

class PipelineExecutor {
 public:
  // `chunks[j]` runs the chunk at this rank's virtual stage j (placement).
  // `pp`: the pipeline group, rank r running schedule.ranks[r].
  PipelineExecutor(Schedule schedule, comm::Communicator& pp, std::vector<nn::Module*> chunks,
                   ZeroOptimizer& zero, ExecutorOptions options = {});
  ~PipelineExecutor();
  PipelineExecutor(const PipelineExecutor&) = delete;
  PipelineExecutor& operator=(const PipelineExecutor&) = delete;

  // One training step (see the file comment). `input` is called only on the
  // rank holding chunk 0, `loss` only on the rank holding the last chunk.
  StepStats step(const InputProvider& input, const LossFunction& loss,
                 const SeedProvider& seed = {});

  const Schedule& schedule() const;
  // Runs `schedule` from the next step on: the same pp, micro-batches, chunks
  // and placement in another order (a ZB-V re-planned from measured
  // durations, ZbVPlan). Checked as the constructor checks; every rank of the
  // pp group must switch before the same step (shapes are exchanged anew).
  void replace_schedule(Schedule schedule);
  int rank() const;  // in the pp group
  bool holds_first_chunk() const;
  bool holds_last_chunk() const;
  // The micro-batch whose weight gradients come last on this rank.
  int final_micro_batch() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every chunk's F, B and W duration per micro-batch in the step `stats`
// describes (this rank's StepStats::chunk_seconds, all-gathered over `pp`):
// the durations simulate() and ZbVPlan take. A fused BW counts as B (W 0).
// Collective: every rank of `pp` calls it with its own stats of the same step.
// Ranks of other pipelines that must plan the same order (data- and
// tensor-parallel replicas: ZeRO 3's gathers and tp's collectives run inside
// the actions) pass `replicas`, a group holding all of them (the world): the
// durations are then averaged over it, the same bits on every rank, and the
// call is collective over it too.
ActionCosts measured_costs(const Schedule& schedule, comm::Communicator& pp, const StepStats& stats,
                           comm::Communicator* replicas = nullptr);

// Rows [m * n, (m + 1) * n) of `batch` for each micro-batch m, n = rows / M
// (views, no copy). Throws naming both numbers when M does not divide the
// batch's rows, or when M < 1.
std::vector<Tensor> split_micro_batches(const Tensor& batch, int micro_batches);

}  // namespace loom::parallel::pipeline
