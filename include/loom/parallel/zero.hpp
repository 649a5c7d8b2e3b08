// ZeroOptimizer: sharded data parallelism (ZeRO stages 0 to 3) wrapping the
// model's parameters and an optimizer. See docs/zero.md.
//
//   parallel::ZeroOptimizer zero(model.parameters(), *dp, optim::AdamWOptions{...},
//                                {.stage = 2});
//   for (step ...) {
//     zero.zero_grad();                 // also waits for the last step's parameter all-gather
//     loss.backward(...); model.backward(...);   // buckets launch as gradients get ready
//     zero.finish();                    // launch the rest, wait
//     zero.clip_grad_norm(1.0);         // optional: the true global norm
//     zero.set_lr(schedule.lr_at(step));  // optional: a learning-rate schedule
//     zero.step();                      // this rank's shard, then (stages 1, 2) all-gather
//   }
//
// Stages (N ranks in the data-parallel group):
//   0  plain data parallelism: GradReducer (all-reduce) + the full optimizer.
//   1  optimizer state sharded: the parameters become views into one flat
//      padded buffer; gradients are all-reduced bucket by bucket; each rank
//      steps its shard [rank * S, (rank + 1) * S) of the buffer and the shards
//      are all-gathered back (asynchronously, waited in zero_grad(); with
//      ZeroOptions::overlap_param_gather bucket by bucket, each waited at the
//      forward of the first ShardedModule that uses it).
//   2  stage 1 + gradients sharded: each bucket is reduce-scattered as soon as
//      its gradients are ready (in bucket order on every rank); the full-size
//      bucket buffers are transient (allocated at the bucket's first gradient
//      write, freed once their reduce-scatter has completed; at most two in flight).
//   3  stage 2 + parameters sharded: at rest each rank holds only its shard;
//      every ShardedModule's parameters are gathered around its forward and
//      its backward (the next module's prefetched) and freed after use.
//
// Guarantees:
//  - Construction validates everything before communicating: the stage, the
//    options, the parameter list (no nulls or duplicates, one device; at
//    stages 1 to 3 one dtype: f32, bf16 or f16), and at stage 3 that every
//    parameter lies inside one of options.modules. Then every rank checks that
//    all ranks have the same parameters (names, shapes) and the same shard
//    layout (a hash, then the first differing line on every rank), and rank
//    0's values are broadcast.
//  - A data-parallel group of one rank with stage > 0 runs stage 0 (logged):
//    there is nothing to shard.
//  - Every rank must call finish() after each synchronized backward, and
//    no_sync() works as GradReducer's (gradients accumulate in the buckets,
//    which then stay allocated until the synchronized backward's finish()).
//  - Stages 1 to 3 count ready gradients with the bucket engine GradReducer
//    uses (stage 0 is a GradReducer): the same per-micro-batch counting,
//    set_last_micro_batch(), no_sync(), group sums (ZeroOptions.groups; the
//    buckets holding such parameters launch in finish()) and unused-parameter
//    policy (ZeroOptions.unused, the same as ReducerOptions.unused).
//  - Stage 2 and 3: after finish() the model's Parameter::grad() no longer
//    holds the gradient (it was reduce-scattered); use grad_shards().
//  - memory(): bytes this object keeps per rank for parameters, gradients
//    and optimizer state now, and the peak of their sum since construction.
//  - Hybrid sharding (ZeroOptions::replicas, stages 1 to 3; PyTorch FSDP's
//    HYBRID_SHARD, DeepSpeed's MiCS): `dp` is then the group that shares one
//    copy of the sharded state (a node, say) and `replicas` the ranks of the
//    other such groups that hold the same shard. Buckets are reduced over
//    `dp` as without it, then this rank's piece of each bucket is averaged
//    over `replicas` (compressed as ZeroOptions::compression says); the step,
//    the all-gathers and stage 3's gathering stay inside `dp`. Memory per
//    rank is that of ZeRO over dp.size() ranks; across the replicas only the
//    shard's gradient travels. At stage 1, Parameter::grad() outside this
//    rank's shard is then averaged over `dp` only. hybrid_shard_groups()
//    builds both groups from a data-parallel group.
//  - bf16/f16 parameters (stages 1 to 3): the flat buffers, gradient buckets
//    and collectives stay in the parameters' dtype; each rank also keeps an
//    f32 master copy of its shard, which the optimizer steps (with the reduced
//    gradient shard widened to f32 by finish()) and which step() rounds
//    (nearest even) into the low-precision shard. optimizer() then steps the
//    master pieces, grad_shards() are the widened f32 gradients, and
//    memory().optimizer_bytes counts the master (4 bytes x shard) with the
//    moments. Stage 0 keeps no master: the optimizer updates the bf16 values.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/nn/parameter.hpp"
#include "loom/optim/adamw.hpp"
#include "loom/optim/optimizer.hpp"
#include "loom/optim/param_slot.hpp"
#include "loom/optim/sgd.hpp"
#include "loom/parallel/grad_reducer.hpp"
#include "loom/parallel/reduction.hpp"
#include "loom/parallel/sharded_module.hpp"

namespace loom::parallel {

struct ZeroOptions {
  int stage = 1;  // 0 .. 3
  size_t first_bucket_bytes = size_t{1} << 20;
  // 4 MiB, not DDP's 25 MiB: with the 25 MiB default, stage 2's reduce-scatters
  // (Open MPI reduces to one rank, then scatters) ended 3-4% later than stage 0's
  // all-reduces on the benchmark models; 4 MiB buckets overlap them with backward
  // (stages 1-3 within 0.5-2% of stage 0, docs/benchmarks.md "ZeRO") and cut the
  // stage-2 peak. Stage 0 inside ZeroOptimizer uses the same caps.
  size_t bucket_cap_bytes = size_t{4} << 20;
  optim::DecayPolicy decay = optim::DecayPolicy::all;
  // Stage 3: the wrappers that gather parameters (every parameter inside one).
  std::vector<ShardedModule*> modules = {};
  bool broadcast_parameters = true;
  UnusedParameters unused = UnusedParameters::error;
  // Groups beyond dp that some gradients are summed over, and that the
  // gradient norm sums over (parallel/reduction.hpp).
  ReductionGroups groups = {};
  // The dtype f32 gradients travel in over dp (GradReducer's compression:
  // half the bytes, at most about 2 * 2^-8 relative error per element in
  // bf16), at every stage: each bucket is rounded into a transient wire
  // buffer for its all-reduce (stage 1) or reduce-scatter (stages 2, 3) and
  // the result widened back into the gradient or the shard; memory() counts
  // the wire buffers with the gradients. Gradients already in bf16/f16
  // travel as they are.
  GradCompression compression = GradCompression::none;
  // Hybrid sharding (stages 1 to 3): the ranks that hold the same shard as
  // this one in the other shard groups (see the Guarantees above); null: the
  // state is sharded over the whole of `dp`. Every rank of it has the same
  // rank in its own `dp`, and every `dp` group has the same size.
  comm::Communicator* replicas = nullptr;
  // Stages 1 and 2: all-gather the stepped parameters bucket by bucket and
  // let each of `modules` wait, at its forward, only for the buckets that
  // hold its own parameters (Megatron-LM's overlap_param_gather), so that the
  // gathers of later layers run while earlier ones compute; zero_grad() then
  // waits only for parameters no module holds. Needs `modules` (e.g. the GPT
  // wrapped as for stage 3; parameters outside every module are allowed).
  // Without it, step() starts one all-gather of the whole buffer and
  // zero_grad() waits for it. Stage 3 always gathers per module; stage 0 has
  // nothing to gather. See NOTE [gather at forward] in zero_grads.cpp.
  bool overlap_param_gather = false;
};

// A data-parallel group split for hybrid sharding: `shard`, groups of
// shard_size consecutive data-parallel ranks (which share one copy of the
// ZeRO state: pass it as ZeroOptimizer's dp), and `replicas`, the ranks with
// the same place in every shard group (ZeroOptions::replicas). Consecutive
// ranks, because launchers place consecutive world ranks on a node and
// ParallelLayout puts only tp inside dp: a group of a node's dp ranks keeps
// the all-gathers inside the node.
// Collective over `dp` (two splits). Throws, before communicating, unless
// 2 <= shard_size < dp.size() and shard_size divides dp.size().
struct ZeroGroups {
  std::shared_ptr<comm::Communicator> shard;
  std::shared_ptr<comm::Communicator> replicas;
};
ZeroGroups hybrid_shard_groups(comm::Communicator& dp, int shard_size);

using OptimizerOptions = std::variant<optim::SgdOptions, optim::AdamWOptions>;

// Elements [begin, end) of a parameter (row-major, in the parameter's own
// shape; its nn::Placement says where that sits in the global tensor) that a
// rank owns in ZeRO's flat layout: the optimizer state and, at stages 2 and
// 3, the reduced gradient and the value at rest of exactly these elements
// live on that rank.
struct ShardPiece {
  nn::Parameter* param = nullptr;
  int64_t begin = 0;
  int64_t end = 0;
};

struct MemoryStats {
  size_t param_bytes = 0;      // parameter storage this rank holds now
  size_t grad_bytes = 0;       // gradient storage this rank holds now
  size_t optimizer_bytes = 0;  // optimizer state, with the f32 master shard (bf16/f16 params)
  size_t peak_bytes = 0;       // the largest sum of the three so far
  size_t peak_param_bytes =
      0;  // the largest parameter bytes so far (stage 3: shard + gathered units)
  size_t peak_grad_bytes =
      0;  // the largest gradient bytes so far (stage 2, 3: shard + live buckets)
  size_t total() const { return param_bytes + grad_bytes + optimizer_bytes; }
  std::string summary() const;
};

// Time the training loop spent blocked on ZeroOptimizer's communication,
// summed since construction (this rank's): what the overlap did not hide.
struct ZeroWaitStats {
  int64_t steps = 0;            // finish() calls
  double reduction_wait_s = 0;  // in finish(): the last buckets launched and every reduction
                                // waited for, i.e. exposed after backward
  // Waiting for parameter all-gathers: stages 1, 2 the step's (in zero_grad(),
  // or at the modules' forward under overlap_param_gather), stage 3 each unit's.
  double gather_wait_s = 0;
};

class ZeroOptimizer {
 public:
  ZeroOptimizer(std::vector<nn::Parameter*> params, comm::Communicator& dp,
                const OptimizerOptions& optimizer, const ZeroOptions& options = {});
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // Waits for the previous step's parameter all-gather (under
  // ZeroOptions::overlap_param_gather only for the parameters no module
  // holds: the modules wait for theirs at their forward), then marks every
  // gradient stale. Call before the forward pass.
  void zero_grad();
  // Launches the buckets not yet launched, waits for all of them.
  void finish();
  // After finish(): the true global L2 norm of the gradients (parallel/
  // grad_clip.hpp: squares of this rank's shard, summed over dp and over
  // ZeroOptions.groups.model, replicas counted once); scales them when it
  // exceeds max_norm (infinity: never). Returns the norm before clipping.
  // grad_scale: the gradients are grad_scale x the true ones (loss scaling):
  // the true norm is returned and the gradients are unscaled in the same pass.
  double clip_grad_norm(double max_norm, double grad_scale = 1.0);
  // Steps this rank's shard (every slot at stage 0) and starts the all-gather (stages 1, 2).
  void step();
  // The learning rate of the next step(): optimizer().set_lr() and lr(), the
  // optimizer that steps this rank's shard (or the f32 master pieces).
  void set_lr(double lr) { optimizer().set_lr(lr); }
  double lr() { return optimizer().lr(); }
  // Waits for every all-gather step() started. Call it before reading
  // parameters outside the modules' forward under overlap_param_gather.
  void wait_parameters();
  // Stage 3: gathers every parameter (for evaluation outside the wrappers or a
  // full checkpoint) until release_parameters(); other stages: waits only.
  void gather_parameters();
  void release_parameters();

  class NoSync {
   public:
    explicit NoSync(ZeroOptimizer& zero);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    ZeroOptimizer& zero_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  // The backward of `tape` is the step's last micro-batch (GradReducer's
  // set_last_micro_batch); cleared by finish().
  void set_last_micro_batch(const nn::Tape& tape);

  // The stage in effect (0 when the group has one rank).
  int stage() const;
  // The parameters it manages, in the order given, and its group's size.
  const std::vector<nn::Parameter*>& parameters() const;
  int data_parallel_size() const;
  // Hybrid sharding: the shard's copies (replicas->size(), 1 without) and this
  // rank's place among them (0 without; checkpoints are written by replica 0).
  int replica_count() const;
  int replica_rank() const;
  int requested_stage() const { return options_.stage; }
  optim::Optimizer& optimizer();
  // Stage 0's data-parallel reducer (its overlap stats()); null at stages 1 to 3.
  const GradReducer* reducer() const;
  // After finish(): this rank's gradient pieces, one per optimizer slot
  // (f32, widened, when the optimizer steps an fp32 master).
  std::vector<Tensor> grad_shards() const;
  MemoryStats memory() const;
  ZeroWaitStats wait_stats() const;
  // Elements per rank of the flat buffers (0 at stage 0).
  int64_t shard_numel() const;
  // What data-parallel rank `rank` owns, in layout order (stage 0: every
  // parameter whole). The same on every rank: the layout is agreed.
  std::vector<ShardPiece> shard_pieces(int rank) const;
  // This rank's pieces of the parameter values as the model stores them (the
  // parameters' dtype), one per optimizer slot, as shard_pieces(own rank):
  // views of the parameters at stages 0 to 2 (complete after
  // wait_parameters()), of the shard at rest at stage 3. For f32 parameters
  // they are the slots' values; for bf16/f16 ones at stages 1 to 3 the slots
  // step the f32 masters and these are their rounding (what a checkpoint
  // restores besides the masters).
  std::vector<Tensor> value_shards() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  ZeroOptions options_;
};

}  // namespace loom::parallel
