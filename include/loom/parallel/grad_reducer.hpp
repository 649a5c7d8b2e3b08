// GradReducer: data-parallel gradient averaging with bucketing and overlap
// (the policy half of DDP; the Communicator only moves bytes). See
// docs/data_parallel.md.
//
//   parallel::GradReducer reducer(model.parameters(), *dp, {});
//   for (step ...) {
//     optimizer.zero_grad();
//     loss.backward(...); model.backward(...);   // buckets launch as gradients become ready
//     reducer.finish();                          // launch the rest, wait, cast back
//     optimizer.step();
//   }
//
// Guarantees:
//  - Construction validates the options (before any communication), checks
//    that every rank has the same parameter list (names, shapes, dtypes; on a
//    difference every rank throws naming the first differing parameter and
//    both versions) and broadcasts rank 0's parameter values.
//  - Gradients live in flat buckets, one dtype and device each, filled in
//    reverse registration order (the order backward produces them); the first
//    bucket holds at most first_bucket_bytes, later ones bucket_cap_bytes (a
//    parameter larger than the cap gets a bucket of its own), the
//    parameters that come last get a bucket of their own of at most
//    last_bucket_bytes, and a model smaller than min_buckets caps gets
//    smaller later buckets (NOTE [bucket sizes] in grad_reducer.cpp). Each
//    Parameter's gradient becomes a view into its bucket: no copies.
//  - A bucket's all_reduce (average) starts once all its gradients are ready,
//    and buckets start strictly in index order on every rank, so the
//    collective sequence is the same everywhere.
//  - After the first synchronized step the buckets are rebuilt once, in the
//    order gradients actually became ready on rank 0 (broadcast, so every
//    rank gets the same buckets).
//  - Buckets are counted and launched by the gradient-bucket engine that
//    ZeroOptimizer shares (src/parallel/grad_buckets.hpp): ready signals are
//    counted per micro-batch, and set_last_micro_batch(tape) names the step's
//    last one when several are in flight (a pipeline schedule): signals of the
//    others only accumulate.
//  - Parameters whose nn::Placement asks for a sum over the tensor-parallel or
//    the embedding group (ReducerOptions.groups) get buckets of their own,
//    last; finish() sums them over their group, then averages them over dp.
//  - no_sync(): ready signals start nothing; gradients keep accumulating in
//    the buckets; the next synchronized backward + finish() reduces the sum.
//    Convention: the reducer averages over ranks only. Scale each
//    micro-batch's loss by 1 / micro_steps exactly as on one rank; then R
//    ranks x M micro-steps equal one rank over the R * M micro-batches.
//  - Unused parameters (no gradient written by finish()): `error` throws on
//    every rank naming the first such parameter and the rank (one 8-byte
//    all_reduce per step lets all ranks agree, so a parameter unused on one
//    rank only is an error everywhere instead of a hang); `zero_fill` gives
//    them a zero gradient before averaging (unused on one rank only: that
//    rank contributes zeros, so the result is the sum of the others / size).
//  - Compression bf16 / f16 (f32 buckets only): the bucket is rounded into a
//    half-precision buffer, averaged (the backends reduce half types in f32
//    and round once), and widened back: at most about 2 * 2^-8 (bf16) or
//    2 * 2^-11 (f16) relative to the largest contribution per element; f16
//    also overflows above 65504. Half the bytes on the wire.
//  - Overlap metrics per step: stats() and spans on the profiler's "comm" lane.
//
// One reducer per model replica; hooks run on the thread that runs backward.
// The communicator must outlive the reducer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/nn/parameter.hpp"
#include "loom/nn/tape.hpp"
#include "loom/parallel/reduction.hpp"

namespace loom::parallel {

namespace detail {
class GradBuckets;
}

enum class GradCompression { none, bf16, f16 };
std::string_view grad_compression_name(GradCompression value);

struct ReducerOptions {
  size_t first_bucket_bytes = size_t{1} << 20;  // 1 MiB: communication starts early
  size_t bucket_cap_bytes = size_t{25} << 20;   // 25 MiB
  // The gradients that become ready last get a bucket of at most this many
  // bytes (or the last one alone): little is left to reduce after backward.
  // 0: no such bucket.
  size_t last_bucket_bytes = size_t{1} << 20;  // 1 MiB
  // A model smaller than this many caps gets later buckets of total /
  // min_buckets, so that it still overlaps. 0 or 1: the cap alone decides.
  size_t min_buckets = 8;
  UnusedParameters unused = UnusedParameters::error;
  GradCompression compression = GradCompression::none;
  // Rebuild the buckets once from the observed ready order after the first step.
  bool rebuild_buckets = true;
  // Broadcast rank 0's parameter values at construction.
  bool broadcast_parameters = true;
  // Groups beyond dp that some gradients are summed over (parallel/reduction.hpp).
  ReductionGroups groups = {};
};

// Metrics of the last synchronized step (all times in seconds).
struct ReducerStats {
  int64_t step = 0;       // synchronized steps finished so far
  int64_t buckets = 0;    // all_reduces launched this step
  size_t wire_bytes = 0;  // bytes reduced (after compression)
  double compute_s = 0;   // end of the previous finish() (or construction) to this finish()
  double backward_s = 0;  // first ready gradient of the step to finish()
  double comm_s = 0;      // wall time with at least one bucket in flight (launch to completion)
  double exposed_s = 0;   // time finish() spent launching leftovers and waiting
  double hidden_fraction = 0;  // (comm_s - exposed_s) / comm_s, clamped to [0, 1]; 1 without comm
  // "step 3: 4 buckets, 1.2 MiB, compute 12.0 ms, comm 3.1 ms, exposed 0.4 ms (87% hidden)"
  std::string summary() const;
};

class GradReducer {
 public:
  GradReducer(std::vector<nn::Parameter*> params, comm::Communicator& dp,
              const ReducerOptions& options = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // Launches the buckets not yet launched (handling unused parameters),
  // waits for all of them, casts compressed buckets back and records the
  // step's metrics. Every rank must call it after each synchronized backward.
  void finish();

  // RAII: while alive, backward passes accumulate gradients locally.
  class NoSync {
   public:
    explicit NoSync(GradReducer& reducer);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    GradReducer& reducer_;
    bool previous_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  bool syncing() const;

  // The backward of `tape` is the step's last micro-batch: ready signals of
  // other micro-batches accumulate without launching anything (a pipeline
  // schedule's explicit no_sync). Until finish(), which clears it.
  void set_last_micro_batch(const nn::Tape& tape);

  const ReducerOptions& options() const { return options_; }
  comm::Communicator& communicator() const { return comm_; }
  // Parameter names of each bucket, in bucket (launch) order.
  std::vector<std::vector<std::string>> bucket_parameters() const;
  int rebuild_count() const { return rebuilds_; }
  const ReducerStats& stats() const { return stats_; }

 private:
  struct Bucket;
  void launch(size_t bucket);
  // NOTE [bucket sizes] in grad_reducer.cpp.
  struct KindCaps {
    DType dtype = DType::f32;
    Device device = Device::cpu();
    bool group_sum = false;
    size_t later_cap = 0;
  };
  struct BucketPlan {
    std::vector<KindCaps> kinds;
    std::vector<bool> last;  // per parameter: in its kind's last bucket
    size_t later_cap(DType dtype, Device device, bool group_sum) const {
      for (const KindCaps& k : kinds) {
        if (k.dtype == dtype && k.device == device && k.group_sum == group_sum) return k.later_cap;
      }
      return 0;
    }
  };
  BucketPlan plan_buckets(const std::vector<size_t>& order) const;
  void build_buckets(std::vector<size_t> order);
  void rebuild_from_observed_order();
  void record_stats(int64_t finish_start_ns, int64_t finish_end_ns, int64_t first_ready_ns);

  std::vector<nn::Parameter*> params_;
  comm::Communicator& comm_;
  ReducerOptions options_;
  Device control_device_;  // where small control tensors live (the first parameter's device)

  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::unique_ptr<detail::GradBuckets> engine_;
  int rebuilds_ = 0;

  int64_t last_finish_end_ns_ = 0;
  ReducerStats stats_;
};

}  // namespace loom::parallel
