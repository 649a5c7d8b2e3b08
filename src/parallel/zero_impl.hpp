// ZeroOptimizer's state (internal to parallel/). The façade and the
// construction are in zero_optimizer.cpp, the gradient buckets and the
// parameter all-gather of stages 1 and 2 in zero_grads.cpp, stage 3's
// gathering and prefetch in zero_gather.cpp. The buckets' ready counting and
// launch order are the shared engine's (grad_buckets.hpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "loom/parallel/grad_reducer.hpp"
#include "loom/parallel/zero.hpp"
#include "parallel/grad_buckets.hpp"
#include "parallel/zero_layout.hpp"

namespace loom::parallel {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct ZeroOptimizer::Impl final : ParameterGatherer {
  using Range = detail::Range;
  static Tensor flat_range(const Tensor& flat, Range range) {
    return flat.slice(range.begin, range.end);
  }

  struct Bucket {
    Tensor buffer;  // stage 1: a view of the full gradient; stages 2, 3: transient
    // Under ZeroOptions::compression (f32 gradients): the bucket rounded to
    // the wire dtype, and at stages 2, 3 this rank's reduced piece in it;
    // both live from launch to completion.
    Tensor wire, wire_piece;
    bool launched = false;
    bool completed = false;  // its collective over dp waited for (and unwired)
    comm::Work work;
    // Hybrid sharding: this rank's piece averaged over ZeroOptions::replicas
    // (through replica_wire, the piece in the wire dtype, under compression).
    Tensor replica_wire;
    comm::Work replica_work;
  };
  enum class UnitState { released, gathering, gathered };
  struct Unit {
    Tensor buffer;
    comm::Work work;
    UnitState state = UnitState::released;
    int uses = 0;
  };

  std::vector<nn::Parameter*> params;
  comm::Communicator& comm;
  ZeroOptions options;
  int stage = 0;
  Device device = Device::cpu();
  DType dtype = DType::f32;  // the parameters' (flat values, gradients, buckets, gathers)
  size_t element = 4;

  std::unique_ptr<GradReducer> reducer;  // stage 0
  std::optional<GradReducer::NoSync> reducer_no_sync;
  std::unique_ptr<optim::Optimizer> opt;

  detail::ZeroLayout layout;
  Range mine;
  Tensor flat_value;   // stages 1, 2: every parameter is a view of it
  Tensor shard_value;  // stage 3: this rank's shard only
  Tensor flat_grad;    // stage 1
  Tensor shard_grad;   // stages 2, 3
  // NOTE [fp32 master] bf16/f16 parameters at stages 1 to 3: the optimizer
  // steps an f32 copy of this rank's shard (master) with the reduced gradient
  // shard widened to f32 (master_grad, filled by finish()); step() rounds the
  // master into the low-precision shard, which is then all-gathered (stages 1,
  // 2) or kept at rest (stage 3). Both are undefined for f32 parameters.
  Tensor master;
  Tensor master_grad;
  std::unique_ptr<detail::GradBuckets> engine;    // stages 1 to 3
  std::vector<const nn::Parameter*> slot_params;  // the parameter of each optimizer slot
  std::vector<Bucket> buckets;
  std::vector<size_t> bucket_of;

  // Stages 1, 2: the parameter all-gather step() starts, one per bucket under
  // ZeroOptions::overlap_param_gather (NOTE [gather at forward] in
  // zero_grads.cpp), else one of the whole buffer (entry 0).
  std::vector<comm::Work> param_gathers;
  std::vector<bool> gather_pending;
  // Under overlap_param_gather: the buckets holding each module's own
  // parameters, those holding parameters no module holds, and the modules'
  // buckets in the order the first forward used them (the gathers' launch order).
  std::unordered_map<const ShardedModule*, std::vector<size_t>> gather_buckets;
  std::vector<size_t> unowned_buckets;
  std::vector<size_t> first_use_buckets;

  // Stage 3.
  std::vector<Unit> units;                                        // layout order
  std::unordered_map<const ShardedModule*, long> unit_of_module;  // -1: no own parameters
  std::vector<size_t> order[2];  // units by first use per phase, recorded in the first step
  bool recording = true;
  // NOTE [prefetch budget] (stage 3): the elements of the two largest units.
  // A unit is prefetched only if the gathered units then stay within it, so
  // the parameter peak stays below the shard plus the two largest units even
  // when an outer unit stays gathered around the inner ones (GPT's, which
  // holds the embedding tied to the output head): there the next block is
  // gathered when its turn comes instead.
  int64_t prefetch_budget = 0;

  ZeroWaitStats waits;
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  int64_t peak = 0, peak_params = 0, peak_grads = 0;

  Impl(std::vector<nn::Parameter*> list, comm::Communicator& dp, const OptimizerOptions& optimizer,
       const ZeroOptions& zero);

  bool syncing() const { return reducer ? reducer->syncing() : engine->syncing(); }
  void set_syncing(bool syncing);

  // This rank's shard of the parameter values / reduced gradients, in the parameters' dtype.
  Tensor low_value_shard() const { return stage == 3 ? shard_value : flat_range(flat_value, mine); }
  Tensor low_grad_shard() const { return stage == 1 ? flat_range(flat_grad, mine) : shard_grad; }

  ~Impl() override;

  // Each parameter goes to the innermost module that contains it (the one
  // with fewest parameters); parameters outside every module get
  // options.modules.size() where `everywhere` is false, else it throws.
  std::vector<size_t> assign_units(bool everywhere);

  long unit_of(const ShardedModule& module) const;

  const ShardedModule* owner_of_unit(size_t unit) const;

  // The part of `range` this rank owns, as positions in its shard (empty: 0..0).
  Range local_piece(Range range) const {
    const Range piece = detail::intersect(range, mine);
    if (piece.size() == 0) return {0, 0};
    return {piece.begin - mine.begin, piece.end - mine.begin};
  }

  void track(int64_t param_delta, int64_t grad_delta) {
    param_bytes += param_delta;
    grad_bytes += grad_delta;
    peak_params = std::max(peak_params, param_bytes);
    peak_grads = std::max(peak_grads, grad_bytes);
    peak = std::max(peak, param_bytes + grad_bytes + optimizer_bytes);
  }

  // ---- gradients (stages 1 to 3) ----------------------------------------------------------

  // ZeroOptions::compression rounds f32 gradients to the wire dtype for their
  // collectives; gradients in bf16/f16 travel as they are.
  bool compressing() const {
    return options.compression != GradCompression::none && dtype == DType::f32;
  }
  DType wire_dtype() const {
    return options.compression == GradCompression::f16 ? DType::f16 : DType::bf16;
  }

  // Stages 2, 3: where parameter i's next gradient goes (its bucket, allocated on first use).
  Tensor grad_view(size_t i);

  void launch(size_t index);
  // After bucket `index`'s collective completed: the compressed result widened
  // into the gradient (stage 1) or the shard (stages 2, 3), the wire freed.
  void unwire(size_t index);

  // Waits for a launched bucket's collective over dp and unwires it; at
  // stages 2, 3 frees its full-size buffer; under hybrid sharding starts the
  // average of this rank's piece over the replicas. Buckets complete in index
  // order, so the replicas' collectives are issued in one order everywhere.
  void complete_bucket(size_t index);
  // This rank's piece of bucket `index`'s reduced gradient (in the flat
  // gradient at stage 1, in the shard at stages 2, 3; possibly empty).
  Tensor own_grad_piece(size_t index);
  void start_replica_average(size_t index);
  void finish_replica_average(size_t index);

  void finish();

  // ---- parameters ---------------------------------------------------------------------------

  bool overlapping_gather() const {
    return options.overlap_param_gather && (stage == 1 || stage == 2);
  }
  // Under overlap_param_gather: which buckets each module waits for.
  void plan_gather_buckets();
  void step();
  void start_param_gather(size_t bucket);
  void wait_param_gather(size_t index);
  // Every pending gather, or (zero_grad()) only those no module waits for.
  void wait_parameters();
  void wait_unowned_parameters();

  // ---- stage 3: ParameterGatherer --------------------------------------------------------------

  // Elements of the units gathered or being gathered now.
  int64_t gathered_elements() const;

  void start_gather(size_t u);

  void complete_gather(size_t u);

  void release_unit(size_t u);

  void before_use(ShardedModule& module, Phase phase) override;

  void after_use(ShardedModule& module, Phase) override;
};

}  // namespace loom::parallel
