// DistributedSampler on one process: the epoch shuffle (a permutation, the
// same for the same seed and epoch, different across epochs and seeds, the
// specified Philox draw), the per-rank split of each global batch, drop-last
// and pad, the errors that name the numbers, and select_rows on an
// ImageDataset.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "loom/core/philox.hpp"
#include "loom/core/random.hpp"
#include "loom/data/sampler.hpp"

using Catch::Matchers::Contains;
using loom::DType;
using loom::Tensor;
namespace data = loom::data;

namespace {

bool is_permutation_of_range(std::vector<int64_t> order, int64_t n) {
  std::sort(order.begin(), order.end());
  std::vector<int64_t> range(static_cast<size_t>(n));
  std::iota(range.begin(), range.end(), int64_t{0});
  return order == range;
}

// Rank r's rows of every global batch of the epoch, with ranks 0..dp-1 built alike.
std::vector<int64_t> concatenated_ranks(int64_t n, data::SamplerOptions options, int64_t epoch) {
  std::vector<int64_t> all;
  std::vector<data::DistributedSampler> ranks;
  for (int r = 0; r < options.dp_size; ++r) {
    options.dp_rank = r;
    ranks.emplace_back(n, options);
    ranks.back().set_epoch(epoch);
  }
  for (int64_t b = 0; b < ranks[0].batches_per_epoch(); ++b) {
    for (const auto& rank : ranks) {
      const std::vector<int64_t> rows = rank.rank_rows(b).to_vector<int64_t>();
      all.insert(all.end(), rows.begin(), rows.end());
    }
  }
  return all;
}

}  // namespace

TEST_CASE("epoch shuffle: same seed and epoch give the same permutation, others differ",
          "[data][sampler]") {
  for (const int64_t n : {1, 2, 7, 1000}) {
    const std::vector<int64_t> a = data::epoch_permutation(n, 42, 3);
    REQUIRE(is_permutation_of_range(a, n));
    REQUIRE(data::epoch_permutation(n, 42, 3) == a);
  }
  const std::vector<int64_t> e0 = data::epoch_permutation(1000, 42, 0);
  REQUIRE(data::epoch_permutation(1000, 42, 1) != e0);
  REQUIRE(data::epoch_permutation(1000, 43, 0) != e0);
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), int64_t{0});
  REQUIRE(e0 != identity);
}

TEST_CASE("epoch shuffle is the specified Fisher-Yates over Philox draws", "[data][sampler]") {
  // The header's formula written out again: a resumed run, another rank or
  // another implementation following it gets the same order.
  const int64_t n = 50, epoch = 5;
  const uint64_t seed = 0x123456789abcdefULL;
  std::vector<int64_t> expected(n);
  std::iota(expected.begin(), expected.end(), int64_t{0});
  const uint64_t key = seed ^ loom::random_stream_id("loom::data::DistributedSampler");
  for (uint64_t i = n - 1; i >= 1; --i) {
    const auto w = loom::philox4x32(static_cast<uint32_t>(i), 0, epoch, 0,
                                    static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
    const uint64_t j = ((uint64_t{w.v[0]} << 32) | w.v[1]) % (i + 1);
    std::swap(expected[i], expected[j]);
  }
  REQUIRE(data::epoch_permutation(n, seed, epoch) == expected);
}

TEST_CASE("sampler: each rank takes its share of every global batch", "[data][sampler]") {
  const data::SamplerOptions options{.global_batch = 12, .dp_size = 3, .seed = 9};
  data::DistributedSampler rank1(60, {.global_batch = 12, .dp_rank = 1, .dp_size = 3, .seed = 9});
  REQUIRE(rank1.local_batch() == 4);
  REQUIRE(rank1.batches_per_epoch() == 5);
  rank1.set_epoch(2);
  const std::vector<int64_t> global = rank1.global_batch_rows(3);
  const Tensor mine = rank1.rank_rows(3);
  REQUIRE(mine.dtype() == DType::i64);
  REQUIRE(mine.shape() == loom::Shape{4});
  REQUIRE(mine.to_vector<int64_t>() ==
          std::vector<int64_t>(global.begin() + 4, global.begin() + 8));
  // Global batch b is positions [12 b, 12 (b + 1)) of the epoch's order.
  const std::vector<int64_t> order = data::epoch_permutation(60, 9, 2);
  REQUIRE(global == std::vector<int64_t>(order.begin() + 36, order.begin() + 48));
  // The ranks together cover the epoch's order exactly, in order.
  REQUIRE(concatenated_ranks(60, options, 2) == order);
  // One rank with the same global batch sees the same rows.
  REQUIRE(concatenated_ranks(60, {.global_batch = 12, .dp_size = 1, .seed = 9}, 2) == order);
}

TEST_CASE("sampler: drop-last leaves out the epoch's tail", "[data][sampler]") {
  data::DistributedSampler sampler(50, {.global_batch = 12, .dp_size = 2, .seed = 4});
  REQUIRE(sampler.batches_per_epoch() == 4);
  const std::vector<int64_t> order = data::epoch_permutation(50, 4, 0);
  REQUIRE(concatenated_ranks(50, {.global_batch = 12, .dp_size = 2, .seed = 4}, 0) ==
          std::vector<int64_t>(order.begin(), order.begin() + 48));
  REQUIRE_THROWS_WITH(sampler.global_batch_rows(4),
                      Contains("batch 4 is outside the epoch's 4 global batches of 12") &&
                          Contains("LastBatch::drop"));
}

TEST_CASE("sampler: pad wraps around to the epoch's start", "[data][sampler]") {
  const data::SamplerOptions options{
      .global_batch = 12, .dp_size = 3, .seed = 4, .last_batch = data::LastBatch::pad};
  data::DistributedSampler sampler(50, options);
  REQUIRE(sampler.batches_per_epoch() == 5);
  std::vector<int64_t> expected = data::epoch_permutation(50, 4, 7);
  expected.insert(expected.end(), expected.begin(), expected.begin() + 10);
  REQUIRE(concatenated_ranks(50, options, 7) == expected);
  // A dataset smaller than one global batch wraps as often as needed.
  data::DistributedSampler tiny(
      5, {.global_batch = 12, .dp_size = 3, .shuffle = false, .last_batch = data::LastBatch::pad});
  REQUIRE(tiny.batches_per_epoch() == 1);
  REQUIRE(tiny.global_batch_rows(0) == std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1});
}

TEST_CASE("sampler without shuffle keeps the dataset's order every epoch", "[data][sampler]") {
  data::DistributedSampler sampler(
      8, {.global_batch = 4, .dp_rank = 1, .dp_size = 2, .shuffle = false});
  sampler.set_epoch(3);
  REQUIRE(sampler.rank_rows(1).to_vector<int64_t>() == std::vector<int64_t>{6, 7});
}

TEST_CASE("sampler errors name the numbers and the rule", "[data][sampler]") {
  REQUIRE_THROWS_WITH(
      data::DistributedSampler(1000, {.global_batch = 64, .dp_rank = 0, .dp_size = 3}),
      Contains("global batch 64 does not divide over 3 data-parallel ranks") &&
          Contains("multiple of 3 (63 or 66)"));
  REQUIRE_THROWS_WITH(data::DistributedSampler(1000, {.global_batch = 2, .dp_size = 4}),
                      Contains("global batch 2 does not divide over 4") && Contains("(4)"));
  REQUIRE_THROWS_WITH(data::DistributedSampler(1000, {.global_batch = 0}),
                      Contains("global batch 0 must be positive"));
  REQUIRE_THROWS_WITH(
      data::DistributedSampler(1000, {.global_batch = 8, .dp_rank = 2, .dp_size = 2}),
      Contains("data-parallel rank 2 is outside [0, 2)"));
  REQUIRE_THROWS_WITH(data::DistributedSampler(0, {.global_batch = 8}),
                      Contains("the dataset has 0 rows"));
  REQUIRE_THROWS_WITH(data::DistributedSampler(10, {.global_batch = 64, .dp_size = 2}),
                      Contains("a dataset of 10 rows holds no full global batch of 64") &&
                          Contains("LastBatch::pad"));
  data::DistributedSampler sampler(10, {.global_batch = 2});
  REQUIRE_THROWS_WITH(sampler.set_epoch(-1), Contains("epoch -1 must not be negative"));
}

TEST_CASE("select_rows gathers an ImageDataset's images and labels", "[data][sampler]") {
  data::ImageDataset set;
  std::vector<float> pixels(6 * 2 * 2);
  std::iota(pixels.begin(), pixels.end(), 0.0f);
  set.images = Tensor::from_vector(pixels, {6, 1, 2, 2});
  set.labels = Tensor::from_vector<int32_t>({0, 1, 2, 3, 4, 5}, {6});
  set.classes = 6;
  const data::ImageBatch batch = data::select_rows(set, Tensor::from_vector<int64_t>({5, 2}, {2}));
  REQUIRE(batch.images.shape() == loom::Shape{2, 1, 2, 2});
  REQUIRE(batch.images.to_vector<float>() == std::vector<float>{20, 21, 22, 23, 8, 9, 10, 11});
  REQUIRE(batch.labels.to_vector<int32_t>() == std::vector<int32_t>{5, 2});
}
