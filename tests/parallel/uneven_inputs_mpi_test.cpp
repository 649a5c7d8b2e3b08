// Uneven inputs under mpirun (2, 3 and 4 ranks, mpi backend): rank r has
// batches for {4, 2, 3, 0}[r] steps (the GPT) or {2, 1, 2, 1}[r] (ResNet-18,
// short runs: NOTE [kinks] in ddp_models_mpi_test.cpp); every rank runs until no rank has a
// batch, standing in after its last, and the losses (mean over the ranks
// with data) and final parameters equal one rank trained on the batches that
// exist at each step (computed by every rank in process), within the
// data-parallel tests' fp32 tolerance (1e-5 + 1e-4 |reference|). Replicas
// stay bitwise identical, stand-ins included.
#include <catch2/catch.hpp>

#include <cstdio>

#include "../comm/mpi_test_support.hpp"
#include "loom/comm/context.hpp"
#include "support/compare.hpp"
#include "support/ranks.hpp"
#include "uneven_harness.hpp"

using namespace loom;
using namespace loom::testing;

namespace {

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

void check_uneven(UnevenRun run, const std::vector<int>& counts) {
  comm::Communicator& world = *mpi_test_context().world();
  run.batches.assign(counts.begin(), counts.begin() + world.size());
  UnevenResult got, want;
  run_on_every_rank([&] {
    got = run_uneven(run, world);
    want = run_uneven_reference(run);
  });
  std::vector<std::vector<float>> got_losses{{got.losses.begin(), got.losses.end()}};
  std::vector<std::vector<float>> want_losses{{want.losses.begin(), want.losses.end()}};
  const double loss_ratio = loom::test::tolerance_ratio(got_losses, want_losses, kAtol, kRtol);
  const double param_ratio = loom::test::tolerance_ratio(got.params, want.params, kAtol, kRtol);
  INFO("stage " << run.stage << ": worst/tol loss " << loss_ratio << ", params " << param_ratio);
  CHECK(got.ranks_with_data == want.ranks_with_data);
  CHECK(got.stand_in_steps.size() ==
        got.losses.size() - static_cast<size_t>(run.batches[static_cast<size_t>(world.rank())]));
  CHECK(loss_ratio <= 1.0);
  CHECK(param_ratio <= 1.0);
  CHECK(loom::test::replicas_identical(world, got.params));
  if (world.rank() == 0) {
    std::fprintf(stderr, "uneven np%d %s stage %d: worst/tol loss %.3f params %.3f\n", world.size(),
                 run.model == SmallModel::gpt ? "gpt" : "resnet", run.stage, loss_ratio,
                 param_ratio);
  }
}

}  // namespace

TEST_CASE("uneven inputs over mpi: GPT with a GradReducer and ZeRO stages 1 and 3",
          "[uneven_mpi]") {
  for (const int stage : {-1, 1, 3}) {
    check_uneven({.model = SmallModel::gpt, .stage = stage, .batches = {}}, {4, 2, 3, 0});
  }
}

TEST_CASE("uneven inputs over mpi: ResNet-18 with synchronized BatchNorm, ZeRO stage 2",
          "[uneven_mpi]") {
  check_uneven({.model = SmallModel::resnet,
                .stage = 2,
                .sync_bn = true,
                .batches = {},
                .per_rank_batch = 8},
               {2, 1, 2, 1});
}
