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
#include "loom/core/random.hpp"
#include "loom/nn/parameter.hpp"

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
    CHECK(loom::test::close(losses[step], ref.losses[step], 2e-5, 1e-4));
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

TEST_CASE("ddp over mpi: bf16 compression stays within the rounding of the values reduced",
          "[ddp_mpi]") {
  // Every rank's gradient is known on every rank (a seeded normal draw per
  // rank), so each element's exact mean and its error bound are computed here.
  // With unit roundoff u = 2^-8 the compressed all-reduce rounds each rank's
  // value once (<= u |g_r|), each partial sum along the reduction once (at most
  // R - 1 additions per element, each <= u times the partial sum's magnitude,
  // <= sum_r |g_r|), and the mean once more: |error| <= u (R + 1) sum_r |g_r| / R
  // per element, whatever order MPI adds in. The same reduction uncompressed
  // must differ from it somewhere, or the test would not see bf16 at all.
  comm::Communicator& world = *mpi_test_context().world();
  const int ranks = world.size();
  const int64_t n = 1 << 14;
  const double u = std::ldexp(1.0, -8);
  auto grad_of = [&](int rank) {
    Tensor g = Tensor::empty({n});
    fill_normal(g, RandomKey{321, static_cast<uint64_t>(rank)}, 0.0f, 1.0f);
    return g.to_vector<float>();
  };
  std::vector<double> exact(n, 0.0), bound(n, 0.0);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> g = grad_of(r);
    for (int64_t i = 0; i < n; ++i) {
      exact[i] += static_cast<double>(g[i]) / ranks;
      bound[i] += u * (ranks + 1) * std::abs(static_cast<double>(g[i])) / ranks;
    }
  }
  auto reduce = [&](parallel::GradCompression compression) {
    nn::Parameter w("w", Tensor::zeros({n}));
    parallel::GradReducer reducer({&w}, world, {.compression = compression});
    auto write = w.begin_grad_write();
    write.grad.copy_from(Tensor::from_vector(grad_of(world.rank()), {n}));
    w.end_grad_write();
    reducer.finish();
    return std::make_pair(w.grad().to_vector<float>(), reducer.stats().wire_bytes);
  };
  std::pair<std::vector<float>, size_t> compressed, plain;
  run_on_every_rank([&] {
    compressed = reduce(parallel::GradCompression::bf16);
    plain = reduce(parallel::GradCompression::none);
  });
  loom::test::WorstError ratio;
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    ratio.add_error(loom::test::error_of(compressed.first[i], exact[i]) / bound[i], i);
    if (compressed.first[i] != plain.first[i]) ++differ;
  }
  INFO("worst error / bound " << ratio.value << " at [" << ratio.index << "]; " << differ << " of "
                              << n << " elements differ from the fp32 reduction");
  CHECK(ratio.within(1.0));
  CHECK(differ > n / 4);  // bf16 keeps 8 bits: most elements change
  CHECK(compressed.second == static_cast<size_t>(n) * 2);
  CHECK(plain.second == static_cast<size_t>(n) * 4);
  CHECK_THAT(plain.first,
             loom::test::AllClose(std::vector<float>(exact.begin(), exact.end()), 1e-6, 1e-5));
}
