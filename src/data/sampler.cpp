#include "loom/data/sampler.hpp"

#include <numeric>
#include <string>
#include <utility>

#include "loom/core/error.hpp"
#include "loom/core/philox.hpp"
#include "loom/core/random.hpp"
#include "loom/kernels/index_select.hpp"

namespace loom::data {
namespace {

const char* last_batch_name(LastBatch last) {
  return last == LastBatch::drop ? "LastBatch::drop" : "LastBatch::pad";
}

void validate(int64_t dataset_size, const SamplerOptions& o) {
  LOOM_CHECK(dataset_size > 0, "DistributedSampler: the dataset has ", dataset_size,
             " rows; a sampler needs at least one");
  LOOM_CHECK(o.global_batch > 0, "DistributedSampler: global batch ", o.global_batch,
             " must be positive");
  LOOM_CHECK(o.dp_size >= 1, "DistributedSampler: data-parallel size ", o.dp_size,
             " must be at least 1");
  LOOM_CHECK(o.dp_rank >= 0 && o.dp_rank < o.dp_size, "DistributedSampler: data-parallel rank ",
             o.dp_rank, " is outside [0, ", o.dp_size, ")");
  LOOM_CHECK(o.last_batch == LastBatch::drop || o.last_batch == LastBatch::pad,
             "DistributedSampler: last_batch ", static_cast<int>(o.last_batch),
             " is neither LastBatch::drop nor LastBatch::pad");
  const int64_t below = o.global_batch / o.dp_size * o.dp_size, above = below + o.dp_size;
  const std::string multiples =
      below > 0 ? std::to_string(below) + " or " + std::to_string(above) : std::to_string(above);
  LOOM_CHECK(o.global_batch % o.dp_size == 0, "global batch ", o.global_batch,
             " does not divide over ", o.dp_size,
             " data-parallel ranks; every rank takes an equal share of each global batch, so use "
             "a multiple of ",
             o.dp_size, " (", multiples, ")");
  LOOM_CHECK(o.last_batch == LastBatch::pad || dataset_size >= o.global_batch,
             "DistributedSampler: a dataset of ", dataset_size,
             " rows holds no full global batch of ", o.global_batch,
             " with LastBatch::drop; use a global batch of at most ", dataset_size,
             " or LastBatch::pad");
}

}  // namespace

std::vector<int64_t> epoch_permutation(int64_t size, uint64_t seed, int64_t epoch) {
  LOOM_CHECK(size >= 0, "epoch_permutation: size ", size, " must not be negative");
  LOOM_CHECK(epoch >= 0, "epoch_permutation: epoch ", epoch, " must not be negative");
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), int64_t{0});
  const uint64_t key = seed ^ random_stream_id("loom::data::DistributedSampler");
  const auto e = static_cast<uint64_t>(epoch);
  for (uint64_t i = order.size(); i-- > 1;) {
    const Philox4x32Result words =
        philox4x32(static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32),
                   static_cast<uint32_t>(e), static_cast<uint32_t>(e >> 32),
                   static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
    const uint64_t r = (uint64_t{words.v[0]} << 32) | words.v[1];
    std::swap(order[i], order[r % (i + 1)]);
  }
  return order;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, const SamplerOptions& options)
    : dataset_size_(dataset_size), options_(options) {
  validate(dataset_size, options);
  batches_per_epoch_ = options.last_batch == LastBatch::drop
                           ? dataset_size / options.global_batch
                           : (dataset_size + options.global_batch - 1) / options.global_batch;
  set_epoch(0);
}

void DistributedSampler::set_epoch(int64_t epoch) {
  LOOM_CHECK(epoch >= 0, "DistributedSampler: epoch ", epoch, " must not be negative");
  epoch_ = epoch;
  if (options_.shuffle) {
    order_ = epoch_permutation(dataset_size_, options_.seed, epoch);
  } else if (order_.size() != static_cast<size_t>(dataset_size_)) {
    order_.resize(static_cast<size_t>(dataset_size_));
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
}

std::vector<int64_t> DistributedSampler::global_batch_rows(int64_t batch) const {
  LOOM_CHECK(batch >= 0 && batch < batches_per_epoch_, "DistributedSampler: batch ", batch,
             " is outside the epoch's ", batches_per_epoch_, " global batches of ",
             options_.global_batch, " (", dataset_size_, " rows, ",
             last_batch_name(options_.last_batch), ")");
  std::vector<int64_t> rows(static_cast<size_t>(options_.global_batch));
  const int64_t first = batch * options_.global_batch;
  for (int64_t i = 0; i < options_.global_batch; ++i) {
    rows[static_cast<size_t>(i)] = order_[static_cast<size_t>((first + i) % dataset_size_)];
  }
  return rows;
}

Tensor DistributedSampler::rank_rows(int64_t batch) const {
  const std::vector<int64_t> global = global_batch_rows(batch);
  const int64_t local = local_batch();
  const auto begin = global.begin() + options_.dp_rank * local;
  return Tensor::from_vector(std::vector<int64_t>(begin, begin + local), {local});
}

ImageBatch select_rows(const ImageDataset& dataset, const Tensor& rows, Device device) {
  LOOM_CHECK(dataset.images.defined() && dataset.labels.defined() &&
                 dataset.images.device().is_cpu() && dataset.labels.device().is_cpu(),
             "select_rows: the dataset must hold host images and labels");
  LOOM_CHECK(rows.defined() && rows.device().is_cpu(), "select_rows: rows ", rows,
             " must be a host tensor");
  return ImageBatch{kernels::index_select(dataset.images, rows).to(device),
                    kernels::index_select(dataset.labels, rows).to(device)};
}

}  // namespace loom::data
