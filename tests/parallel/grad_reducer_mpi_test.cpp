// The data-parallel equivalence over the mpi backend under mpirun (2 and 4
// ranks): each rank trains its shard with the GradReducer; rank results are
// gathered and compared with the single-rank run on the global batch, which
// every rank computes locally. Same fp32 tolerance as the local-backend tests
// (2e-5 absolute plus 1e-4 relative).
#include <catch2/catch.hpp>

#include <cmath>

#include "../comm/mpi_test_support.hpp"
#include "ddp_harness.hpp"
#include "loom/comm/context.hpp"

using namespace loom;
using namespace loom::testing;

namespace {

// The mean over ranks of this rank's per-step losses.
std::vector<double> mean_losses(comm::Communicator& world, const std::vector<double>& losses) {
  std::vector<float> values(losses.begin(), losses.end());
  Tensor t = Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
  world.all_reduce(t, {.op = comm::ReduceOp::avg}).wait();
  const std::vector<float> mean = t.to_vector<float>();
  return {mean.begin(), mean.end()};
}

void check_equivalent(const DdpRun& run) {
  comm::Communicator& world = *mpi_test_context().world();
  const RunResult dp = run_data_parallel(run, world);
  const RunResult ref = run_single_rank(run, world.size());
  const std::vector<double> losses = mean_losses(world, dp.losses);
  for (size_t step = 0; step < losses.size(); ++step) {
    INFO("step " << step << ": " << losses[step] << " vs " << ref.losses[step]);
    CHECK(std::abs(losses[step] - ref.losses[step]) <= 2e-5 + 1e-4 * std::abs(ref.losses[step]));
  }
  CHECK(loom::test::tolerance_ratio(dp.params, ref.params, 2e-5, 1e-4) <= 1.0);
  CHECK(dp.rebuilds == 1);
  CHECK(dp.stats.step == run.steps);
  if (world.rank() == 0) std::fprintf(stderr, "ddp (mpi): %s\n", dp.stats.summary().c_str());
}

}  // namespace

TEST_CASE("ddp over mpi: MLP with SGD, one bucket per parameter", "[ddp_mpi]") {
  check_equivalent(DdpRun{.reducer = {.first_bucket_bytes = 1, .bucket_cap_bytes = 1}});
}

TEST_CASE("ddp over mpi: MLP with AdamW and gradient accumulation", "[ddp_mpi]") {
  check_equivalent(
      DdpRun{.optimizer = OptimizerKind::adamw, .per_rank_batch = 6, .micro_steps = 3});
}

TEST_CASE("ddp over mpi: CNN with synchronized BatchNorm", "[ddp_mpi]") {
  check_equivalent(DdpRun{.model = ModelKind::cnn, .sync_bn = true});
}

TEST_CASE("ddp over mpi: bf16 compression stays close", "[ddp_mpi]") {
  comm::Communicator& world = *mpi_test_context().world();
  const DdpRun run{.steps = 2, .reducer = {.compression = parallel::GradCompression::bf16}};
  const RunResult dp = run_data_parallel(run, world);
  const RunResult ref = run_single_rank(run, world.size());
  // Two bf16 roundings of each gradient, times lr 0.1 over two steps: far
  // below 1e-3 in the parameters.
  CHECK(loom::test::tolerance_ratio(dp.params, ref.params, 1e-3, 0.0) <= 1.0);
}
