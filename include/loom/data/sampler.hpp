// DistributedSampler: which rows of an indexable dataset each data-parallel
// rank takes at each step, with a global batch and a seeded epoch shuffle.
//
// The sampler deals in row numbers 0 .. N-1 only, so it serves any dataset
// that can fetch rows by number: an ImageDataset (select_rows below), token
// windows, a file of records.
//
//   data::DistributedSampler sampler(train.size(), {.global_batch = 64,
//                                                   .dp_rank = dp.rank(), .dp_size = dp.size(),
//                                                   .seed = 1});
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);
//     for (int64_t b = 0; b < sampler.batches_per_epoch(); ++b) {
//       data::ImageBatch batch = data::select_rows(train, sampler.rank_rows(b));
//       ...
//
// Guarantees:
//  - Global batch. Step b of an epoch has global_batch rows: positions
//    [b * B, (b + 1) * B) of the epoch's order. Rank r of dp_size ranks takes
//    positions [r * B/dp, (r + 1) * B/dp) of them, so the ranks' rows
//    concatenated in rank order are the global batch, and a single-rank run
//    with the same global batch sees exactly those rows: data parallelism
//    changes who computes a row, never which rows a step has.
//  - The global batch must divide by dp_size: otherwise the constructor throws
//    loom::Error naming both numbers and the nearest multiples, on every rank
//    alike (it is a pure check), before any data is read.
//  - Epoch shuffle without communication. With shuffle, the epoch's order is
//    a Fisher-Yates shuffle of 0 .. N-1 driven by Philox4x32-10, a pure
//    function of (seed, epoch): every rank computes the same permutation, a
//    resumed run recomputes it, and different epochs get different orders.
//    Exactly: for i = N-1 down to 1, with
//      words = philox4x32(counter = {i, i >> 32, epoch, epoch >> 32},
//                         key = seed ^ random_stream_id("loom::data::DistributedSampler")),
//      j = ((words[0] << 32) | words[1]) mod (i + 1), swap(order[i], order[j]).
//    (The modulo's bias is below 2^-32 for any N that fits in memory.)
//    Without shuffle the order is 0 .. N-1 every epoch.
//  - Last batch. LastBatch::drop: an epoch has floor(N / B) global batches;
//    the N mod B rows at the end of the epoch's order sit out that epoch
//    (with shuffle a different set each epoch). LastBatch::pad: ceil(N / B)
//    batches; positions p >= N wrap around to the epoch's start, taking the
//    row at position p mod N again, so every row is seen once per epoch and
//    B * batches - N of them twice.
//  - Not thread-safe: set_epoch() and rank_rows() of one sampler must not
//    run concurrently (each rank owns its sampler).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/core/device.hpp"
#include "loom/core/tensor.hpp"
#include "loom/data/dataset.hpp"
#include "loom/data/synthetic.hpp"

namespace loom::data {

enum class LastBatch {
  drop,  // leave out the rows after the last full global batch
  pad,   // complete the last global batch with the epoch's first rows again
};

struct SamplerOptions {
  int64_t global_batch = 0;  // rows per step over the whole data-parallel group
  int dp_rank = 0;
  int dp_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  LastBatch last_batch = LastBatch::drop;
};

// The order of rows 0 .. size-1 in `epoch` under `seed` (the shuffle above).
std::vector<int64_t> epoch_permutation(int64_t size, uint64_t seed, int64_t epoch);

class DistributedSampler {
 public:
  // Throws loom::Error if the options do not fit the dataset (see the file
  // comment); starts at epoch 0.
  DistributedSampler(int64_t dataset_size, const SamplerOptions& options);

  // Computes the epoch's order (O(N)); call once per epoch, on every rank.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  int64_t dataset_size() const { return dataset_size_; }
  // Rows per rank per step: global_batch / dp_size.
  int64_t local_batch() const { return options_.global_batch / options_.dp_size; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  const SamplerOptions& options() const { return options_; }

  // The current epoch's order of all N rows.
  const std::vector<int64_t>& epoch_order() const { return order_; }
  // The rows of global batch `batch` of the current epoch (global_batch of them).
  std::vector<int64_t> global_batch_rows(int64_t batch) const;
  // This rank's slice of it: a host i64 tensor [local_batch()], ready for
  // kernels::index_select.
  Tensor rank_rows(int64_t batch) const;

 private:
  int64_t dataset_size_;
  SamplerOptions options_;
  int64_t batches_per_epoch_ = 0;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;
};

// The images and labels of `rows` (a 1-D i32/i64 host tensor, e.g. a
// sampler's rank_rows) of a host ImageDataset, copied to `device`.
ImageBatch select_rows(const ImageDataset& dataset, const Tensor& rows,
                       Device device = Device::cpu());

}  // namespace loom::data
