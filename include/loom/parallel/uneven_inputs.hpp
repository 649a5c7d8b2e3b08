// UnevenInputs: data parallelism when the ranks run out of data at different
// steps (shards of unequal length, a stream that ends early on one rank).
//
//   parallel::UnevenInputs uneven(*dp);
//   parallel::TrainStep train{.model = *model, .loss = ce, .zero = &zero, .uneven = &uneven};
//   Batch batch;  // filled by this rank's own source; when it has no more, still its last
//   for (int64_t step = 0; uneven.next(shard.read(batch)); ++step) {
//     const parallel::StepResult r = train.run(batch.inputs, batch.targets, step);
//     const double loss = uneven.mean(r.loss);  // over the ranks that had data
//   }
//
// Without it a rank that leaves its loop early makes the others fail in their
// next gradient all-reduce, naming it (NOTE [departing rank] in the mpi
// backend); with it they all train to the last batch of the longest shard.
//
// next(has_batch), collective over the data-parallel group (one all-gather
// of one 8-byte value per rank):
//  - counts the ranks that have a batch this step and returns false on every
//    rank once none has: the loop ends at the same step everywhere, after the
//    last batch of the rank with the most;
//  - a rank with a batch trains on it with its loss gradient multiplied by
//    loss_weight() = dp size / ranks with a batch; a rank without one
//    (stand_in()) runs the same step on a stand-in batch (its last one, or any
//    batch of the same shape) with loss weight 0 and nn::Tape::stand_in set.
//    It issues exactly the collectives the others do (gradient buckets,
//    ZeRO's reduce-scatters and gathers, synchronized BatchNorm), writes zero
//    gradients and contributes nothing to synchronized statistics;
//  - so every step's update is that of one rank on the concatenation of the
//    batches that exist this step (the reducer's average over all ranks,
//    times dp size / ranks with data, is the mean over those), and every
//    rank, stand-ins included, applies it: the replicas stay equal and a
//    stand-in's ZeRO shard keeps being stepped.
//  - The first step a rank has no batch, the group's rank 0 logs it once
//    ("rank 2 has no batch at step 17 ...").
//
// PyTorch's DDP join() shadows the all-reduces of joined ranks and by default
// divides by the initial world size, so the steps after a rank joins take
// smaller updates; here the divisor is the number of ranks with data, and a
// stand-in step runs the forward and backward too (on otherwise idle time:
// the others are computing theirs), which is what lets it shadow any
// collective a model or ZeRO stage issues, not only the gradient buckets.
//
// Rules: every rank of one data-parallel replica (its tensor- and
// pipeline-parallel ranks) passes the same has_batch, and calls next() once
// per step before the step's first collective; a rank that never had a batch
// still needs a stand-in of the right shape. TrainStep and the pipeline
// executor (ExecutorOptions::uneven) apply loss_weight() and stand_in(); a
// loop written out applies them itself:
//   tape.set_stand_in(uneven.stand_in());
//   model.backward(loss.backward(loss_tape, uneven.loss_weight()), tape);
#pragma once

#include <cstdint>
#include <vector>

#include "loom/comm/communicator.hpp"
#include "loom/core/device.hpp"

namespace loom::parallel {

class UnevenInputs {
 public:
  // `device`: where the one-value messages live (the CPU for the mpi and
  // local backends, the group's CUDA device for nccl).
  explicit UnevenInputs(comm::Communicator& dp, Device device = Device::cpu());

  // Collective (see above). Returns false on every rank when no rank has a
  // batch this step; calling it again after that throws.
  bool next(bool has_batch);

  // Of the step the last next() opened.
  int64_t step() const { return step_; }  // 0 for the first step, -1 before next()
  int ranks_with_data() const { return active_; }
  bool has_batch() const { return has_batch_; }
  bool stand_in() const { return !has_batch_; }
  // dp size / ranks_with_data() with a batch, 0 as a stand-in.
  double loss_weight() const;
  // The ranks with a batch this step, in rank order.
  const std::vector<int>& ranks_with_batch() const { return with_batch_; }

  // The mean of `value` over the ranks that have a batch this step
  // (collective over dp, like mean_over; a stand-in's value is ignored).
  double mean(double value);

  comm::Communicator& communicator() const { return dp_; }

 private:
  void check_open(const char* what) const;

  comm::Communicator& dp_;
  Device device_;
  int64_t step_ = -1;
  bool ended_ = false;
  bool has_batch_ = true;
  int active_ = 0;
  std::vector<int> with_batch_;
  std::vector<bool> logged_out_;  // per rank: its first step without a batch was logged
};

}  // namespace loom::parallel
