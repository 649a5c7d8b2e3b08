// DistributedSampler under mpirun (3 ranks): a global batch that does not
// divide over the ranks is refused with the same clear error on every rank,
// and with one that divides, the rows the ranks take (all-gathered batch by
// batch) are exactly each epoch's permutation, computed by every rank alone.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "../comm/mpi_test_support.hpp"
#include "loom/comm/context.hpp"
#include "loom/data/sampler.hpp"

using Catch::Matchers::Contains;
using loom::Tensor;
namespace data = loom::data;

namespace {

// The minimum over the ranks of `value`: 1 when it holds on every rank.
int on_every_rank(loom::comm::Communicator& world, bool value) {
  Tensor t = Tensor::from_vector(std::vector<int32_t>{value ? 1 : 0}, {1});
  world.all_reduce(t, {.op = loom::comm::ReduceOp::min}).wait();
  return t.item<int32_t>();
}

// Every rank's rows of every global batch of `epoch`, gathered in rank order.
std::vector<int64_t> gathered_epoch(loom::comm::Communicator& world,
                                    data::DistributedSampler& sampler, int64_t epoch) {
  sampler.set_epoch(epoch);
  std::vector<int64_t> all;
  for (int64_t b = 0; b < sampler.batches_per_epoch(); ++b) {
    const Tensor mine = sampler.rank_rows(b);
    const Tensor global = Tensor::empty({sampler.options().global_batch}, loom::DType::i64);
    world.all_gather(mine, global).wait();
    const std::vector<int64_t> rows = global.to_vector<int64_t>();
    all.insert(all.end(), rows.begin(), rows.end());
  }
  return all;
}

}  // namespace

TEST_CASE("sampler over mpi: a global batch that does not divide is refused on every rank",
          "[sampler_mpi]") {
  loom::comm::Communicator& world = *mpi_test_context().world();
  REQUIRE(world.size() == 3);
  std::string message;
  try {
    data::DistributedSampler sampler(
        1500, {.global_batch = 64, .dp_rank = world.rank(), .dp_size = world.size()});
  } catch (const loom::Error& e) {
    message = e.what();
  }
  INFO("rank " << world.rank() << ": " << message);
  CHECK_THAT(message, Contains("global batch 64 does not divide over 3 data-parallel ranks") &&
                          Contains("multiple of 3 (63 or 66)"));
  const bool refused = message.find("global batch 64 does not divide over 3") != std::string::npos;
  CHECK(on_every_rank(world, refused) == 1);
}

TEST_CASE("sampler over mpi: the ranks' rows are each epoch's permutation", "[sampler_mpi]") {
  loom::comm::Communicator& world = *mpi_test_context().world();
  const int64_t rows = 100;
  for (const data::LastBatch last : {data::LastBatch::drop, data::LastBatch::pad}) {
    data::DistributedSampler sampler(rows, {.global_batch = 12,
                                            .dp_rank = world.rank(),
                                            .dp_size = world.size(),
                                            .seed = 2024,
                                            .last_batch = last});
    std::vector<int64_t> previous;
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      const std::vector<int64_t> seen = gathered_epoch(world, sampler, epoch);
      std::vector<int64_t> expected = data::epoch_permutation(rows, 2024, epoch);
      if (last == data::LastBatch::drop) {
        expected.resize(96);  // 8 full global batches; 4 rows sit out
      } else {
        expected.insert(expected.end(), expected.begin(), expected.begin() + 8);  // 9 batches
      }
      INFO("rank " << world.rank() << ", epoch " << epoch << ", "
                   << (last == data::LastBatch::drop ? "drop" : "pad"));
      CHECK(seen == expected);
      CHECK(seen != previous);
      previous = seen;
    }
  }
}
