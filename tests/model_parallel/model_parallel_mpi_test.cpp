// The model-parallel groundwork under mpirun (mpi backend): a GPT in parts run
// in pipeline-schedule orders with the gradient-bucket engine under plain data
// parallelism and ZeRO stages 1 to 3 reproduces one rank running one part on
// the global batch; with 2 ranks as two pipeline stages, the token table tied
// across them is summed over the embedding group and the global norm is the
// one-part norm. Tolerance: 1e-5 + 1e-4 |reference| (fp32 sums associated
// differently), as bucket_engine_test.cpp. Replicas must be bitwise equal.
#include <catch2/catch.hpp>

#include "../comm/mpi_test_support.hpp"
#include "model_parallel/schedule_harness.hpp"
#include "support/compare.hpp"
#include "support/ranks.hpp"

using namespace loom;
using namespace loom::testing;

namespace {

constexpr double kAtol = 1e-5;
constexpr double kRtol = 1e-4;

double ratio(const std::vector<double>& got, const std::vector<double>& want) {
  std::vector<std::vector<float>> a{{got.begin(), got.end()}}, b{{want.begin(), want.end()}};
  return loom::test::tolerance_ratio(a, b, kAtol, kRtol);
}

}  // namespace

TEST_CASE("model-parallel mpi: GPT parts in schedule orders, data parallel and ZeRO 1-3",
          "[model_parallel_mpi]") {
  comm::Communicator& world = *mpi_test_context().world();
  for (const ScheduleOrder order : {ScheduleOrder::one_f_one_b, ScheduleOrder::deferred_weight}) {
    for (const int stage : {0, 1, 2, 3}) {
      // Stage 3 gathers per ShardedModule: one part (NOTE in schedule_harness.hpp).
      const PartsRun run{
          .parts = stage == 3 ? 1 : 2, .micro = 2, .stage = stage, .order = order, .clip = 0.05};
      INFO(schedule_order_name(order) << ", ZeRO stage " << stage << ", " << run.parts << " parts");
      PartsResult got, want;
      run_on_every_rank([&] {
        got = train_parts(run, world);
        want = train_reference(run, world.size());
      });
      CHECK(ratio(loom::test::mean_over_ranks(world, got.losses), want.losses) <= 1.0);
      CHECK(ratio(got.norms, want.norms) <= 1.0);
      CHECK(params_ratio(got, want, kAtol, kRtol) <= 1.0);
      std::vector<std::vector<float>> params;
      for (const auto& [name, values] : got.params) params.push_back(values);
      CHECK(loom::test::replicas_identical(world, params));
    }
  }
}

TEST_CASE("model-parallel mpi: the token table tied across two pipeline stages",
          "[model_parallel_mpi]") {
  comm::Communicator& world = *mpi_test_context().world();
  if (world.size() % 2 != 0) {
    SUCCEED("two pipeline stages need an even number of ranks; this run has " << world.size());
    return;
  }
  for (const int stage : {0, 1, 2}) {
    if (world.size() == 2 && stage > 0) continue;  // one data-parallel rank: nothing to shard
    const PartsRun run{.micro = 2, .stage = stage, .clip = 0.05};
    INFO("ZeRO stage " << stage);
    PartsResult got, want;
    run_on_every_rank([&] {
      got = train_two_stages(run, world);
      want = train_reference(run, world.size() / 2);
    });
    CHECK(ratio(got.losses, want.losses) <= 1.0);
    CHECK(ratio(got.norms, want.norms) <= 1.0);
    double worst = 0;
    for (const auto& [name, values] : got.params) {
      worst = std::max(worst,
                       loom::test::tolerance_ratio({values}, {want.params.at(name)}, kAtol, kRtol));
    }
    CHECK(worst <= 1.0);
    // The two copies of the token table are equal: rank 0 (stage 0) against the last stage.
    const std::vector<float>& table = got.params.at("wte.weight");
    Tensor mine = Tensor::from_vector(table, {static_cast<int64_t>(table.size())});
    Tensor first = mine.clone();
    world.broadcast(first, {.root = 0}).wait();
    CHECK(first.to_vector<float>() == table);
  }
}
