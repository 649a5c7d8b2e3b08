// GradBuckets: the gradient-bucket engine that data parallelism
// (GradReducer) and ZeRO (ZeroOptimizer stages 1 to 3) share (docs/design.md,
// decision 11). Internal to parallel/.
//
// The engine decides *when*: it counts ready signals per parameter, launches
// buckets strictly in index order on every rank, completes the step at
// finish, handles unused parameters with one policy and runs the sums a
// parameter needs beyond data parallelism (reduction.hpp). Its owner decides
// *what* a bucket is and how it is reduced (all-reduce of a flat buffer,
// reduce-scatter into a shard): the `launch` callback.
//
// NOTE [final micro-batch] A ready signal carries the micro-batch (tape id,
// nn/parameter.hpp) whose contributions are complete. It counts towards
// launching only while syncing (outside no_sync()) and, once the step's last
// micro-batch has been named (set_final_micro_batch), only when it comes from
// that micro-batch; earlier micro-batches' signals just accumulate in the
// buckets. If a parameter's final signal arrives while another micro-batch
// has written only some of its uses of it, launching would reduce an
// incomplete sum: that throws, naming both.
//
// NOTE [group sums] A bucket holding a parameter whose gradient must also be
// summed over the tensor-parallel or the embedding group is deferred: it does
// not launch during backward (nor do the buckets after it, to keep the order),
// and finish() first sums those parameters' gradients over their groups (one
// all-reduce per parameter, in name order, so that both ends of an embedding
// group, whose engines hold different parameter lists, issue the same
// sequence), then launches it. Owners put such parameters in buckets of their
// own at the end of the launch order, so only they lose the overlap.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/nn/parameter.hpp"
#include "loom/parallel/reduction.hpp"

namespace loom::parallel::detail {

class GradBuckets {
 public:
  using Launch = std::function<void(size_t bucket)>;

  // `owner` names the reducer in error messages ("GradReducer"). Checks that
  // every parameter asking for a group sum has that group.
  GradBuckets(std::string owner, std::vector<nn::Parameter*> params, comm::Communicator& dp,
              const ReductionGroups& groups, UnusedParameters unused, Launch launch);
  ~GradBuckets();
  GradBuckets(const GradBuckets&) = delete;
  GradBuckets& operator=(const GradBuckets&) = delete;

  // Whether parameter i's gradient needs a sum over a group of more than one rank.
  bool needs_group_sum(size_t i) const { return group_sum_[i]; }
  // Parameter indices per bucket, in launch order; every parameter in exactly
  // one. Resets the step's counting.
  void set_buckets(std::vector<std::vector<size_t>> members);
  size_t bucket_count() const { return members_.size(); }
  const std::vector<size_t>& members(size_t bucket) const { return members_[bucket]; }

  void set_syncing(bool syncing) { syncing_ = syncing; }
  bool syncing() const { return syncing_; }
  // NOTE [final micro-batch]; 0 clears it. finish() clears it too.
  void set_final_micro_batch(uint64_t id) { final_micro_batch_ = id; }

  // Completes the step's launches: a parameter without a final signal counts
  // as complete if it was written (by earlier micro-batches only), gets a zero
  // gradient otherwise (remembered for end_step() under `error`); then the
  // group sums and the deferred buckets. Afterwards every bucket is launched.
  void launch_remaining();
  // After the owner waited for every bucket: resets the counting for the next
  // step; under UnusedParameters::error agrees across the data-parallel ranks
  // and throws naming the first unused parameter and its rank.
  void end_step();

  // Parameters in the order their first ready signals came (final or not), while observing.
  void set_observing(bool observing) { observing_ = observing; }
  const std::vector<size_t>& observed_order() const { return observed_order_; }
  bool observed(size_t i) const { return observed_[i]; }
  void clear_observed();
  // When the step's first final ready signal came (0: none yet).
  int64_t first_ready_ns() const { return first_ready_ns_; }

 private:
  void observe(size_t index);
  void on_ready(size_t index, uint64_t micro_batch);
  void mark_ready(size_t index);
  void launch_in_order();
  void run_group_sums();

  std::string owner_;
  std::vector<nn::Parameter*> params_;
  comm::Communicator& dp_;
  ReductionGroups groups_;
  UnusedParameters unused_;
  Launch launch_;
  Device control_device_;

  std::vector<bool> group_sum_;  // per parameter
  std::vector<std::vector<size_t>> members_;
  std::vector<size_t> bucket_of_;
  std::vector<int> pending_;    // per bucket: parameters not ready yet
  std::vector<bool> deferred_;  // per bucket: waits for its group sums (NOTE [group sums])
  std::vector<bool> ready_;     // per parameter, this step
  size_t next_launch_ = 0;
  std::vector<int> hook_ids_;
  bool syncing_ = true;
  uint64_t final_micro_batch_ = 0;
  int64_t first_unused_;
  int64_t first_ready_ns_ = 0;

  bool observing_ = false;
  std::vector<size_t> observed_order_;
  std::vector<bool> observed_;
};

}  // namespace loom::parallel::detail
